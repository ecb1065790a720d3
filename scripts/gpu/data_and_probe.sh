# Second GPU call: self-distillation data for the SmolLM2 drafter, then a short timing
# probe of both training configurations (to size the real runs to the call limit).
source scripts/gpu/env.sh
python3 -m dspark.cli train-drafter --model "$G" --prompts .gpu/prompts.npz --data "$RUN/data" \
  --num-prompts 10000 --heldout-prompts 400 --gen-batch 512 --max-new-tokens 256 \
  --out "$RUN/probe" --steps 40 --eval-every 40 --batch-size 32 --anchors 32 2>&1 | grep -v "it/s\]" | tail -12
python3 -m dspark.cli train-drafter --model "$G" --data "$RUN/data" --no-heads \
  --out "$RUN/probe2" --steps 40 --eval-every 40 --batch-size 32 --anchors 32 2>&1 | grep -v "it/s\]" | tail -4
python3 - <<'PY'
import json
for d in ("probe", "probe2"):
    m = json.load(open(f"/root/stage/run/{d}/drafter.json"))["metadata"]
    print(d, m["train_minutes"], "min for", m["steps_done"], "steps", m["data"])
PY
cd "$RUN" && tar czf "$OUT/data.tgz" data && ls -la "$OUT"
