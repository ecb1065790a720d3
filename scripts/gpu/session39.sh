# Session 39 GPU calls: session 38's later code (ddca33e's shared row graphs, dd3e766's
# sampling head passes, 31da6fe's helpers) on the H200 for the first time. SmolLM2 + the
# shipped drafter, staged as `bash scripts/gpu/split_gguf.sh` prints (this checkout:
# stage_piece.sh p1 .. p10, one call each; then the call carries .gpu/p11 .gpu/wheels
# .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256). LAST names the last
# piece (p11).
#   bash scripts/gpu/session39.sh check
#       The CUDA tests of the padded steps, drafter and ops (the captured sampling heads
#       among them); then at temperature 1: at 1 (8 requests, REPEATS1, 4) and 16 (64,
#       REPEATS16, 3), K = 3, adaptive and adaptive with eager heads (eh:head_graphs=off).
#   bash scripts/gpu/session39.sh wide1
#       Greedy at 1 over 24 requests (REPEATS1, 4): K = 3, adaptive and a depth margin of
#       0.02 (m2): whether the deep drafts that 8 prompts do not reward are the sample.
#   bash scripts/gpu/session39.sh mid
#       Greedy at 4 (48 requests, REPEATS4, 3) and 64 (128, REPEATS64, 3): K = 3 and 4,
#       adaptive.
#   bash scripts/gpu/session39.sh ceiling   (prepared for the next lease, not run yet)
#       The depth ceiling (b1f3113, EngineConfig.depth_ceiling, variant dc) at 16 (128,
#       REPEATS16, 3) and 64 (128, REPEATS64, 3): K = 4, adaptive and dc.
#   bash scripts/gpu/session39.sh trace16   (prepared, not run yet)
#       Where a deep step's time goes at 16: K = 4 and 7 against adaptive forced 4 and 7
#       deep, step by step with the engine's host methods timed (step_trace.py, PHASES).
#   The 8B shape with the ceiling (carry .gpu/prompts.npz only; not run yet):
#       for c in "16 48" "1 8"; do set -- $c; TAG=s40_dc_c$1 LEVEL=$1 FIXED=7 REQUESTS=$2 \
#         REPEATS=3 VARIANTS="dc:depth_ceiling=on" LIMIT=200 bash scripts/gpu/session34.sh; done
set +e +o pipefail
bash scripts/gpu/stage_piece.sh "${LAST:-p11}" >/dev/null 2>&1
source scripts/gpu/session31.sh none
stage_model
eager="--variant eh:head_graphs=off"
tidy() { rm -f "$OUT"/*/*profile*.json "$OUT"/*/bench.partial.json "$OUT"/*/bench.png; }
gpu_tests() {
  timeout "${TESTS_LIMIT:-150}" python3 -m pytest -q -m gpu tests/engine/test_graphs.py \
    tests/engine/test_drafter.py tests/models/test_drafter.py tests/ops -p no:cacheprovider \
    2>&1 | tail -4
}
case "$1" in
  check)
    gpu_tests
    bench "${LIMIT1:-200}" s39_t1_c1 1 8 "${REPEATS1:-4}" --temperature 1 --no-baseline $eager
    bench "${LIMIT16:-200}" s39_t1_c16 16 64 "${REPEATS16:-3}" --temperature 1 --no-baseline \
      $eager ;;
  wide1)
    bench "${LIMIT1:-330}" s39_w_c1 1 24 "${REPEATS1:-4}" --no-baseline \
      --variant m2:depth_margin=0.02 ;;
  mid)
    bench "${LIMIT4:-200}" s39_c4 4 48 "${REPEATS4:-3}" --fixed 3 4 --no-baseline
    bench "${LIMIT64:-250}" s39_c64 64 128 "${REPEATS64:-3}" --fixed 3 4 --no-baseline ;;
  ceiling)
    dc="--variant dc:depth_ceiling=on"
    bench "${LIMIT16:-220}" s40_dc_c16 16 128 "${REPEATS16:-3}" --fixed 4 --no-baseline $dc
    bench "${LIMIT64:-220}" s40_dc_c64 64 128 "${REPEATS64:-3}" --fixed 4 --no-baseline $dc ;;
  trace16)
    MODEL=$G PHASES=1 FULL_WARMUP=1 SETTINGS="fixed:4;fixed:7;adaptive@4;adaptive@7" \
      timeout "${LIMIT:-240}" python3 scripts/gpu/step_trace.py 16 7 "" 128 2 \
      > "$OUT/trace_c16_depths.txt" 2>&1
    grep -E "^===|full-batch \(|host parts|depth steps" "$OUT/trace_c16_depths.txt" | cut -c1-600 ;;
esac
tidy
