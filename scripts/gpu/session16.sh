# Session 16 GPU calls, after the stage_piece.sh calls (the GGUF quarters parked).
#   bash scripts/gpu/session16.sh trace   step traces at 256 and 64, K = 3 against adaptive
#                                         (host profile, the scheduler's prices at the end)
#   bash scripts/gpu/session16.sh ab342   A/B at 256 and 64 of the engine, gate and verifier
#                                         against 342b7ab's (.gpu/old342, ab_files.sh)
#   bash scripts/gpu/session16.sh b8      the 8B shape (replayed acceptance) at 256 and 64, then
#                                         16, 4 and 1, as session 11 ran it
#   bash scripts/gpu/session16.sh sampled the batched sampling on the GPU: the drafter's proposal
#                                         and verification against the per-request loops
#                                         (scripts/*_sampling_time.py), then the bench at
#                                         temperature 1 at 16 and 4 (not run in session 16)
#   bash scripts/gpu/session16.sh MODE    session14.sh's MODE (c4_16, c64, c1, ...)
if [ "$1" = b8 ]; then  # random weights: no GGUF to assemble
  export PYTHONPATH=src RUN=/tmp/run && mkdir -p "$RUN"
else
  source scripts/gpu/env.sh
fi
set +e +o pipefail
export G OUT
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline | head -1
case "$1" in
  trace)
    for c in ${TRACE_CONC:-256 64}; do
      MODEL=$G SETTINGS=fixed:3,adaptive FULL_WARMUP=1 PROFILE=1 timeout ${LIMIT:-250} \
        python3 scripts/gpu/step_trace.py $c 7 none 128 2 2>&1 | grep -v "it/s\]\|s/it\]" \
        > "$OUT/step_trace_c$c.txt"
      grep -E "^===|medians per|depth steps|step cost|drafter price|population|Error" \
        "$OUT/step_trace_c$c.txt"
    done
    ;;
  ab342)
    OLD=.gpu/old342 CONC="${CONC:-256 64}" ROUNDS=${ROUNDS:-2} MINREQ=${MINREQ:-256} \
      LIMIT=${LIMIT:-100} bash scripts/gpu/ab_files.sh
    ;;
  b8)
    C8="python3 -m dspark.cli bench --shape llama3-8b --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --max-tokens 128 --repeats 2 --trace published:chat --full-warmup"
    timeout ${LIMIT_HI:-320} $C8 --concurrency 256 64 --fixed 4 5 7 --out "$RUN/hi" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -14
    cp "$RUN/hi/bench.json" "$OUT/bench8b_hi.json" 2>/dev/null || cp "$RUN/hi/bench.partial.json" "$OUT/bench8b_hi.partial.json"
    timeout ${LIMIT_LO:-230} $C8 --concurrency 16 4 1 --fixed 6 7 --min-requests 12 --out "$RUN/lo" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -16
    cp "$RUN/lo/bench.json" "$OUT/bench8b_lo.json" 2>/dev/null || cp "$RUN/lo/bench.partial.json" "$OUT/bench8b_lo.partial.json"
    ;;
  sampled)
    for c in 4 16 64 256; do
      timeout 120 python3 scripts/verify_sampling_time.py $c 7 15 cuda 2>&1 | tail -4
    done
    for c in 4 16 64; do
      MODEL_PATH=$G PROMPTS=.gpu/prompts.npz timeout 150 \
        python3 scripts/drafter_sampling_time.py $c 15 cuda 2>&1 | tail -4
    done
    timeout ${LIMIT:-300} python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --temperature 1 --concurrency 16 4 --min-requests 48 --repeats 3 --out "$RUN/t1" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -12
    cp "$RUN/t1/bench.json" "$OUT/bench_t1_c16_c4.json" 2>/dev/null
    ;;
  *)
    bash scripts/gpu/session14.sh "$1"
    ;;
esac
ls -la "$OUT"
