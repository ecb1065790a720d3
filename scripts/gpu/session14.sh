# Session 14 GPU calls, after four stage_piece.sh calls (the GGUF quarters parked).
#   bash scripts/gpu/session14.sh dl     the decision log at one request alone
#   bash scripts/gpu/session14.sh c1     decision log at one request, then the c1 bench
#   bash scripts/gpu/session14.sh trace  step trace at one request, K = 3 against adaptive
#   bash scripts/gpu/session14.sh trace16 step traces at 16 and 4, K = 3 against adaptive
#   bash scripts/gpu/session14.sh rounds every request's rounds at K = 7 (scripts/c1_policy_sim.py)
#   bash scripts/gpu/session14.sh c4_16  the bench at 16 and 4
#   bash scripts/gpu/session14.sh c64    the bench at 256 and 64
# Each step has its own time limit; what finished is copied to $OUT. C1_REQUESTS sets the
# c1 bench's requests (36; session13.sh runs these calls with 24); DECISION_LOG=0 leaves
# out c1's decision log.
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
C="python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup"
quiet() { grep -v "it/s\]\|s/it\]" | tail -40; }
keep() { for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT/"; done; }
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline | head -1
case "$1" in
  dl)
    MODEL=$G timeout 150 python3 scripts/gpu/decision_log.py 1 24 128 "$OUT/dl_c1.json" 2>&1 | tail -45
    ;;
  c1)
    [ "${DECISION_LOG:-1}" = 0 ] || MODEL=$G timeout 100 python3 scripts/gpu/decision_log.py 1 24 128 "$OUT/dl_c1.json" 2>&1 | tail -45
    timeout "${LIMIT:-420}" $C --concurrency 1 --min-requests ${C1_REQUESTS:-36} --repeats 3 --out "$RUN/c1" 2>&1 | quiet
    cp "$RUN/c1/bench.json" "$OUT/bench_c1.json" 2>/dev/null || cp "$RUN/c1/bench.partial.json" "$OUT/bench_c1.partial.json"
    ;;
  trace)
    MODEL=$G SETTINGS=fixed:3,adaptive FULL_WARMUP=1 PROFILE=1 timeout 300 \
      python3 scripts/gpu/step_trace.py 1 7 none 128 2 2>&1 | grep -v "it/s\]\|s/it\]" | tail -150
    ;;
  trace16)
    for c in 16 4; do
      MODEL=$G SETTINGS=fixed:3,adaptive FULL_WARMUP=1 PROFILE=1 timeout 200 \
        python3 scripts/gpu/step_trace.py $c 7 none 128 2 2>&1 | grep -v "it/s\]\|s/it\]"
    done
    ;;
  rounds)
    MODEL=$G DEVICE=cuda timeout 200 python3 scripts/record_request_rounds.py .gpu/prompts.npz 48 128 \
      "$OUT/rounds_smollm2_h200_48req.npz" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -5
    ;;
  c4_16)
    timeout "${LIMIT:-500}" $C --concurrency 16 4 --min-requests 48 --repeats 3 --out "$RUN/c4" 2>&1 | quiet
    cp "$RUN/c4/bench.json" "$OUT/bench_c4_16.json" 2>/dev/null || cp "$RUN/c4/bench.partial.json" "$OUT/bench_c4_16.partial.json"
    ;;
  c64)
    timeout "${LIMIT:-520}" $C --concurrency 256 64 --min-requests 512 --repeats 3 --out "$RUN/c64" 2>&1 | quiet
    cp "$RUN/c64/bench.json" "$OUT/bench_c64_256.json" 2>/dev/null || cp "$RUN/c64/bench.partial.json" "$OUT/bench_c64_256.partial.json"
    ;;
esac
ls -la "$OUT"
