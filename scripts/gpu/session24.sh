# Session 24 GPU call, after the four stage_piece.sh calls (q1..q4, the GGUF parked).
# Carry: .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256
#   bash scripts/gpu/session24.sh probe   depth_probe.py at 16 and 64 (random depths 3,4,5,
#                                         the engine's own, K = 3; two interleaved repeats),
#                                         the survival calibration on (CAL=off: off)
#   bash scripts/gpu/session24.sh b8cal   the 8B shape (acceptance REPLAYED) at 16 and 64,
#                                         K = 4 and 7 against adaptive with and without the
#                                         calibration, 3 repeats
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m dspark.bench.provenance
for mode in "$@"; do
  case "$mode" in
    probe)
      for conc in ${CONC:-16 64}; do
        MODEL=$G CAL=${CAL:-on} timeout ${LIMIT:-200} python3 scripts/gpu/depth_probe.py \
          $conc ${DEPTHS:-3,4,5} 128 ${REPEATS:-2} 2>&1 | grep -v "it/s\]\|s/it\]\|^\[transformers\]" \
          > "$OUT/depth_probe_c$conc.txt"
        tail -45 "$OUT/depth_probe_c$conc.txt"
      done
      ;;
    b8cal)
      timeout ${LIMIT8:-300} python3 -m dspark.cli bench --shape llama3-8b --device cuda \
        --dtype bfloat16 --prompts .gpu/prompts.npz --max-tokens 128 --trace published:chat \
        --full-warmup --repeats ${REPEATS8:-3} --concurrency 16 64 --fixed 4 7 \
        --min-requests 48 --no-baseline ${VARIANTS8:---variant cal:calibrate_survival=on} --out "$OUT/b8cal" 2>&1 \
        | grep -v "it/s\]\|s/it\]" | tail -16
      rm -rf "$OUT/b8cal/profiles" "$OUT/b8cal/bench.partial.json"
      ;;
  esac
done
