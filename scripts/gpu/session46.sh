# Session 46 GPU calls: the current code (sessions 44-45 changed the drafter's block pass,
# the KV cache and the CPU products since session 43's H200 figures) on both targets, with
# the drafter's block cut to each depth ("cut", `draft_block=cut`, the CPU's default and
# never run on a GPU) as the variant beside plain adaptive in the same windows. Greedy,
# time-sliced and step-logged as in session 43 (`scripts/gpu/session43.sh`, whose
# functions this reuses). Each call packs its results into one $OUT/results.tgz (a call
# brings back a limited number of files).
#   bash scripts/gpu/session46.sh b8   # the Llama-3-8B shape, acceptance REPLAYED, at 256,
#                                      # 16, 1, 4, 64 (carry .gpu/prompts.npz only)
#   bash scripts/gpu/session46.sh lo   # SmolLM2 at 1 and 4: no spec, K = 3, 4 (3 windows)
#   bash scripts/gpu/session46.sh hi   # SmolLM2 at 256 (K = 4), 64 (K = 4, 5), 16 (K = 3, 4);
#                                      # BASELINE=1 adds no speculation (each level's time
#                                      # cap x 1.3; without it the call took 239 s)
#   VARIANT=old:upkeep_in_price=false bash scripts/gpu/session46.sh b8check
#                                      # the 8B shape at 16 and 1 against the old pricing
# SmolLM2's calls need the GGUF staged (`bash scripts/gpu/split_gguf.sh`; session 46: seven
# pieces of 14 MiB, stage_piece.sh p1 .. p6 one call each) and carry .gpu/p7 .gpu/wheels
# .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256.
set +e +o pipefail
export VARIANT=${VARIANT:-cut:draft_block=cut}
OUT=${OUT:-/tmp/out}
mode=$1
case "$mode" in  # SmolLM2's calls join the staged GGUF (session31.sh's stage_model: p7)
  lo|hi) source scripts/gpu/session31.sh none; stage_model ;;
esac
source scripts/gpu/session43.sh none  # its functions: one (SmolLM2), b8 (the 8B shape)
start=$(date +%s)
case "$mode" in
  b8)
    b8 s46_c256 256 "5 7" 512 2 300 160
    b8 s46_c16 16 "7" 48 3 200 100
    b8 s46_c1 1 "7" 8 3 200 90
    b8 s46_c4 4 "7" 16 3 200 90
    b8 s46_c64 64 "5 7" 128 2 200 140 ;;
  b8check)  # after e208b89 (upkeep priced): run as VARIANT=old:upkeep_in_price=false
    b8 s46_c16_upkeep 16 "7" 48 3 200 75
    b8 s46_c1_upkeep 1 "7" 8 3 200 75 ;;
  lo)
    one s46_lo "1 4" "3 4" 3 560 ;;
  hi)  # BASELINE=1: no speculation too (not run in session 46; longer: limits x 1.3)
    nb=--no-baseline; scale=10
    [ -n "${BASELINE:-}" ] && nb= && scale=13
    one s46_256 256 4 3 $((200 * scale / 10)) $nb
    one s46_64 64 "4 5" 2 $((130 * scale / 10)) $nb
    one s46_16 16 "3 4" 3 $((200 * scale / 10)) $nb ;;
esac
echo "session46 $mode: $(( $(date +%s) - start )) s"
cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz "$OUT/" && ls -la "$OUT"
true
