# Sourced by the 8B-shape GPU scripts (session25.sh, session33.sh): the environment, the
# device and code that ran, and $C, the bench command they share (the 8B shape with
# random bf16 weights, acceptance REPLAYED from published:chat, 128 tokens, full warm-up).
export PYTHONPATH=src
OUT=${OUT:-/tmp/out}
set +e +o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m dspark.bench.provenance
C="python3 -m dspark.cli bench --shape llama3-8b --device cuda --dtype bfloat16
   --prompts .gpu/prompts.npz --max-tokens 128 --trace published:chat --full-warmup"
