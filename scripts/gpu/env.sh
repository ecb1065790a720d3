# Source on the GPU machine after stage0.sh (README, "Training the drafter on a GPU"):
# reassembles the target GGUF from the two carried halves (once), installs the carried
# wheels and points PYTHONPATH at this checkout. Sets G (the GGUF) and RUN (work dir).
set -euo pipefail
G=/root/stage/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$G" ]; then
  if [ -d /root/stage/pieces ]; then  # quarters parked by stage_piece.sh
    cat /root/stage/pieces/gguf.* > "$G.partial"
  else
    cat /root/stage/part0/*.gguf.0 .gpu/part1/*.gguf.1 > "$G.partial"
  fi
  echo "$(cut -d' ' -f1 .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256)  $G.partial" | sha256sum -c -
  mv "$G.partial" "$G"
fi
[ -d /tmp/site/gguf ] || pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=src:/tmp/site
export DSPARK_CACHE=/root/stage/cache
RUN=/root/stage/run
mkdir -p "$RUN"
