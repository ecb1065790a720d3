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
from pathlib import Path

import numpy as np
import torch
from cpu_plan_forward import forward_ms  # scripts/ is on the path when run as a script

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.models.loader import load_model


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
                rows = args.requests * query
                ms = forward_ms(engine, args.requests, args.context, rows, args.reps)
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
