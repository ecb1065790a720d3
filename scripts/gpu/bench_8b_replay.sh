# GPU call: the end-to-end sweep on an 8B-shaped target (Llama-3-8B, random bf16 weights)
# with a random DSpark drafter of matching shape; acceptance is REPLAYED from the shipped
# SmolLM2 drafter trace. Needs only this checkout and .gpu/prompts.npz (no weights).
# Concurrency runs from high to low so a timeout keeps the levels that matter most.
set -uo pipefail
export PYTHONPATH=src
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${LIMIT:-570}" python3 -m dspark.cli bench --shape llama3-8b --device cuda \
  --dtype bfloat16 --prompts .gpu/prompts.npz --concurrency ${CONC:-256 64 16 4 1} \
  --fixed ${FIXED:-1 2 3 4 5 6 7} --max-tokens ${TOKENS:-64} --repeats ${REPEATS:-1} \
  --out "$OUT/bench8b" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -45
ls -la "$OUT/bench8b"
