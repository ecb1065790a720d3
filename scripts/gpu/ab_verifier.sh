# A/B of the verifier: this checkout's against an older one, the same SmolLM2 bench,
# alternating; the verifier file is restored at the end. Here, before the GPU call:
#   git show e548dec:src/dspark/scheduling/verifier.py > .gpu/old_verifier.py
# and on the GPU machine (carry .gpu/old_verifier.py and env.sh's files):
#   source scripts/gpu/env.sh; export G OUT; bash scripts/gpu/ab_verifier.sh
# CONC (default "16 4"), ROUNDS (2) and MINREQ (the bench's --min-requests, 4) set the run.
set +e
OLD=${OLD:-.gpu/old_verifier.py}
cp src/dspark/scheduling/verifier.py /tmp/verifier_new.py
for round in $(seq ${ROUNDS:-2}); do
  for variant in new old; do
    if [ $variant = old ]; then cp "$OLD" src/dspark/scheduling/verifier.py; else cp /tmp/verifier_new.py src/dspark/scheduling/verifier.py; fi
    echo "=== $variant round $round"
    timeout 150 python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 --prompts .gpu/prompts.npz --concurrency ${CONC:-16 4} --fixed 3 --no-baseline --min-requests ${MINREQ:-4} --max-tokens 128 --full-warmup --repeats 1 --out $OUT/ab_${variant}_$round 2>&1 | grep "adaptive\|K=3" | grep -v wrote
  done
done
cp /tmp/verifier_new.py src/dspark/scheduling/verifier.py
