# Session 32 GPU calls: SmolLM2 + the shipped drafter on the current code, staged as for
# `session31.sh ab` (`bash scripts/gpu/stage_piece.sh p1` ... `p6`, one call each
# carrying .gpu/pN, then the call carrying .gpu/p7 .gpu/wheels .gpu/prompts.npz
# .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256). Session 32 also ran `session31.sh gate`
# and `session31.sh trace16` on the same tree.
#   bash scripts/gpu/session32.sh levels  K = 3 and adaptive at 16 (6 repeats) and 64 (4)
#   bash scripts/gpu/session32.sh k4      K = 3 and adaptive with at most 4 drafts a
#                                         request (--k 4) at 16, 6 repeats
source scripts/gpu/session31.sh helpers  # its GPU line, provenance and helpers only
case "$1" in
  levels)
    stage_model
    bench 250 now16 16 128 6 --no-baseline
    bench 240 now64 64 128 4 --no-baseline ;;
  k4)
    stage_model
    bench 300 k4c16 16 128 6 --no-baseline --k 4 ;;
esac
