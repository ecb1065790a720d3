# Session 43 GPU calls: SmolLM2 + the shipped drafter, greedy, time-sliced (200 ms turns,
# windows of 4 s of each engine's own time), every step logged, on the code after session
# 42's review: the plain "adaptive≤7" row settles (settle "auto", on for CUDA) and "pl"
# is adaptive with settle off, in the same windows.
# Staged as `bash scripts/gpu/split_gguf.sh` prints (session 43: five pieces of 19 MiB, the
# checkout being 42 MB): stage_piece.sh p1 .. p4, one call each; this call carries the
# last piece (LAST, default p5), .gpu/wheels, .gpu/prompts.npz and
# .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256.
#   bash scripts/gpu/session43.sh lo    # 1 and 4: no spec, K = 3, 4, adaptive, pl; 3 windows
#   bash scripts/gpu/session43.sh hi    # 256 (K = 4, adaptive, pl; 3 windows), then 64
#                                       # (K = 4, 5, adaptive, pl; 2 windows)
#   bash scripts/gpu/session43.sh b8    # the 8B shape, acceptance REPLAYED: 256 (K = 5, 7)
#                                       # and 16 (K = 7), adaptive and pl
#   bash scripts/gpu/session43.sh b8lo  # the same at 1, 4 (K = 7) and 64 (K = 5, 7)
#   bash scripts/gpu/session43.sh mid   # 16 (K = 3, 4, adaptive, pl; 3 windows), then 1
#                                       # again (4 windows)
# VARIANT replaces the variant beside plain adaptive (default pl:settle=off), e.g. the
# drafter's block cut to each depth, not yet run on a GPU (session 44):
#   VARIANT=cut:draft_block=cut bash scripts/gpu/session43.sh b8
set +e +o pipefail
case "$1" in  # SmolLM2's calls join the staged GGUF; the 8B shape needs none
  lo|hi|mid)
    bash scripts/gpu/stage_piece.sh "${LAST:-p5}" >/dev/null 2>&1
    source scripts/gpu/session31.sh none
    stage_model ;;
esac
one() {  # TAG LEVELS FIXED REPEATS LIMIT [more bench args]
  local tag=$1 levels=$2 fixed=$3 repeats=$4 limit=$5; shift 5
  bench "$limit" "$tag" 16 128 "$repeats" --fixed $fixed --concurrency $levels \
    --slice-ms 200 --window-s 4 --step-log --variant "${VARIANT:-pl:settle=off}" "$@"
  rm -f "$OUT"/*/*profile*.json
  if [ -f "$OUT/$tag/steps.json" ]; then
    python3 scripts/step_log.py "$OUT/$tag/steps.json" K=4 > "$OUT/$tag/step_log.txt" 2>&1
    gzip -f "$OUT/$tag/steps.json"
  fi
}
b8() {  # TAG LEVEL FIXED REQUESTS REPEATS SLICE LIMIT: the 8B shape, acceptance REPLAYED
  TAG=$1 LEVEL=$2 FIXED="$3" REQUESTS=$4 REPEATS=$5 VARIANTS="${VARIANT:-pl:settle=off}" \
    BASELINE="--no-baseline --slice-ms $6 --window-s 3 --step-log" LIMIT=$7 \
    bash scripts/gpu/session34.sh
  [ -f "$OUT/b8_$1/steps.json" ] && gzip -f "$OUT/b8_$1/steps.json"
}
case "$1" in
  b8)  # the Llama-3-8B shape at 256 (K = 5, 7) and 16 (K = 7); adaptive, pl
    b8 s43_c256 256 "5 7" 512 2 300 ${LIMIT8:-170}
    b8 s43_c16 16 "7" 48 3 200 ${LIMIT16:-110} ;;
  b8lo)  # the 8B shape at 1, 4 (K = 7) and 64 (K = 5, 7); adaptive, pl
    b8 s43_c1 1 "7" 8 3 200 ${LIMIT1:-100}
    b8 s43_c4 4 "7" 16 3 200 ${LIMIT4:-100}
    b8 s43_c64 64 "5 7" 128 2 200 ${LIMIT64:-150} ;;
  lo)
    one s43_lo "1 4" "3 4" "${REPEATS:-3}" "${LIMIT:-560}" ;;
  hi)
    one s43_256 256 4 "${REPEATS:-3}" "${LIMIT256:-330}" --no-baseline
    one s43_64 64 "4 5" "${REPEATS64:-2}" "${LIMIT64:-220}" --no-baseline ;;
  mid)
    one s43_16 16 "3 4" "${REPEATS:-3}" "${LIMIT16:-300}" --no-baseline
    one s43_1 1 "3 4" "${REPEATS1:-4}" "${LIMIT1:-250}" --no-baseline ;;
esac
true
