# Session 30 GPU calls (the GGUF staged by stage_piece.sh p1 .. p6, p7 carried with the
# call): SmolLM2 + the shipped drafter, many short interleaved repeats, each run with the
# host probe and phase medians around it (``dspark bench``'s probe_ms_runs /
# phase_ms_runs), then scripts/run_modes.py on the result.
# Carry: .gpu/p7 .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256
#   bash scripts/gpu/session30.sh mid    K = 3, 4 and adaptive at 16 and 64
#   bash scripts/gpu/session30.sh ends   none, K = 3, 5 and adaptive at 1; K = 3 and
#                                        adaptive at 256
#   bash scripts/gpu/session30.sh ab     at 1: K = 3, adaptive, adaptive without the
#                                        throughput gate; at 256: K = 3, adaptive, adaptive
#                                        capturing every new shape at once (pad0) and
#                                        without the look-ahead (nola)
bash scripts/gpu/stage_piece.sh p7 >/dev/null 2>&1 || true
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -m dspark.bench.provenance
common="--model $G --device cuda --dtype bfloat16 --prompts .gpu/prompts.npz --drafter dspark
  --max-tokens 128 --full-warmup --freeze-gc"
case "$1" in
  mid)
    timeout ${LIMIT:-540} python3 -m dspark.cli bench $common --no-baseline --fixed 3 4 \
      --concurrency 16 64 --min-requests ${MINREQ:-128} --repeats ${REPEATS:-8} \
      --out "$OUT/mid" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -14
    tag=mid ;;
  ends)
    timeout ${LIMIT:-300} python3 -m dspark.cli bench $common --fixed 3 5 --concurrency 1 \
      --min-requests ${MINREQ1:-8} --repeats ${REPEATS:-5} --out "$OUT/c1" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -10
    timeout ${LIMIT256:-240} python3 -m dspark.cli bench $common --no-baseline --fixed 3 \
      --concurrency 256 --min-requests 256 --repeats ${REPEATS256:-4} --out "$OUT/c256" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -8
    tag="c1 c256" ;;
  ab)
    timeout ${LIMIT:-240} python3 -m dspark.cli bench $common --no-baseline --fixed 3 \
      --concurrency 1 --min-requests ${MINREQ1:-8} --repeats ${REPEATS:-6} \
      --variant nogate:throughput_gate=false --out "$OUT/ab1" 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tail -8
    timeout ${LIMIT256:-240} python3 -m dspark.cli bench $common --no-baseline --fixed 3 \
      --concurrency 256 --min-requests 256 --repeats ${REPEATS256:-3} \
      --variant pad0:graph_padding_budget=0 --variant nola:lookahead=off --out "$OUT/ab256" \
      2>&1 | grep -v "it/s\]\|s/it\]" | tail -10
    tag="ab1 ab256" ;;
esac
for t in $tag; do
  for f in "$OUT/$t"/profiles/*.json; do [ -f "$f" ] && mv "$f" "$OUT/$t/"; done
  rm -rf "$OUT/$t/profiles"
  [ -f "$OUT/$t/bench.json" ] && python3 scripts/run_modes.py "$OUT/$t/bench.json"
done
