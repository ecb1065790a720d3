"""Losses of an adaptive run's drafted decoding steps by the mechanism that drafted them,
from ``scripts/cpu_gate_trace.py``'s decisions (measured windows, steps of 4 decoding
requests without a prompt chunk): each drafted step's wall time less what the undrafted
steps of its window take for its tokens.

    python scripts/cpu_gate_trace_summary.py OUTDIR.decisions.jsonl[.gz]
"""

import gzip
import json
import statistics
import sys
from collections import defaultdict

import numpy as np


def mechanism(record: dict) -> str:
    if record.get("pays_depth", 0) > 0:
        return "cost model, gate: " + record["gate_draft"]["reason"]
    return "declined, gate: " + record["gate_probe"]["reason"]


def main(path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as lines:
        records = [json.loads(line) for line in lines]
    steps = [
        r
        for r in records
        if r["phase"].startswith("window")
        and "final_depth" in r
        and not r["measured"]["chunk_tokens"]
        and r["num_reqs"] == 4
    ]
    by_window = defaultdict(list)
    for r in steps:
        by_window[r["phase"]].append(r)
    undrafted_rate, undrafted_forward = {}, {}
    for window, rs in by_window.items():
        undrafted = [r for r in rs if r["final_depth"] == 0]
        emitted = sum(r["measured"]["emitted"] for r in undrafted)
        undrafted_rate[window] = emitted / sum(r["measured"]["wall_ms"] for r in undrafted)
        undrafted_forward[window] = statistics.median(
            r["measured"]["forward_ms"] for r in undrafted
        )
    if not steps:
        sys.exit(f"{path}: no measured decoding step of 4 requests")
    total = sum(r["measured"]["wall_ms"] for r in steps)
    print(f"decoding steps of 4 requests: {len(steps)}, {total:.0f} ms")
    sums = defaultdict(lambda: [0, 0.0, 0.0, 0, 0])  # steps, loss, wall, emitted, drafts
    per_draft, behind = [], [0, 0.0, 0, 0.0]  # upper-bound passes: rate behind / not
    for r in steps:
        if r["final_depth"] == 0:
            continue
        m = r["measured"]
        loss = m["wall_ms"] - m["emitted"] / undrafted_rate[r["phase"]]
        kind = mechanism(r)
        row = sums[kind]
        row[0] += 1
        row[1] += loss
        row[2] += m["wall_ms"]
        row[3] += m["emitted"]
        row[4] += m["drafts"]
        per_draft.append((m["forward_ms"] - undrafted_forward[r["phase"]]) / m["drafts"])
        if kind == "cost model, gate: ucb":
            rates = r["gate_draft"]["rates"]
            i = 0 if rates[0] < rates[1] else 2
            behind[i] += 1
            behind[i + 1] += loss
    mean_rate = np.mean(list(undrafted_rate.values()))
    for kind, (n, loss, wall, emitted, drafts) in sorted(sums.items()):
        print(
            f"  {kind:34s} steps {n:3d}  loss {loss:7.1f} ms ({100 * loss / total:.1f}%)"
            f"  {emitted / wall:.4f} tokens/ms (undrafted {mean_rate:.4f}),"
            f" {drafts / n:.1f} drafts a step"
        )
    print(
        f"upper-bound passes with the drafted arm's rate behind: {behind[0]} steps,"
        f" {behind[1]:.0f} ms lost; with it ahead: {behind[2]} steps, {behind[3]:.0f} ms"
    )
    middle, mean = statistics.median(per_draft), np.mean(per_draft)
    print(
        f"forward per draft over the window's undrafted median: median {middle:.2f} ms,"
        f" mean {mean:.2f} (n={len(per_draft)})"
    )


if __name__ == "__main__":
    main(sys.argv[1])
