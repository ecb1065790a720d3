# Source on the GPU machine: joins the target GGUF from the pieces stage_piece.sh parked
# (once, checked against the carried sha256), installs the carried gguf wheel and points
# PYTHONPATH at this checkout. Sets G (the GGUF).
G=/root/stage/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$G" ]; then
  if [ -f .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256 ] && [ -d /root/stage/pieces ]; then
    cat /root/stage/pieces/gguf.* > "$G.partial"
    echo "$(cut -d' ' -f1 .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256)  $G.partial" \
      | sha256sum -c - && mv "$G.partial" "$G"
  fi
fi
if [ -d .gpu/wheels ] && [ ! -d /tmp/site/gguf ]; then
  pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
fi
export PYTHONPATH=src:/tmp/site
export DSPARK_CACHE=/root/stage/cache
