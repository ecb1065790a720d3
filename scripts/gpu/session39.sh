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
esac
tidy
