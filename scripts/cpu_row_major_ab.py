"""Paired, in one process: one SmolLM2 forward (plus the sampler's argmax) at a few rows,
with ``dspark.models.llama.linear`` as before 4a70bd4 (the transposed product's result
left column-major) and as now (made row-major), alternating 15 times per shape.

    PYTHONPATH=src python scripts/cpu_row_major_ab.py
"""

import time

import numpy as np
import torch
import torch.nn.functional as F

import dspark.models.llama as llama
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.kv_cache import BlockTable
from dspark.models.loader import load_model


def column_major(x, weight, bias=None):
    """``linear`` as it was: the transposed product's result left as it comes."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    plan = llama._ROW_PLAN.get(weight.shape)
    if not (2 <= rows <= llama.SKINNY_ROWS if plan is None else rows < len(plan) and plan[rows]):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, -1)
    if rows == 1:
        out = torch.mm(weight, torch.cat((flat, flat)).t())[:, :1].t()
    else:
        out = torch.mm(weight, flat.t()).t()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def main() -> None:
    loaded = load_model(None, torch.float32, "cpu")
    engine = LLMEngine(loaded, EngineConfig(spec="none", max_num_seqs=4, kv_cache_tokens=8192))
    tables = [BlockTable() for _ in range(4)]
    for table in tables:
        engine.cache.reserve(table, 400)
    row_major = llama.linear

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
                llama.linear = column_major
                before.append(forward(num_reqs, num_query))
                llama.linear = row_major
                after.append(forward(num_reqs, num_query))
            before, after = np.array(before), np.array(after)
            print(
                f"{num_reqs} requests x {num_query} tokens: column-major "
                f"{np.median(before) * 1e3:.1f} ms, row-major {np.median(after) * 1e3:.1f} ms, "
                f"paired {np.median(after / before):.3f}"
            )


if __name__ == "__main__":
    main()
