# Session 47 GPU calls: the final code (the drafter's block cut to each depth by default on
# every device, f2f6b12; held-back upkeep priced, e208b89) on both targets, adaptive at
# its defaults against no speculation and the fixed K that led in session 46, with no
# variant. SmolLM2 takes no speculation at every level (session 46 ran it at 1 and 4
# only). Greedy, time-sliced and step-logged as in sessions 43 and 46. Each call packs its
# results into one $OUT/results.tgz.
#   bash scripts/gpu/session47.sh hi   # SmolLM2 at 256 (K = 4), 64 (K = 4, 5), 16 (K = 3, 4)
#   bash scripts/gpu/session47.sh lo   # SmolLM2 at 1 and 4 (K = 3, 4)
#   bash scripts/gpu/session47.sh b8   # the Llama-3-8B shape, acceptance REPLAYED, at 256,
#                                      # 16, 1, 4, 64 (carry .gpu/prompts.npz only)
# As session 47 ran them (after hi and lo; the same b8 levels in two calls, and SmolLM2
# at 64 and 256 again against the old pricing, `upkeep_in_price=false`, as a variant):
#   bash scripts/gpu/session47.sh ab64b8hi   # s47_64b, then b8 at 256 and 64 (199 s)
#   bash scripts/gpu/session47.sh b8lo       # b8 at 16, 1 and 4 (125 s)
#   bash scripts/gpu/session47.sh ab         # s47_64c, s47_256c (167 s)
#   bash scripts/gpu/session47.sh ab64d      # s47_64d, no step log (79 s)
# Not run yet (written after the lease): `settle_depth=measured` (the settled depth by the
# measured tokens per ms of earlier settled stretches) as a variant at 64, 256 and 16:
#   bash scripts/gpu/session47.sh md         # md_64, md_256, md_16 (about 300 s)
# SmolLM2's calls need the GGUF staged as in session 46 (`bash scripts/gpu/split_gguf.sh`,
# then `bash scripts/gpu/stage_piece.sh p1` .. `p6`, one call each, back to back) and carry
# .gpu/p7 .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256.
set +e +o pipefail
OUT=${OUT:-/tmp/out}
mode=$1
source scripts/gpu/session31.sh none  # its bench (SmolLM2, into $OUT/TAG), stage_model
case "$mode" in
  lo|hi|ab64b8hi|ab|ab64d|md) stage_model ;;  # the staged GGUF joined, gguf on PYTHONPATH
esac
summarise() {  # TAG: drop profiles; the step log summed against K = 4, then compressed
  rm -f "$OUT"/*/*profile*.json
  if [ -f "$OUT/$1/steps.json" ]; then
    python3 scripts/step_log.py "$OUT/$1/steps.json" K=4 > "$OUT/$1/step_log.txt" 2>&1
    gzip -f "$OUT/$1/steps.json"
  fi
}
smol() {  # TAG LEVELS FIXED REPEATS LIMIT: no speculation, fixed K, adaptive
  local tag=$1 levels=$2 fixed=$3 repeats=$4 limit=$5
  bench "$limit" "$tag" 16 128 "$repeats" --fixed $fixed --concurrency $levels \
    --slice-ms 200 --window-s 4 --step-log
  summarise "$tag"
}
ab() {  # TAG LEVEL LIMIT [more bench args]: K = 4, adaptive and a variant (AB_VARIANT;
  local tag=$1 c=$2 limit=$3; shift 3  # the old pricing by default)
  bench "$limit" "$tag" "$c" $((c > 128 ? 256 : 128)) 3 --fixed 4 --concurrency "$c" \
    --slice-ms 200 --window-s 4 --no-baseline \
    --variant "${AB_VARIANT:-old:upkeep_in_price=false}" "$@"
  summarise "$tag"
}
b8() {  # TAG LEVEL FIXED REQUESTS REPEATS SLICE LIMIT: the 8B shape, acceptance REPLAYED
  TAG=$1 LEVEL=$2 FIXED="$3" REQUESTS=$4 REPEATS=$5 VARIANTS="" \
    BASELINE="--no-baseline --slice-ms $6 --window-s 3 --step-log" LIMIT=$7 \
    bash scripts/gpu/session34.sh
  [ -f "$OUT/b8_$1/steps.json" ] && gzip -f "$OUT/b8_$1/steps.json"
}
start=$(date +%s)
case "$mode" in
  hi)
    smol s47_256 256 4 3 190
    smol s47_64 64 "4 5" 2 150
    smol s47_16 16 "3 4" 3 190 ;;
  lo)
    smol s47_lo "1 4" "3 4" 3 540 ;;
  b8)
    b8 s47_c256 256 "5 7" 512 2 300 150
    b8 s47_c16 16 "7" 48 3 200 100
    b8 s47_c1 1 "7" 8 3 200 90
    b8 s47_c4 4 "7" 16 3 200 90
    b8 s47_c64 64 "5 7" 128 2 200 130 ;;
  ab64b8hi)
    ab s47_64b 64 170 --step-log
    b8 s47_c256 256 "5 7" 512 2 300 150
    b8 s47_c64 64 "5 7" 128 2 200 130 ;;
  b8lo)
    b8 s47_c16 16 "7" 48 3 200 100
    b8 s47_c1 1 "7" 8 3 200 90
    b8 s47_c4 4 "7" 16 3 200 90 ;;
  ab)
    ab s47_64c 64 150 --step-log
    ab s47_256c 256 150 --step-log ;;
  ab64d)
    ab s47_64d 64 120 ;;
  md)
    export AB_VARIANT=md:settle_depth=measured
    ab md_64 64 150 --step-log
    ab md_256 256 150 --step-log
    ab md_16 16 130 --step-log ;;
esac
echo "session47 $mode: $(( $(date +%s) - start )) s"
cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz "$OUT/" && ls -la "$OUT"
true
