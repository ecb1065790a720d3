# Session 37 GPU calls (SmolLM2 + the shipped drafter, staged as in session 36: the call
# carries .gpu/p10 .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256
# after stage_piece.sh p1 .. p9).
#   bash scripts/gpu/session37.sh trace
#       Where adaptive's gap to K = 3 lies at 16 and 1 request: K = 3, adaptive with every
#       decision forced 3 deep (the budget and allocation still run on the real
#       confidences: adaptive's host work and cuts at K = 3's depth) and adaptive as it
#       chooses, interleaved, REPEATS (3) each, step by step (PHASES), COUNT16 (64) and
#       COUNT1 (6) measured requests of 128 tokens after as many warm-up ones.
#   bash scripts/gpu/session37.sh undrafted
#       At 1 request: no speculation, adaptive with every decision forced undrafted
#       (adaptive@0: its host work and captured layers without drafting) and K = 3.
set +e +o pipefail
bash scripts/gpu/stage_piece.sh p10 >/dev/null 2>&1
source scripts/gpu/env.sh
set +e +o pipefail
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -m dspark.bench.provenance
trace() {  # CONCURRENCY COUNT OUTFILE SETTINGS
  MODEL=$G PHASES=1 FULL_WARMUP=1 COUNT=$2 SETTINGS="$4" timeout ${LIMIT:-250} \
    python3 scripts/gpu/step_trace.py "$1" 7 "" 128 "${REPEATS:-3}" > "$OUT/$3" 2>&1
  grep -E "^===|^ +(class|decode|prompt|graph)|full-batch \(|depth steps" "$OUT/$3" | cut -c1-420
}
case "$1" in
  trace)
    trace 16 "${COUNT16:-64}" trace_c16.txt "fixed:3;adaptive@3;adaptive"
    trace 1 "${COUNT1:-6}" trace_c1.txt "fixed:3;adaptive@3;adaptive" ;;
  undrafted)  # at 1 request: no speculation, adaptive held undrafted, K = 3 (PHASES)
    trace 1 "${COUNT1:-6}" trace_c1_undrafted.txt "none;adaptive@0;fixed:3" ;;
esac
