"""Target step time on the GPU, eager against CUDA-graph replay: the 8B shape (random
bf16 weights), ``size`` tokens over ``min(size, 256)`` requests with 512 tokens cached each,
LM head on every row (a verify step). Median of 7 steps after a warm-up (and capture).

    PYTHONPATH=src python3 scripts/gpu/graph_step_times.py [sizes...]
"""

import json
import sys

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.profiling import _dummy_step
from dspark.models.shapes import random_model


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1, 8, 64, 256, 512, 1024, 2048]
    loaded = random_model("llama3-8b", torch.bfloat16, "cuda")
    rng = np.random.default_rng(0)
    table = {}
    for mode in ("off", "on"):
        config = EngineConfig(
            max_num_seqs=256,
            max_num_batched_tokens=2048,
            kv_cache_tokens=256 * 640,
            cuda_graphs=mode,
        )
        engine = LLMEngine(loaded, config)
        for size in sizes:
            reqs = min(size, 256)
            query = np.full(reqs, size // reqs)
            query[: size % reqs] += 1
            _dummy_step(engine, query, 512, rng, [])
            times = [_dummy_step(engine, query, 512, rng, [])[0] for _ in range(7)]
            table.setdefault(size, {})[mode] = float(np.median(times))
        del engine
        torch.cuda.empty_cache()
    print("tokens | eager ms | graph ms | eager/graph")
    for size, row in table.items():
        print(f"{size:6d} | {row['off']:8.2f} | {row['on']:8.2f} | {row['off'] / row['on']:.2f}x")
    print(json.dumps({"device": torch.cuda.get_device_name(), "context": 512, "ms": table}))


if __name__ == "__main__":
    main()
