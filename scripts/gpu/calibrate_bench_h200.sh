# GPU call after stage0.sh: calibrate the shipped drafter on engine rounds (bf16), then the
# end-to-end sweep; everything comes back as one tarball.
source scripts/gpu/env.sh
D=src/dspark/data/drafters/SmolLM2-135M-Instruct
mkdir -p "$RUN/res"
python3 -m dspark.cli calibrate --model "$G" --device cuda --dtype bfloat16 --drafter "$D" \
  --prompts .gpu/prompts.npz --num-prompts 160 --report "$RUN/res/calibration" 2>&1 | tail -12
cp "$D/drafter.json" "$RUN/res/"
LIMIT=${LIMIT:-170} OUT="$RUN/res" bash scripts/gpu/bench_h200.sh || true
cd "$RUN" && tar czf "$OUT/res.tgz" res && ls -la "$OUT"
