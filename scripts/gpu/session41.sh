# Session 41 GPU calls, SmolLM2 + the shipped drafter, greedy. Staged as `bash
# scripts/gpu/split_gguf.sh` prints: stage_piece.sh p1 .. p3, one call each; each call
# here carries .gpu/p4 .gpu/wheels .gpu/prompts.npz
# .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256.
#   bash scripts/gpu/session41.sh sliced [TAG]   # time-sliced at 16 and 64 (K = 3, 4, 5
#       and adaptive in the same windows), every measured step logged (`dspark bench
#       --step-log`) and read by scripts/step_log.py against K = 4. LIMIT (default 480
#       s), REPEATS (4 windows), FIXED, LEVELS, EXTRA (more bench arguments).
#   bash scripts/gpu/session41.sh trace [LEVEL]  # step by step at LEVEL (default 64): K = 5,
#       adaptive forced 5 deep and adaptive free, every engine host method timed (PHASES).
set +e +o pipefail
bash scripts/gpu/stage_piece.sh "${LAST:-p4}" >/dev/null 2>&1
source scripts/gpu/session31.sh none
stage_model
case "$1" in
  sliced)
    tag=${2:-s41_sl}
    bench "${LIMIT:-480}" "$tag" 16 128 "${REPEATS:-4}" --fixed ${FIXED:-3 4 5} --no-baseline \
      --concurrency ${LEVELS:-16 64} --slice-ms 200 --window-s 4 --step-log ${EXTRA:-}
    rm -f "$OUT"/*/*profile*.json
    [ -f "$OUT/$tag/steps.json" ] && python3 scripts/step_log.py "$OUT/$tag/steps.json" K=4 \
      > "$OUT/$tag/step_log.txt" 2>&1
    grep -A14 "against K=4" "$OUT/$tag/step_log.txt" | head -80 ;;
  trace)
    level=${2:-64}
    MODEL=$G FULL_WARMUP=1 PHASES=1 SETTINGS="${SETTINGS:-fixed:5;adaptive@5;adaptive}" \
      timeout "${LIMIT:-250}" python3 scripts/gpu/step_trace.py "$level" 7 "" 128 "${REPEATS:-2}" \
      > "$OUT/trace_c${level}_phases.txt" 2>&1
    grep -E "^===|full-batch \(|host parts" "$OUT/trace_c${level}_phases.txt" | cut -c1-900 ;;
esac
