# Session 31 GPU calls.
#   bash scripts/gpu/session31.sh parts   (carry .gpu/prompts.npz; no GGUF needed)
#       The SmolLM2-135M shape (random weights, acceptance REPLAYED from the shipped
#       drafter's H200 rounds), fixed K = 3 against adaptive drafting forced 3 deep
#       (FORCE_DEPTH: the same device work, so the step-time gap is adaptive's host
#       work), every engine host method timed per step (PHASES), at 256 and 64 requests;
#       then adaptive as it chooses at 256.
#   bash scripts/gpu/session31.sh depths  (the same carry) adaptive forced 1-5 deep
#       against K = 3 at 256 and adaptive without and with ("mem") the overhead slope
#       memory (session 31 ran it on 00e9811, the memory then on by default, its
#       variant "nomem:overhead_slope_memory=false");
#       K = 3 and 4 and adaptive forced 3 and 4 deep at 16: what each depth costs and
#       earns on this device.
#   bash scripts/gpu/session31.sh ab  (GGUF staged; see the mode) SmolLM2 + the shipped
#       drafter: K = 3, adaptive and adaptive with the slope memory at 256 and 64
#       (ab_low: at 16 and 1).
#   bash scripts/gpu/session31.sh trace16  (staged as for ab) SmolLM2 + the shipped
#       drafter at 16 requests: K = 3, K = 4 and adaptive, step by step (PHASES).
#   bash scripts/gpu/session31.sh gate  (staged as for ab; not run yet) the gate's
#       128-step window at one request against 16 (variant old), K = 3 beside, at 1, 4.
set +e +o pipefail
export PYTHONPATH=src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -m dspark.bench.provenance
trace() {  # CONCURRENCY REPEATS OUTFILE [env...]
  local c=$1 r=$2 f=$3; shift 3
  env SHAPE=smollm2-135m FULL_WARMUP=1 PHASES=1 "$@" \
    timeout ${LIMIT:-170} python3 scripts/gpu/step_trace.py "$c" 7 "" 128 "$r" > "$OUT/$f" 2>&1
  grep -E "^===|full-batch \(|host parts|depth steps" "$OUT/$f" | cut -c1-400
}
case "$1" in
  parts)
    trace 256 2 trace_c256_forced3.txt FORCE_DEPTH=3 SETTINGS="fixed:3;adaptive"
    trace 64 2 trace_c64_forced3.txt FORCE_DEPTH=3 SETTINGS="fixed:3;adaptive"
    trace 256 1 trace_c256_free.txt SETTINGS="fixed:3;adaptive" ;;
esac
case "$1" in
  depths)  # what each drafting depth costs and earns at 256 and 16, the host work alike
    trace 256 2 trace_c256_depths.txt SETTINGS="fixed:3;adaptive@1;adaptive@2;adaptive@3;adaptive@4;adaptive@5;adaptive;variant=mem:overhead_slope_memory=true"
    trace 16 2 trace_c16_depths.txt SETTINGS="fixed:3;fixed:4;adaptive@3;adaptive@4" ;;
esac
# SmolLM2 + the shipped drafter (GGUF staged by stage_piece.sh p1 .. p6; the call carries
# .gpu/p7 .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256).
stage_model() {
  bash scripts/gpu/stage_piece.sh p7 >/dev/null 2>&1 || true
  source scripts/gpu/env.sh
  set +e +o pipefail
}
bench() {  # LIMIT TAG CONCURRENCY MIN_REQUESTS REPEATS [bench args...], into $OUT/TAG
  local limit=$1 tag=$2 c=$3 n=$4 r=$5; shift 5
  timeout "$limit" python3 -m dspark.cli bench --model "$G" --device cuda --dtype bfloat16 \
    --prompts .gpu/prompts.npz --drafter dspark --max-tokens 128 --full-warmup --freeze-gc \
    --fixed 3 --concurrency "$c" --min-requests "$n" --repeats "$r" --out "$OUT/$tag" "$@" \
    2>&1 | grep -v "it/s\]\|s/it\]" | tail -8
  for f in "$OUT/$tag"/profiles/*.json; do [ -f "$f" ] && mv "$f" "$OUT/$tag/"; done
  rm -rf "$OUT/$tag/profiles"
  [ -f "$OUT/$tag/bench.json" ] && python3 scripts/run_modes.py "$OUT/$tag/bench.json"
}
case "$1" in
  ab)  # K = 3, adaptive, adaptive with the overhead slope memory ("mem"), at 256 and 64.
       # (Session 31 ran it on f4b82b0, where the memory was the default and the variant
       # turned it off: "nomem:overhead_slope_memory=false".)
    stage_model
    mem="--no-baseline --variant mem:overhead_slope_memory=true"
    bench ${LIMIT256:-250} ab256 256 256 ${REPEATS256:-4} $mem
    bench ${LIMIT64:-200} ab64 64 128 ${REPEATS64:-4} $mem ;;
  ab_low)  # the same at 16 and 1 (session 31: on 6e810aa, as ab)
    stage_model
    mem="--no-baseline --variant mem:overhead_slope_memory=true"
    bench ${LIMIT16:-220} ab16 16 128 ${REPEATS16:-4} $mem
    bench ${LIMIT1:-200} ab1 1 8 ${REPEATS1:-5} $mem ;;
  trace16)  # K = 3, K = 4 and adaptive at 16 requests, step by step, host methods timed
    stage_model
    MODEL=$G PHASES=1 FULL_WARMUP=1 SETTINGS="fixed:3;fixed:4;adaptive" timeout ${LIMIT:-200} \
      python3 scripts/gpu/step_trace.py 16 7 "" 128 2 > "$OUT/trace_c16_smollm2.txt" 2>&1
    grep -E "^===|full-batch \(|host parts|depth steps|budgets:" "$OUT/trace_c16_smollm2.txt" \
      | cut -c1-600 ;;
  gate)  # for the next lease: the gate's 128-step window at one request (the default
         # since 8f7bf8c) against 16 ("old"), K = 3 beside, at 1 (no spec too) and 4
    stage_model
    old="--variant old:gate_alone_window=16"
    bench ${LIMIT1:-300} gate1 1 8 ${REPEATS1:-8} $old
    bench ${LIMIT4:-200} gate4 4 32 ${REPEATS4:-5} --no-baseline $old ;;
esac
