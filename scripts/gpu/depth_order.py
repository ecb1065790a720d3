"""Does the order of the drafter's timed depths bias start-up profiling?

    PYTHONPATH=src python3 scripts/gpu/depth_order.py [CONCURRENCY ...]

Builds the engine ``dspark bench --shape llama3-8b`` builds (random weights, a fixed-K
engine, so nothing is profiled at start-up), then runs the profiler's dummy step
(``dspark.engine.profiling._dummy_step``: a verify forward, then the drafter's proposal at
each depth) with the depths in three rotations, and prints the median drafter ms per
(depth, position in the order). A depth that costs more when timed first is a bias of the
order, not of the depth. SHAPE=tiny DEVICE=cpu runs it here.
"""

import os
import sys
from collections import defaultdict

import numpy as np
import torch

from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.profiling import _dummy_step
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter, random_draft_model
from dspark.models.shapes import random_model


def main() -> None:
    device = os.environ.get("DEVICE", "cuda")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    loaded = random_model(os.environ.get("SHAPE", "llama3-8b"), dtype=dtype, device=device)
    draft_model = random_draft_model(loaded)
    for concurrency in [int(c) for c in sys.argv[1:]] or [1, 16]:
        config = EngineConfig(
            spec="fixed",
            num_drafts=7,
            max_num_seqs=concurrency,
            max_num_batched_tokens=max(512, concurrency * 8 + 256),
            kv_cache_tokens=max(4096, concurrency * 600),
        )
        graphs = (concurrency, loaded.config.max_position) if device == "cuda" else None
        inner = DSparkDrafter(draft_model, concurrency * 1200, config.block_size, graphs=graphs)
        drafter = ReplayDrafter(inner, AcceptanceTrace.resolve("published:chat"), seed=0)
        engine = LLMEngine(loaded, config, drafter=drafter)
        rng = np.random.default_rng(0)
        times = defaultdict(list)
        for query_len in (8, 32):
            query = np.full(concurrency, query_len)
            _dummy_step(engine, query, 128, rng, [7, 1, 4])  # capture the shapes
            for _ in range(6):
                for order in ([7, 1, 4], [1, 4, 7], [4, 7, 1]):
                    _, ms = _dummy_step(engine, query, 128, rng, order)
                    for position, depth in enumerate(order):
                        times[depth, position].append(ms[depth])
        print(f"c{concurrency}: drafter ms, median by (depth, timed n-th after the forward)")
        for depth in (1, 4, 7):
            row = [f"{np.median(times[depth, p]):6.3f}" for p in range(3)]
            print(f"  depth {depth}: " + " ".join(row))
        del engine
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
