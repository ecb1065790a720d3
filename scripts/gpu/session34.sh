# Session 34 GPU calls: the 8B shape (acceptance REPLAYED from published:chat) at one
# level, fixed Ks, plain adaptive and adaptive variants interleaved in the same repeats.
# Needs only .gpu/prompts.npz (random weights, nothing to stage).
#   TAG=c16v LEVEL=16 FIXED="7" REQUESTS=48 REPEATS=3 \
#     VARIANTS="sm:overhead_slope_memory=on g0:graph_padding_budget=0" \
#     LIMIT=300 bash scripts/gpu/session34.sh
# Writes $OUT/b8_$TAG (bench.json and the log's table as log.txt; the PNG and the
# profiles are deleted: a call brings back a limited number of files). Several levels:
# separate TAGs in one call, e.g. `for ...; do TAG=... bash scripts/gpu/session34.sh; done`.
source scripts/gpu/b8_common.sh  # PYTHONPATH, OUT, $C
variants=""
for v in ${VARIANTS:-}; do variants="$variants --variant $v"; done
baseline=${BASELINE:---no-baseline}  # BASELINE=" " keeps no speculation
start=$(date +%s)
timeout ${LIMIT:-300} $C --repeats ${REPEATS:-3} --concurrency ${LEVEL:-16} --fixed ${FIXED:-7} \
  --min-requests ${REQUESTS:-48} $baseline $variants --out "$OUT/b8_$TAG" 2>&1 \
  | grep -v "it/s\]\|s/it\]" > "$OUT/b8_$TAG.log"
mv "$OUT/b8_$TAG.log" "$OUT/b8_$TAG/log.txt" 2>/dev/null || mkdir -p "$OUT/b8_$TAG"
[ -f "$OUT/b8_$TAG.log" ] && mv "$OUT/b8_$TAG.log" "$OUT/b8_$TAG/log.txt"
tail -16 "$OUT/b8_$TAG/log.txt"
echo "$TAG: $(( $(date +%s) - start )) s"
rm -rf "$OUT/b8_$TAG/profiles" "$OUT/b8_$TAG/bench.png"
[ -f "$OUT/b8_$TAG/bench.json" ] && rm -f "$OUT/b8_$TAG/bench.partial.json"
true
