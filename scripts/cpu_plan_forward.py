"""A whole target forward (and its LM head) on this CPU with one row count's product forced
to each path of ``dspark.ops.linear`` (``F.linear``, ``weight @ x.T``, packed): what a
plan's choice costs a step, the layer's other work included (the transposed product
leaves a column-major result above ``ROW_MAJOR_MAX_ROWS`` rows, which the tuning's
product-only sweeps do not see). 16 requests over 300 cached tokens by default, the
paths alternating, three rounds; medians.

    PYTHONPATH=src .venv/bin/python scripts/cpu_plan_forward.py [--rows 24 32] [--out DIR]

Session 45 (``docs/results/bench/cpu_session45_rows/``): see its README.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.kv_cache import BlockTable
from dspark.models.loader import load_model
from dspark.ops import linear as ops


def forward_ms(engine: LLMEngine, requests: int, context: int, rows: int, reps: int) -> float:
    query = np.full(requests, rows // requests)
    query[: rows % requests] += 1
    tables = [BlockTable(region=i) for i in range(requests)]
    for table, q in zip(tables, query, strict=True):
        if not engine.cache.reserve(table, context + int(q)):
            raise ValueError("the KV cache is too small; lower --requests or --context")
    tokens = np.random.default_rng(0).integers(0, 1000, int(query.sum()))
    times = []
    try:
        with torch.inference_mode():
            for _ in range(reps + 2):
                start = time.perf_counter()
                hidden, _ = engine.forward(tables, np.full(requests, context), query, tokens)
                engine.model.logits(hidden)
                times.append((time.perf_counter() - start) * 1e3)
    finally:
        for table in tables:
            engine.cache.release(table)
    return float(np.median(times[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[24, 32])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    loaded = load_model(None, dtype=torch.float32, device="cpu")
    engine = LLMEngine(loaded, EngineConfig(spec="none", max_num_seqs=args.requests))
    weights = loaded.model.linear_weights()
    tuned = {tuple(w.shape): ops.row_plan(tuple(w.shape)) for w in weights}
    if any(plan is None for plan in tuned.values()):
        raise SystemExit("the engine tuned no small-row plan here (CUDA, or small_rows off)")
    results: dict[int, dict[str, list[float]]] = {}
    try:
        for _ in range(args.rounds):
            for rows in args.rows:
                for path in ops.PATHS:
                    for shape, plan in tuned.items():
                        forced = list(plan)
                        forced[rows] = (path, rows)
                        ops._ROW_PLAN[shape] = tuple(forced)
                    ms = forward_ms(engine, args.requests, args.context, rows, args.reps)
                    results.setdefault(rows, {}).setdefault(path, []).append(ms)
    finally:
        ops._ROW_PLAN.update(tuned)
    print(f"{args.requests} requests, {args.context} cached tokens; forward ms (median)")
    print(f"{'rows':>4} " + " ".join(f"{path:>11}" for path in ops.PATHS))
    table = {}
    for rows in args.rows:
        table[rows] = {path: float(np.median(results[rows][path])) for path in ops.PATHS}
        print(f"{rows:>4} " + " ".join(f"{table[rows][p]:>11.1f}" for p in ops.PATHS))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"requests": args.requests, "context": args.context, "ms": table}
        (args.out / "plan_forward.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
