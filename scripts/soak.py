"""Soak ``dspark serve``: 64 streaming and non-streaming clients, half hanging up at random.

Starts ``dspark serve`` as a subprocess (or uses --url), runs --rounds rounds of
--seconds / --rounds each, prints a table per round, writes the JSON (with every
problem found: lost requests, held slots or KV blocks, RSS growth over 5% between the
last two rounds) and exits non-zero if there was one.

    PYTHONPATH=src python scripts/soak.py   # writes docs/results/server/soak.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dspark.bench.load import start_serve
from dspark.bench.soak import SoakConfig, problems, run_soak, to_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0, help="all rounds together")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--out", type=Path, default=Path("docs/results/server/soak.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if url is None:
        url = f"http://127.0.0.1:{args.port}"
        serve_args = ["--max-num-seqs", str(args.max_num_seqs), "--max-pending", "512"]
        server = start_serve(args.port, serve_args, args.out.with_suffix(".log"))
    try:
        config = SoakConfig(url, clients=args.clients, api_key=args.api_key)
        result = run_soak(config, args.rounds, args.seconds / args.rounds)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=120)
    header = "round  seconds  completed  cancelled  429  failed  tok/s  TTFT p50  p99    RSS MB"
    print(header)
    for number, report in enumerate(result["rounds"], 1):
        s = report.summary()
        print(
            f"{number:>5}  {s['seconds']:>7}  {s['completed']:>9}  {s['cancelled']:>9}  "
            f"{s['rejected_429']:>3}  {s['failed']:>6}  {s['tokens_per_s']:>5}  "
            f"{s['ttft_p50_s']:>8}  {s['ttft_p99_s']:>5}  {s['rss_mb']:>7}"
        )
    found = problems(result)
    print("problems:", *found, sep="\n  ") if found else print("no problems")
    data = {"command": " ".join(sys.argv), "clients": args.clients, **to_json(result)}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
