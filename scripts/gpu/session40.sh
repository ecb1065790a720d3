# Session 40 GPU calls: SmolLM2 + the shipped drafter, greedy, at every level with more
# interleaved repeats than before (a run at 16-256 lasts 2-4 s, so repeats are cheap next
# to start-up; session 40's first calls showed this host's speed wandering within a call).
# Staged as `bash scripts/gpu/split_gguf.sh` prints (this checkout: stage_piece.sh p1 ..
# p3, one call each; then the call carries .gpu/p4 .gpu/wheels .gpu/prompts.npz
# .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256). LAST names the last piece (p4).
#   bash scripts/gpu/session40.sh low    # 1 (24 requests x 3; no spec, K = 3, 4, adaptive)
#                                        # 4 (48 x 4; K = 3, 4, adaptive)
#     (Session 40 ran it with 6 and 7 repeats: both levels passed their limits, 300 and
#     200 s, and nothing came back. Not run since at these settings.)
#   bash scripts/gpu/session40.sh high   # 16 and 64 (128 x 9; K = 4, adaptive; 16 ran
#                                        # out of its 170 s at 7 repeats: now 220)
#                                        # 256 (256 x 4; no spec, K = 4, adaptive)
# Session 40 also ran, with session 39's script (LAST=p4): `session39.sh ceiling` and
# `session39.sh trace16`, and the 8B shape with the depth ceiling at 16 and 1 (the loop in
# session39.sh's header, LIMIT 170 and 140).
set +e +o pipefail
bash scripts/gpu/stage_piece.sh "${LAST:-p4}" >/dev/null 2>&1
source scripts/gpu/session31.sh none
stage_model
tidy() { rm -f "$OUT"/*/*profile*.json; }  # partials kept: a timed-out level keeps its runs
case "$1" in
  low)
    bench "${LIMIT1:-300}" s40_c1 1 24 "${REPEATS1:-3}" --fixed 3 4
    bench "${LIMIT4:-200}" s40_c4 4 48 "${REPEATS4:-4}" --fixed 3 4 --no-baseline ;;
  high)
    bench "${LIMIT16:-220}" s40_c16 16 128 "${REPEATS16:-9}" --fixed 4 --no-baseline
    bench "${LIMIT64:-130}" s40_c64 64 128 "${REPEATS64:-9}" --fixed 4 --no-baseline
    bench "${LIMIT256:-170}" s40_c256 256 256 "${REPEATS256:-4}" --fixed 4 ;;
esac
tidy
# Time-sliced (b's --slice-ms; every setting measured over the same stretch of wall time):
#   source scripts/gpu/session40.sh none; bench 200 s40_sl 16 128 5 --fixed 4 --no-baseline \
#     --concurrency 16 64 --slice-ms 200 --window-s 5; tidy
