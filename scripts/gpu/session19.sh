# Session 19 GPU calls, after the four stage_piece.sh calls (q1..q4, the GGUF parked).
# Carry: .gpu/wheels .gpu/prompts.npz .gpu/SmolLM2-135M-Instruct.Q4_1.gguf.sha256 .gpu/old
#   bash scripts/gpu/session19.sh probe   the depth drawn at random at 16 (2..5), against
#                                         the engine's own depths and K = 3
#                                         (depth_probe.py), then an A/B at 16 of this
#                                         checkout's files against those under .gpu/old
#                                         (ab_files.sh, ROUNDS rounds, 48 requests)
#   PROBE="4 1,2,3,4" bash scripts/gpu/session19.sh probe   another concurrency and depths
#   (PROBE_REPEATS, RUNS for depth_probe.py; AB_CONC, AB_ROUNDS (0: no A/B), LIMIT)
#   bash scripts/gpu/session19.sh bench   K = 3 and adaptive at 16 and 4, REPEATS (3)
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
nvidia-smi --query-gpu=name --format=csv,noheader
case "$1" in
  probe)
    set -- ${PROBE:-16 2,3,4,5}
    MODEL=$G PROMPTS=.gpu/prompts.npz timeout ${PROBE_LIMIT:-240} \
      python3 scripts/gpu/depth_probe.py $1 $2 128 ${PROBE_REPEATS:-2} 2>&1 \
      | grep -v "it/s\]\|s/it\]" | tee "$OUT/depth_probe_c$1.txt" | grep -v "^\[transformers\]"
    if [ "${AB_ROUNDS:-3}" -gt 0 ]; then
      OLD=.gpu/old CONC=${AB_CONC:-16} ROUNDS=${AB_ROUNDS:-3} MINREQ=48 LIMIT=${LIMIT:-70} \
        bash scripts/gpu/ab_files.sh 2>&1 | tee "$OUT/ab_c$(echo ${AB_CONC:-16} | tr " " _).txt"
    fi
    ;;
  bench)  # K = 3 against adaptive at 16 and 4, interleaved repeats, 48 requests
    timeout ${LIMIT:-300} python3 -m dspark.cli bench --model $G --device cuda --dtype bfloat16 \
      --prompts .gpu/prompts.npz --drafter dspark --fixed 3 --max-tokens 128 --full-warmup \
      --no-baseline --concurrency 16 4 --min-requests 48 --repeats ${REPEATS:-3} \
      --out "$OUT/c16c4" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -14
    rm -rf "$OUT/c16c4/profiles"
    ;;
esac
