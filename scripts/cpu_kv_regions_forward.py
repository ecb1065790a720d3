"""A target forward (and its LM head) with KV regions on against off, on this CPU: the
same requests, contexts and query lengths, the batch's cached keys read in place (on) or
gathered in every layer (off). Alternating, several rounds; medians.

    PYTHONPATH=src .venv/bin/python scripts/cpu_kv_regions_forward.py [--requests 16]
        [--context 600] [--queries 1 2 4] [--rounds 3] [--out DIR]

Session 45 (322c81a; ``docs/results/bench/cpu_session45_kv_regions/``): see its README.
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


def timed_forward(engine: LLMEngine, requests: int, context: int, query: int, reps: int):
    """Median ms of ``reps`` forwards (two untimed first) over ``requests`` requests whose
    blocks were reserved in turns of one block, as a running engine's decodes grow."""
    tables = [BlockTable(region=i) for i in range(requests)]
    total = context + query
    for end in range(engine.cache.block_size, total + engine.cache.block_size, 16):
        for table in tables:
            if not engine.cache.reserve(table, min(end, total)):
                raise ValueError("the KV cache is too small; lower --requests or --context")
    tokens = np.random.default_rng(0).integers(0, 1000, requests * query)
    times = []
    try:
        with torch.inference_mode():
            for _ in range(reps + 2):
                start = time.perf_counter()
                hidden, _ = engine.forward(
                    tables, np.full(requests, context), np.full(requests, query), tokens
                )
                engine.model.logits(hidden)
                times.append((time.perf_counter() - start) * 1e3)
    finally:
        for table in tables:
            engine.cache.release(table)
    return float(np.median(times[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    loaded = load_model(None, dtype=torch.float32, device="cpu")
    engines = {
        mode: LLMEngine(
            loaded,
            EngineConfig(spec="none", max_num_seqs=args.requests, kv_regions=mode),
        )
        for mode in ("off", "on")
    }
    results: dict[int, dict[str, list[float]]] = {q: {"off": [], "on": []} for q in args.queries}
    for _ in range(args.rounds):
        for query in args.queries:
            for mode, engine in engines.items():
                ms = timed_forward(engine, args.requests, args.context, query, args.reps)
                results[query][mode].append(ms)
    print(f"{args.requests} requests, {args.context} cached tokens each (ms, median of rounds)")
    print(f"{'queries':>8} {'gathered':>9} {'in place':>9} {'ratio':>6}")
    rows = []
    for query in args.queries:
        off, on = (float(np.median(results[query][m])) for m in ("off", "on"))
        rows.append({"query": query, "off_ms": off, "on_ms": on, "rounds": results[query]})
        print(f"{query:>8} {off:>9.1f} {on:>9.1f} {on / off:>6.3f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        payload = {"requests": args.requests, "context": args.context, "rows": rows}
        (out / f"forward_r{args.requests}_c{args.context}.json").write_text(
            json.dumps(payload, indent=1)
        )


if __name__ == "__main__":
    main()
