# Fourth GPU call: calibrate the DSpark drafter on held-out data, then measure acceptance
# in the engine for DSpark, the DFlash ablation and n-gram (K=7, T=0 and 1).
source scripts/gpu/env.sh
python3 -m dspark.cli calibrate --model "$G" --drafter "$RUN/dspark" --data "$RUN/data" 2>&1 | tail -11
python3 -m dspark.cli eval-drafter --model "$G" --prompts .gpu/prompts.npz \
  --drafter "dspark=$RUN/dspark" --drafter "dflash=$RUN/dflash" --num-prompts "${NPROMPTS:-164}" \
  --max-tokens 128 --concurrency 64 --out "$RUN/eval" 2>&1 | grep -v "it/s\]" | tail -16
cd "$RUN" && tar czf "$OUT/results.tgz" dspark/drafter.json dspark/calibration eval && ls -la "$OUT"
