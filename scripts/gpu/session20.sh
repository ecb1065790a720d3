# Session 20 GPU calls, after the four stage_piece.sh calls (q1..q4, the GGUF parked).
# Carry: .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256
#   bash scripts/gpu/session20.sh bench   K = 3 against adaptive at CONC (16), 48 requests,
#                                         (VARIANTS="--variant cal:calibrate_survival=on":
#                                         more adaptive settings, see dspark bench --help;
#                                         TAIL: lines kept)
#                                         REPEATS (9) interleaved repeats, the heap frozen
#                                         for each measured run (FREEZE=no: not frozen);
#                                         every run's full collections are reported
#   bash scripts/gpu/session20.sh trace   step traces at CONC (16): K = 3 against
#                                         adaptive, 48 full-warmed requests, step classes
#   CONC=64 bash scripts/gpu/session20.sh pad0   the bench at CONC, 3 repeats, every new
#                                         graph shape captured at once (no padded replays)
#   bash scripts/gpu/session20.sh b8      the 8B shape (acceptance REPLAYED) at 4 and 1,
#                                         K = 6 against adaptive, 24 requests, 3 repeats
#                                         (needs only .gpu/prompts.npz, no staging)
if [ "$1" = b8 ]; then  # no weights to stage: random ones
  export PYTHONPATH=src
  OUT=${OUT:-/tmp/out}
  timeout ${LIMIT:-420} python3 -m dspark.cli bench --shape llama3-8b --device cuda \
    --dtype bfloat16 --prompts .gpu/prompts.npz --max-tokens 128 --trace published:chat \
    --full-warmup --repeats ${REPEATS:-3} --concurrency ${CONC:-4 1} --fixed ${FIXED:-6} \
    --min-requests ${MINREQ:-24} \
    --no-baseline ${VARIANTS:-} --out "$OUT/b8" 2>&1 \
    | grep -v "it/s\]\|s/it\]" | tail -${TAIL:-12}
  rm -rf "$OUT/b8/profiles"
  exit 0
fi
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m dspark.bench.provenance  # the files that run (this copy's git log can be stale)
CONC=${CONC:-16}
case "$1" in
  bench)
    tag=c$(echo $CONC | tr " " _)_x${REPEATS:-9}_freeze${FREEZE:-yes}
    flag=--freeze-gc; [ "${FREEZE:-yes}" = no ] && flag=--no-freeze-gc
    timeout ${LIMIT:-400} python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --no-baseline --concurrency $CONC --min-requests 48 --repeats ${REPEATS:-9} $flag \
      ${VARIANTS:-} --out "$OUT/$tag" 2>&1 | grep -v "it/s\]\|s/it\]" \
      | tail -${TAIL:-14}
    # The start-up profiles come back one folder up ($OUT/a/b/file is as deep as
    # files come back): the verify price they give each token count, beside the steps'.
    for f in "$OUT/$tag"/profiles/*.json; do [ -f "$f" ] && mv "$f" "$OUT/$tag/"; done
    rm -rf "$OUT/$tag/profiles"
    python3 - "$OUT/$tag/bench.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["concurrency"], r["label"], "runs", r["tok_s_runs"], "step_ms", round(r["step_ms"], 3),
          "undrafted", r["undrafted_steps"], "vetoes", r["gate_vetoes"], "gc_full", r.get("gc_full_runs", r["gc_full"]),
          "gc_s", round(r["gc_s"], 4), "depths", r["depth_steps"])
PY
    ;;
  pad0)
    timeout ${LIMIT:-200} python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --no-baseline --concurrency $CONC --min-requests 48 --repeats ${REPEATS:-3} \
      --graph-padding-budget 0 --out "$OUT/pad0" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -5
    rm -rf "$OUT/pad0/profiles"
    ;;
  trace)
    MODEL=$G SETTINGS=fixed:3,adaptive FULL_WARMUP=1 timeout ${TRACE_LIMIT:-150} \
      python3 scripts/gpu/step_trace.py $CONC 7 none 128 1 2>&1 | grep -v "it/s\]\|s/it\]" \
      > "$OUT/step_trace_c$CONC.txt"
    grep -v "^\[transformers\]" "$OUT/step_trace_c$CONC.txt" | head -80
    ;;
esac
