"""Each run of a ``dspark bench`` JSON beside the host's speed around it.

    python scripts/run_modes.py bench-results/bench.json [--split MS]

Prints, per concurrency level and repeat, every setting's tok/s with the host probe
before and after its run (``host_probe_ms``) and the medians of its host phases
(drafter, apply, forward), then adaptive against each fixed K: the paired ratios
(same repeat), and the same ratios over the pairs whose two runs had the host at the
same speed (both probes on the same side of ``--split``, by default the middle of the
level's probes when they fall into two groups at least 15% apart), so that a
comparison can leave out pairs that a change of the host's speed split.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path


def probe(run: list[float]) -> float:
    return sum(run) / len(run)


def split_of(values: list[float]) -> float | None:
    """A threshold between two groups of probe values at least 15% apart (the widest
    gap between sorted values), else None."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return None
    gaps = [(b / a, (a + b) / 2) for a, b in itertools.pairwise(ordered) if a > 0]
    ratio, middle = max(gaps)
    return middle if ratio >= 1.15 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--split", type=float, default=None, help="probe ms between speeds")
    args = parser.parse_args()
    rows = json.loads(args.bench_json.read_text())["rows"]
    for level in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == level and "probe_ms_runs" in r]
        if not at:
            continue
        probes = [probe(p) for r in at for p in r["probe_ms_runs"]]
        split = args.split if args.split is not None else split_of(probes)
        print(f"== concurrency {level} (probe split: {split if split else 'none found'})")
        for row in at:
            print(f"  {row['label']}")
            for i, (tok_s, p, phases) in enumerate(
                zip(row["tok_s_runs"], row["probe_ms_runs"], row["phase_ms_runs"], strict=True)
            ):
                phase = " ".join(f"{k} {v:.2f}" for k, v in phases.items())
                print(
                    f"    repeat {i}: {tok_s:9.1f} tok/s  probe {p[0]:.3f}/{p[1]:.3f} ms  {phase}"
                )
        adaptive = [r for r in at if r["spec"] == "adaptive" and r["label"].startswith("adaptive")]
        for a in adaptive:
            for base in (r for r in at if r["spec"] == "fixed"):
                pairs = list(
                    zip(
                        a["tok_s_runs"],
                        base["tok_s_runs"],
                        a["probe_ms_runs"],
                        base["probe_ms_runs"],
                        strict=True,
                    )
                )
                ratios = [x / y for x, y, _, _ in pairs]
                median = statistics.median(ratios)
                line = (
                    f"  {a['label']} / {base['label']}: paired median {median:.3f} ({len(ratios)})"
                )
                if split:
                    same = [
                        x / y
                        for x, y, pa, pb in pairs
                        if (probe(pa) < split) == (probe(pb) < split)
                    ]
                    if same:
                        line += f"; same host speed: {statistics.median(same):.3f} ({len(same)})"
                print(line)


if __name__ == "__main__":
    main()
