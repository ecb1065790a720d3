# Session 26 GPU call: the 8B shape at 256 (acceptance REPLAYED from published:chat),
# K = 5 and adaptive, one repeat a run, alternating this checkout's package with an older
# tree's ($OLD/src: git archive REV src | tar -x -C $OLD; carry it) in ORDER, every run
# under scripts/gpu/tree_steps.py: each measured step logged (depth, wall time, tokens)
# with the cost model's learnt drafter prices, in $OUT/steps_<n>_<old|new>.json.
#   OLD=.gpu/old21 ORDER="new old new old" bash scripts/gpu/session26.sh
# An ORDER entry "x" runs this checkout with the extra bench arguments in $XARGS (e.g.
# XARGS="--graph-padding-budget 0" ORDER="new x new x").
OUT=${OUT:-/tmp/out}
set +e +o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=src python3 -m dspark.bench.provenance
n=0
for v in ${ORDER:-new old new old}; do
  n=$((n + 1)); src=src; [ "$v" = old ] && src=$OLD/src
  extra=""; [ "$v" = x ] && extra="$XARGS"
  PYTHONPATH=$src timeout ${LIMIT_RUN:-150} python3 scripts/gpu/tree_steps.py \
    "$OUT/steps_${n}_$v.json" -- --shape llama3-8b --device cuda --dtype bfloat16 \
    --prompts .gpu/prompts.npz --max-tokens 128 --trace published:chat --full-warmup \
    --repeats 1 --concurrency ${CONC:-256} --fixed ${FIXED:-5} --min-requests ${MINREQ:-512} \
    --no-baseline $extra --out /tmp/ab_$n 2>&1 | grep "^ *${CONC:-256} \|concurrency ${CONC:-256}"
done
python3 scripts/gpu/tree_steps.py --summarise $OUT/steps_*.json
