# GPU call after stage0.sh and a call that carried .gpu/part1 and sourced env.sh (the
# target GGUF is assembled): the 8B-shape replay sweep, then the SmolLM2 sweep with the
# shipped drafter, both bf16, in one call. Each has its own time limit; whatever finished
# stays in $OUT (bench.partial.json).
source scripts/gpu/env.sh
set +e
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${LIMIT_8B:-250}" python3 -m dspark.cli bench --shape llama3-8b --device cuda \
  --dtype bfloat16 --prompts .gpu/prompts.npz --concurrency 256 64 16 4 1 \
  --fixed 1 2 3 4 5 6 7 --max-tokens "${TOKENS:-48}" --out "$OUT/bench8b" 2>&1 \
  | grep -v "it/s\]\|s/it\]" | tail -48
timeout "${LIMIT_SMOL:-280}" python3 -m dspark.cli bench --model "$G" --device cuda \
  --dtype bfloat16 --prompts .gpu/prompts.npz --drafter dspark --concurrency 256 64 16 4 1 \
  --fixed 1 2 3 4 5 6 7 --max-tokens "${TOKENS:-48}" --out "$OUT/bench_smollm2" 2>&1 \
  | grep -v "it/s\]\|s/it\]" | tail -48
ls -la "$OUT"/*
