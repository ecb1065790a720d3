# First GPU call: park the first half of the target GGUF on the machine.
set -euo pipefail
mkdir -p /root/stage/part0 && cp .gpu/part0/* /root/stage/part0/ && ls -la /root/stage/part0
nvidia-smi --query-gpu=name,memory.used --format=csv
