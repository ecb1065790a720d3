# GPU calls before bench_h200.sh when the checkout plus a GGUF half exceeds one call's
# 64 MiB: park one carried quarter (.gpu/qN, named in the call's carry) on the machine.
# The quarters are the halves split again (split -b 24M); bench_h200.sh joins them in
# name order (gguf.0.aa, gguf.0.ab, gguf.1.aa, gguf.1.ab).
set -euo pipefail
mkdir -p /root/stage/pieces && cp .gpu/"$1"/* /root/stage/pieces/ && ls -la /root/stage/pieces
