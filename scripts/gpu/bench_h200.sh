# GPU call after stage0.sh: the end-to-end sweep on the H200 with SmolLM2 and the shipped
# DSpark drafter (bf16). A command timeout keeps whatever finished in $OUT.
source scripts/gpu/env.sh
timeout "${LIMIT:-240}" python3 -m dspark.cli bench --model "$G" --device cuda --dtype bfloat16 \
  --prompts .gpu/prompts.npz --drafter dspark --concurrency ${CONC:-1 4 16 64 256} \
  --fixed ${FIXED:-1 3 5 7} --max-tokens ${TOKENS:-64} ${FULL_WARMUP:+--full-warmup} --out "$OUT/bench" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -40
cd "$OUT" && tar czf bench.tgz bench && rm -rf bench && ls -la
