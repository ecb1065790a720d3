# GPU call: CUDA-graph checks and timings, then the 8B-shape replay sweep with graphs
# (needs only this checkout and .gpu/prompts.npz). Concurrency levels via CONC; the
# acceptance trace via TRACE (default: the shipped SmolLM2 trace; e.g. published:chat).
set -uo pipefail
export PYTHONPATH=src
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "${CHECKS:-1}" = 1 ]; then
  timeout 150 python3 -m pytest -q -m gpu tests/engine/test_graphs.py tests/models/test_drafter.py tests/ops -p no:cacheprovider 2>&1 | tail -5 || { echo "GPU tests failed"; exit 1; }
fi
if [ "${STEPTIMES:-0}" = 1 ]; then
  timeout 150 python3 scripts/gpu/graph_step_times.py 2>&1 | tail -12
fi
timeout "${LIMIT:-360}" python3 -m dspark.cli bench --shape llama3-8b --device cuda \
  --dtype bfloat16 --prompts .gpu/prompts.npz --concurrency ${CONC:-256 64} \
  --fixed ${FIXED:-1 2 3 4 5 6 7} --max-tokens ${TOKENS:-48} --repeats ${REPEATS:-1} \
  ${TRACE:+--trace "$TRACE"} ${FULL_WARMUP:+--full-warmup} --out "$OUT/bench8b" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -40
cd "$OUT" && tar czf bench8b.tgz bench8b && rm -rf bench8b && ls -la
