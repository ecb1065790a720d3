# Every GPU figure in the README, by name, run on the GPU machine from the repository root:
#
#   bash scripts/gpu/bench.sh NAME [NAME ...]
#
#   8b-levels       Llama-3-8B shape (random weights, the published chat acceptance
#                   replayed), adaptive against the fixed K that lead, at 1, 4, 16, 64, 256
#   smollm2-levels  SmolLM2-135M-Instruct with the shipped drafter, adaptive against no
#                   speculation and the fixed K that lead, at the same levels
#   checks          the GPU tests (pytest -m gpu) and greedy speculation against greedy
#                   decoding on the real model (bf16)
#   roofline        step time by kernel class against the measured bandwidth and GEMM
#                   bound, decode and verify steps at 1, 16, 64, 256 requests: the 8B
#                   shape, then SmolLM2 (dspark roofline --trace)
#   attention       one layer's paged attention: eager gather + SDPA against the Triton
#                   kernel, SmolLM2 and 8B heads (scripts/attention_bench.py)
#   peer            SmolLM2 in dspark against transformers' generate (eager, static cache,
#                   static cache + torch.compile) at 1 and 16 requests (dspark bench-engine)
#
# VARIANT="TAG:setting=value ..." adds each as an in-run A/B against adaptive at its
# defaults (e.g. VARIANT=ng:throughput_gate=off). LEVELS="1 4" runs only those levels;
# a level or job that would run past BUDGET_S (540) seconds from the start is cut or skipped.
# Results: $OUT/NAME/cLEVEL/ (bench.json, bench.png, step_log.txt), packed into
# $OUT/results.tgz. Needs .gpu/prompts.npz (python -m dspark.train.data .gpu/prompts.npz)
# carried; SmolLM2 and checks need the GGUF staged first: bash scripts/gpu/split_gguf.sh
# here prints the calls.
set +e +o pipefail
OUT=${OUT:-/tmp/out}
source scripts/gpu/env.sh
COMMON=(--device cuda --dtype bfloat16 --prompts .gpu/prompts.npz --max-tokens 128
  --full-warmup --freeze-gc --step-log)
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-540} ))  # stay inside one call's 10 minutes
variants=()
for v in ${VARIANT:-}; do variants+=(--variant "$v"); done

level() {  # NAME LEVEL FIXED REPEATS REQUESTS SLICE_MS LIMIT [bench args...]
  local name=$1 c=$2 fixed=$3 repeats=$4 requests=$5 slice=$6 limit=$7; shift 7
  case " ${LEVELS:-1 4 16 64 256} " in *" $c "*) ;; *) return ;; esac
  local dir="$OUT/$name/c$c" start=$(date +%s)
  local left=$(( DEADLINE - start ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 45 ]; then echo "$name at $c: skipped, out of time"; return; fi
  timeout "$limit" python3 -m dspark.cli bench "${COMMON[@]}" "$@" "${variants[@]}" \
    --concurrency "$c" --fixed $fixed --repeats "$repeats" --min-requests "$requests" \
    --slice-ms "$slice" --out "$dir" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -6
  echo "$name at $c: $(( $(date +%s) - start )) s"
  if [ -f "$dir/steps.json" ]; then
    python3 scripts/step_log.py "$dir/steps.json" > "$dir/step_log.txt" 2>&1
    gzip -f "$dir/steps.json"
  fi
  rm -rf "$dir/profiles" "$dir/bench.partial.json"
}

within() {  # LIMIT: the seconds a job may take before DEADLINE (fails under 45)
  local left=$(( DEADLINE - $(date +%s) ))
  [ "$left" -lt "$1" ] && set -- "$left"
  [ "$1" -ge 45 ] && echo "$1"
}

for name in "$@"; do
  case "$name" in
    8b-levels)
      b8=(--shape llama3-8b --trace published:chat --no-baseline --window-s 3)
      level "$name" 1 7 3 8 200 120 "${b8[@]}"
      level "$name" 4 7 3 16 200 120 "${b8[@]}"
      level "$name" 16 7 3 48 200 130 "${b8[@]}"
      level "$name" 64 "5 7" 2 128 200 150 "${b8[@]}"
      # three 8B engines side by side need more than an 80 GB card: one at a time there
      mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
      level "$name" 256 "5 7" 2 512 $(( mib > 100000 ? 300 : 0 )) 200 "${b8[@]}" ;;
    smollm2-levels)
      [ -f "$G" ] || { echo "no staged GGUF at $G (scripts/gpu/split_gguf.sh)"; continue; }
      smol=(--model "$G" --drafter dspark --window-s 4)
      level "$name" 1 "3 4" 3 8 200 150 "${smol[@]}"
      level "$name" 4 "3 4" 3 16 200 150 "${smol[@]}"
      level "$name" 16 "3 4" 3 128 200 150 "${smol[@]}"
      level "$name" 64 "4 5" 2 128 200 150 "${smol[@]}"
      level "$name" 256 4 3 256 200 170 "${smol[@]}" ;;
    checks)
      mkdir -p "$OUT/checks"
      t=$(within 240) || { echo "checks: skipped, out of time"; continue; }
      timeout "$t" python3 -m pytest -q -m gpu tests 2>&1 | tail -5 | tee "$OUT/checks/pytest.txt"
      if [ -f "$G" ] && t=$(within 200); then
        timeout "$t" python3 scripts/gpu_engine_check.py --model "$G" --dtype bfloat16 \
          --num-prompts 32 2>&1 | tail -5 | tee "$OUT/checks/greedy_bf16.txt"
      fi ;;
    roofline)
      mkdir -p "$OUT/roofline"
      t=$(within 240) || { echo "roofline: skipped, out of time"; continue; }
      timeout "$t" python3 -m dspark.cli roofline --shape llama3-8b --device cuda --trace \
        --out-dir "$OUT/roofline" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -24
      if [ -f "$G" ] && t=$(within 150); then
        timeout "$t" python3 -m dspark.cli roofline --model "$G" --device cuda --trace \
          --out-dir "$OUT/roofline" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -24
      fi ;;
    attention)
      t=$(within 240) || { echo "attention: skipped, out of time"; continue; }
      timeout "$t" python3 scripts/attention_bench.py --out "$OUT/attention" 2>&1 \
        | grep -v "it/s\]\|s/it\]" | tail -40 ;;
    peer)
      [ -f "$G" ] || { echo "no staged GGUF at $G (scripts/gpu/split_gguf.sh)"; continue; }
      t=$(within 400) || { echo "peer: skipped, out of time"; continue; }
      timeout "$t" python3 -m dspark.cli bench-engine --model "$G" --device cuda \
        --dtype bfloat16 --prompts .gpu/prompts.npz --concurrency 1 16 --max-tokens 128 --repeats 3 \
        --hf eager static compiled --out-dir "$OUT/peer" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -16 ;;
    *) echo "unknown name $name (8b-levels, smollm2-levels, checks, roofline, attention, peer)" ;;
  esac
done
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/device.txt"
cd "$OUT" && tar czf /tmp/results.tgz --exclude=results.tgz . && mv /tmp/results.tgz "$OUT/"
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name device.txt -exec rm -rf {} +
cat "$OUT/device.txt"
true
