# A/B of the verifier: this checkout's against an older one, the same SmolLM2 bench,
# alternating (ab_files.sh with the one file). Here, before the GPU call:
#   git show e548dec:src/dspark/scheduling/verifier.py > .gpu/old_verifier.py
# and on the GPU machine (carry .gpu/old_verifier.py and env.sh's files):
#   source scripts/gpu/env.sh; export G OUT; bash scripts/gpu/ab_verifier.sh
# CONC (default "16 4"), ROUNDS (2) and MINREQ (the bench's --min-requests, 4) set the run.
OLD_TREE=$(mktemp -d)
mkdir -p "$OLD_TREE/src/dspark/scheduling"
cp "${OLD:-.gpu/old_verifier.py}" "$OLD_TREE/src/dspark/scheduling/verifier.py"
OLD=$OLD_TREE exec bash scripts/gpu/ab_files.sh
