"""Paired, in one process: one SmolLM2 forward (plus the sampler's argmax) at a few rows,
with ``dspark.ops.linear.linear``'s transposed results left column-major (as before
4a70bd4: ``ROW_MAJOR_MAX_ROWS`` 0) and as now, alternating 15 times per shape.

    PYTHONPATH=src python scripts/cpu_row_major_ab.py
"""

import time

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.kv_cache import BlockTable
from dspark.models.loader import load_model
from dspark.ops import linear as llama  # the small-row products, once in models/llama.py


def main() -> None:
    loaded = load_model(None, torch.float32, "cpu")
    engine = LLMEngine(loaded, EngineConfig(spec="none", max_num_seqs=4, kv_cache_tokens=8192))
    tables = [BlockTable() for _ in range(4)]
    for table in tables:
        engine.cache.reserve(table, 400)
    row_major = llama.ROW_MAJOR_MAX_ROWS

    def forward(num_reqs: int, num_query: int, context: int = 250) -> float:
        tokens = np.arange(1000, 1000 + num_reqs * num_query, dtype=np.int64)
        start = time.perf_counter()
        hidden, _ = engine.forward(
            tables[:num_reqs], np.full(num_reqs, context), np.full(num_reqs, num_query), tokens
        )
        engine.model.logits(hidden).argmax(-1).tolist()
        return time.perf_counter() - start

    with torch.inference_mode():
        for num_reqs, num_query in ((1, 1), (1, 2), (1, 4), (4, 1), (4, 2), (4, 4)):
            for _ in range(2):
                forward(num_reqs, num_query)
            before, after = [], []
            for _ in range(15):
                llama.ROW_MAJOR_MAX_ROWS = 0  # every result left column-major
                before.append(forward(num_reqs, num_query))
                llama.ROW_MAJOR_MAX_ROWS = row_major
                after.append(forward(num_reqs, num_query))
            before, after = np.array(before), np.array(after)
            print(
                f"{num_reqs} requests x {num_query} tokens: column-major "
                f"{np.median(before) * 1e3:.1f} ms, row-major {np.median(after) * 1e3:.1f} ms, "
                f"paired {np.median(after / before):.3f}"
            )


if __name__ == "__main__":
    main()
