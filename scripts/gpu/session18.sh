# Session 18 GPU calls, after the four stage_piece.sh calls (q1..q4, the GGUF parked).
# Carry: .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256 .gpu/old
# The c16 A/B of session 18 ran the remembered depth slope (not shipped) as the working
# tree's cost.py against 251ffd2's under .gpu/old; to repeat it, here:
#   mkdir -p .gpu/old/src/dspark/scheduling
#   git show 251ffd2:src/dspark/scheduling/cost.py > .gpu/old/src/dspark/scheduling/cost.py
#   git apply docs/results/bench/h200/traces/session18/remembered_slope_not_shipped.patch
#   bash scripts/gpu/session18.sh c16     the A/B at 16 (old cost model against new,
#                                          alternating), then step traces at 16 (K = 3
#                                          against adaptive) with the old and the new one
#   bash scripts/gpu/session18.sh sampled  temperature 1 at 16 and 4 (no spec, K = 3,
#                                          adaptive), the batched sampling timings, an A/B
#                                          round at 64 (run with LIMIT64=1: skipped)
#   bash scripts/gpu/session18.sh c16x5    no spec, K = 3 and adaptive at 16 and 4, 48
#                                          requests, five repeats
#   bash scripts/gpu/session18.sh t1c4     temperature 1 at 4 (no spec, K = 3, adaptive; the
#                                          warm-up now samples too), then step traces at 4,
#                                          no spec against adaptive, the first cProfile'd
#   KS="7 3" bash scripts/gpu/session18.sh ks
#                                          adaptive with K = 7 and 3 (KS) against K = 3 at
#                                          16, 64, 4 and 1 (16 requests at least, 2 repeats),
#                                          then a profiled step trace at 16
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline | head -1
trace() {  # $1: label; $2: concurrency
  MODEL=$G SETTINGS=fixed:3,adaptive FULL_WARMUP=1 timeout ${TRACE_LIMIT:-100} \
    python3 scripts/gpu/step_trace.py $2 7 none 128 1 2>&1 | grep -v "it/s\]\|s/it\]" \
    > "$OUT/step_trace_$1_c$2.txt"
  grep -E "^===|full-batch|drafter price|overhead lines|remembered|Error" "$OUT/step_trace_$1_c$2.txt"
}
swap() {  # $1: old or new
  if [ "$1" = old ]; then cp .gpu/old/src/dspark/scheduling/cost.py src/dspark/scheduling/cost.py
  else cp /tmp/new_cost.py src/dspark/scheduling/cost.py; fi
}
cp src/dspark/scheduling/cost.py /tmp/new_cost.py
case "$1" in
  c16)
    OLD=.gpu/old CONC=16 ROUNDS=${ROUNDS:-3} MINREQ=48 LIMIT=${LIMIT:-70} bash scripts/gpu/ab_files.sh
    swap old; trace old 16; swap new; trace new 16
    ;;
  sampled)
    timeout ${LIMIT:-280} python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --temperature 1 --concurrency 16 4 --min-requests 48 --repeats 3 --out "$RUN/t1" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -12
    cp "$RUN/t1/bench.json" "$OUT/bench_t1_c16_c4.json" 2>/dev/null
    cp "$RUN/t1/bench.png" "$OUT/bench_t1_c16_c4.png" 2>/dev/null
    for c in 16 64; do
      timeout 50 python3 scripts/verify_sampling_time.py $c 7 15 cuda 2>&1 | tail -4
    done
    MODEL_PATH=$G PROMPTS=.gpu/prompts.npz timeout 60 \
      python3 scripts/drafter_sampling_time.py 16 15 cuda 2>&1 | tail -4
    OLD=.gpu/old CONC=64 ROUNDS=1 MINREQ=128 LIMIT=${LIMIT64:-90} bash scripts/gpu/ab_files.sh
    ;;
  c16x5)
    timeout 330 python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --concurrency 16 4 --min-requests 48 --repeats 5 --out "$OUT/c16c4" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -12
    ;;
  t1c4)  # temperature 1 at 4 after the sampled warm-up, then where an undrafted step's time goes
    timeout 200 python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --temperature 1 --concurrency 4 --min-requests 48 --repeats 3 --out "$OUT/t1c4" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -8
    rm -rf "$OUT/t1c4/profiles"
    MODEL=$G SETTINGS=none,adaptive FULL_WARMUP=1 PROFILE=1 TEMPERATURE=1 timeout 150 \
      python3 scripts/gpu/step_trace.py 4 7 none 128 2 2>&1 | grep -v "it/s\]\|s/it\]" \
      > "$OUT/step_trace_t1_c4.txt"
    grep -E "^===|medians per|full-batch|depth steps|Error" "$OUT/step_trace_t1_c4.txt"
    ;;
  ks)  # adaptive's largest depth (the drafter's block) against K = 3, at 1, 4, 16 and 64
    for k in ${KS:-7 3}; do
      timeout ${LIMIT:-170} python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
        --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --k $k --max-tokens 128 \
        --full-warmup --no-baseline --concurrency 16 64 4 1 --min-requests 16 --repeats 2 \
        --out "$RUN/k$k" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -14
      cp "$RUN/k$k/bench.json" "$OUT/bench_k$k.json" 2>/dev/null \
        || cp "$RUN/k$k/bench.partial.json" "$OUT/bench_k$k.partial.json"
    done
    PROFILE=1 trace profiled 16  # host hotspots at 16 (cProfile, K = 3 against adaptive)
    ;;
esac
cp /tmp/new_cost.py src/dspark/scheduling/cost.py
ls -la "$OUT"
