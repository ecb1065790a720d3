# A GPU-machine call that parks one carried piece of the target GGUF (.gpu/NAME, named in
# the call's carry) on the machine, for env.sh to join in name order
# (`cat /root/stage/pieces/gguf.*`). `bash scripts/gpu/split_gguf.sh` cuts the pieces to
# fit beside the checkout (64 MiB a call) and prints the calls.
#   bash scripts/gpu/stage_piece.sh NAME
set -euo pipefail
mkdir -p /root/stage/pieces && cp .gpu/"$1"/* /root/stage/pieces/ && ls -la /root/stage/pieces
