# Session 42 GPU calls: EngineConfig.settle (variant "st", settle=on) beside plain
# adaptive and the best fixed Ks, time-sliced, every step logged.
#   SmolLM2 + the shipped drafter (staged: stage_piece.sh p1 .. p3, one call each; the
#   call carries .gpu/p4 .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256):
#     bash scripts/gpu/session42.sh low    # 16 and 64: K = 4, 5, adaptive, st; 4 windows
#     bash scripts/gpu/session42.sh high   # 256: K = 4, adaptive, st; 3 windows; then the
#                                          # 8B shape at 256 (K = 5, 7, adaptive, st)
#     bash scripts/gpu/session42.sh s256   # 256 alone (after the guard)
#   The Llama-3-8B shape, acceptance REPLAYED (carry .gpu/prompts.npz only):
#     bash scripts/gpu/session42.sh b8a    # 256 (K = 5, 7), 1 and 4 (K = 7); adaptive, st
#     bash scripts/gpu/session42.sh b8b    # 16 (K = 7) and 64 (K = 5, 7); adaptive, st
# Session 42 ran these on 8eee435 and 55204b3, where settle was off by default, so the
# plain "adaptive≤7" row did not settle. Since the default is "auto" (on for CUDA), that
# row settles too; to compare as session 42 did on later code, give the plain row back
# as a variant: replace "--variant st:settle=on" below with "--variant pl:settle=off".
set +e +o pipefail
b8() {  # TAG LEVEL FIXED REQUESTS REPEATS SLICE LIMIT
  TAG=$1 LEVEL=$2 FIXED="$3" REQUESTS=$4 REPEATS=$5 VARIANTS="st:settle=on" \
    BASELINE="--no-baseline --slice-ms $6 --window-s 3 --step-log" LIMIT=$7 \
    bash scripts/gpu/session34.sh
  [ -f "$OUT/b8_$1/steps.json" ] && gzip -f "$OUT/b8_$1/steps.json"
}
case "$1" in
  low)
    FIXED="4 5" REPEATS=${REPEATS:-4} LIMIT=${LIMIT:-560} EXTRA="--variant st:settle=on" \
      bash scripts/gpu/session41.sh sliced s42_low
    gzip -f "$OUT"/s42_low/steps.json ;;
  high)  # (before 55204b3's guard; session 42 ran it on 8eee435, digest 86d7138198420174)
    FIXED="4" LEVELS="256" REPEATS=${REPEATS:-3} LIMIT=${LIMIT:-330} \
      EXTRA="--variant st:settle=on" bash scripts/gpu/session41.sh sliced s42_256
    gzip -f "$OUT"/s42_256/steps.json
    b8 s42_c256 256 "5 7" 512 2 300 ${LIMIT8:-170} ;;
  s256)  # SmolLM2 at 256 alone
    FIXED="4" LEVELS="256" REPEATS=${REPEATS:-3} LIMIT=${LIMIT:-330} \
      EXTRA="--variant st:settle=on" bash scripts/gpu/session41.sh sliced s42_256g
    gzip -f "$OUT"/s42_256g/steps.json ;;
  b8a)
    b8 s42_c256g 256 "5 7" 512 2 300 ${LIMIT8:-170}
    b8 s42_c1 1 "7" 8 3 200 ${LIMIT1:-100}
    b8 s42_c4 4 "7" 16 3 200 ${LIMIT4:-100} ;;
  b8b)
    b8 s42_c16 16 "7" 48 3 200 ${LIMIT16:-110}
    b8 s42_c64 64 "5 7" 128 3 200 ${LIMIT64:-150} ;;
esac
true
