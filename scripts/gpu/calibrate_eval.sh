# GPU call after train_both.sh: acceptance in the engine for DSpark, the DFlash ablation
# and n-gram (K=7, T=0 and 1, held-out ShareGPT and HumanEval). Calibration is its own
# call (calibrate_bench_h200.sh); fixed-K acceptance does not depend on it.
source scripts/gpu/env.sh
python3 -m dspark.cli eval-drafter --model "$G" --prompts .gpu/prompts.npz \
  --drafter "dspark=$RUN/dspark" --drafter "dflash=$RUN/dflash" --num-prompts "${NPROMPTS:-164}" \
  --max-tokens 128 --concurrency 64 --out "$RUN/eval" 2>&1 | grep -v "it/s\]" | tail -16
cd "$RUN" && tar czf "$OUT/results.tgz" eval && ls -la "$OUT"
