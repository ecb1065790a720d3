# Session 38 GPU calls: the drafter's greedy heads replayed as CUDA graphs
# (``GreedyHeads``, now ``DraftHeads``; ``EngineConfig.head_graphs``), SmolLM2 + the shipped drafter, staged
# as in session 36 (stage_piece.sh p1 .. p9, one call each; then a call carrying .gpu/p10
# .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256).
#   bash scripts/gpu/session38.sh c1
#       The CUDA tests of the padded steps, drafter and ops; then at 1 request (8
#       requests of 128 tokens, REPEATS1 repeats, 5): no speculation, K = 3, 4 and 5,
#       adaptive, and adaptive with eager heads (variant eh:head_graphs=off).
#   bash scripts/gpu/session38.sh c16
#       At 16 (128 requests, REPEATS16, 5): K = 3 and 4, adaptive, and eh.
#   bash scripts/gpu/session38.sh margins
#       At 1 (8 requests, REPEATS1, 5) then 16 (128, REPEATS16, 5): K = 3, adaptive, a
#       depth margin of 0.02 (m2) and survival calibrated by outcomes (cs); at 1 eh too.
#   bash scripts/gpu/session38.sh wide1   (prepared for the next lease, not run yet)
#       At 1 over 24 requests (REPEATS1, 4): K = 3, adaptive, m2 and cs; eight requests
#       leave the acceptance at depth to a handful of prompts (K = 5 accepted 0.043
#       tokens a round more than K = 3 in s38_c1, where the recorded H200 rounds say 0.113).
#   bash scripts/gpu/session38.sh mid   (prepared, not run yet)
#       At 4 (48 requests, REPEATS4, 4) and 64 (128, REPEATS64, 3): K = 3 and 4, adaptive.
set +e +o pipefail
bash scripts/gpu/stage_piece.sh p10 >/dev/null 2>&1
source scripts/gpu/session31.sh none
stage_model
eager="--variant eh:head_graphs=off"
tidy() { rm -f "$OUT"/*/*profile*.json "$OUT"/*/bench.partial.json "$OUT"/*/bench.png; }
case "$1" in
  c1)
    timeout 200 python3 -m pytest -q -m gpu tests/engine/test_graphs.py \
      tests/engine/test_drafter.py tests/models/test_drafter.py tests/ops -p no:cacheprovider \
      2>&1 | tail -3
    bench "${LIMIT1:-330}" s38_c1 1 8 "${REPEATS1:-5}" --fixed 3 4 5 $eager ;;
  c16)
    bench "${LIMIT16:-480}" s38_c16 16 128 "${REPEATS16:-5}" --fixed 3 4 --no-baseline $eager \
      --variant cs:calibrate_survival=on ;;
  margins)
    both="--no-baseline --variant m2:depth_margin=0.02 --variant cs:calibrate_survival=on"
    bench "${LIMIT1:-270}" s38_m_c1 1 8 "${REPEATS1:-5}" --fixed 3 $both $eager
    bench "${LIMIT16:-300}" s38_m_c16 16 128 "${REPEATS16:-5}" --fixed 3 $both ;;
  wide1)
    timeout 200 python3 -m pytest -q -m gpu tests/engine/test_graphs.py \
      tests/engine/test_drafter.py tests/models/test_drafter.py tests/ops -p no:cacheprovider \
      2>&1 | tail -3
    bench "${LIMIT1:-420}" s38_w_c1 1 24 "${REPEATS1:-4}" --fixed 3 --no-baseline \
      --variant m2:depth_margin=0.02 --variant cs:calibrate_survival=on ;;
  mid)
    bench "${LIMIT4:-200}" s38_c4 4 48 "${REPEATS4:-4}" --fixed 3 4 --no-baseline
    bench "${LIMIT64:-300}" s38_c64 64 128 "${REPEATS64:-3}" --fixed 3 4 --no-baseline ;;
esac
tidy
