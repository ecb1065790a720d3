# A/B of a set of source files: this checkout's against older versions of them, the same
# SmolLM2 bench, alternating; this checkout's files are restored at the end. Here, before
# the GPU call, put the older files under OLD at their paths in the repository, e.g.
#   mkdir -p .gpu/old/src/dspark/engine
#   git show e960159:src/dspark/engine/engine.py > .gpu/old/src/dspark/engine/engine.py
# and on the GPU machine (carry .gpu/old and env.sh's files):
#   source scripts/gpu/env.sh; export G OUT; bash scripts/gpu/ab_files.sh
# CONC (default "16 4"), ROUNDS (2), MINREQ (the bench's --min-requests, 4), LIMIT (a
# bench call's seconds, 150) and FIXED (the fixed K, 3) set the run; BENCH replaces the
# bench's model, device and prompt arguments (default: the GGUF at $G on CUDA in bf16,
# .gpu/prompts.npz, 128 tokens) and PYTHON the interpreter, e.g. on this CPU with OUT
# set: BENCH="--max-tokens 64 --requests-per-user 2" PYTHON=.venv/bin/python.
# (ab_verifier.sh: the verifier file alone.)
set +e
OLD=${OLD:-.gpu/old}
FILES=$(cd "$OLD" && find . -type f -name '*.py' | sed 's|^\./||')
[ -n "$FILES" ] || { echo "no .py files under $OLD"; exit 1; }
NEW=$(mktemp -d)
for f in $FILES; do mkdir -p "$NEW/$(dirname "$f")"; cp "$f" "$NEW/$f"; done
echo "A/B of: $FILES"
for round in $(seq ${ROUNDS:-2}); do
  for variant in new old; do
    if [ $variant = old ]; then src=$OLD; else src=$NEW; fi
    for f in $FILES; do cp "$src/$f" "$f"; done
    echo "=== $variant round $round"
    timeout ${LIMIT:-150} ${PYTHON:-python3} -m dspark.cli bench \
      ${BENCH:---model $G --device cuda --dtype bfloat16 --prompts .gpu/prompts.npz --max-tokens 128 --full-warmup} \
      --concurrency ${CONC:-16 4} --fixed ${FIXED:-3} --no-baseline \
      --min-requests ${MINREQ:-4} --repeats 1 \
      --out $OUT/ab_${variant}_$round 2>&1 | grep "adaptive\|K=[0-9]" | grep -v wrote
  done
done
for f in $FILES; do cp "$NEW/$f" "$f"; done
