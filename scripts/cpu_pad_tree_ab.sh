# Session 33: the CPU products' row padding (d2b6de7) against the tree before it
# (2a75966), one dspark bench process a tree, alternating, three pairs: 1 and 4 in flight,
# no spec, K = 3 and adaptive, two repeats each. Results as kept in
# docs/results/bench/cpu_session33_pad_ab/ (<pair>_<old|new>/bench.json).
#   bash scripts/cpu_pad_tree_ab.sh [OLD_REV]      (from the repository root)
set -e
OLD_REV=${1:-2a75966}
OUT=${OUT:-/tmp/abpad}
rm -rf /tmp/old33 && mkdir -p /tmp/old33 "$OUT"
git archive "$OLD_REV" src | tar -x -C /tmp/old33
for i in 1 2 3; do
  for v in old new; do
    src=src; [ $v = old ] && src=/tmp/old33/src
    PYTHONPATH=$src .venv/bin/python -m dspark.cli bench --concurrency 4 1 --fixed 3 --repeats 2 \
      --out "$OUT/${i}_$v" > "$OUT/${i}_$v.log" 2>&1
    echo "$i $v done $(date +%T)"
  done
done
