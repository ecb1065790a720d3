# Third GPU call: the DSpark drafter and the DFlash ablation, same data, steps and
# batch, trained side by side on the one GPU.
source scripts/gpu/env.sh
common=(--model "$G" --data "$RUN/data" --steps "${STEPS:-1400}" --batch-size 32 --anchors 32
        --eval-every 350 --max-minutes "${MINUTES:-8.3}")
python3 -m dspark.cli train-drafter "${common[@]}" --out "$RUN/dspark" > "$RUN/dspark.log" 2>&1 &
python3 -m dspark.cli train-drafter "${common[@]}" --no-heads --out "$RUN/dflash" > "$RUN/dflash.log" 2>&1 &
wait
for d in dspark dflash; do
  grep -v "it/s" "$RUN/$d.log" | tail -8
  mkdir -p "$OUT/$d" && cp "$RUN/$d"/drafter.* "$RUN/$d/history.json" "$OUT/$d/"
done
ls -la "$OUT"/*
