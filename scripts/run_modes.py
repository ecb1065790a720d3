"""Each run of a ``dspark bench`` JSON beside the host's speed around it.

    python scripts/run_modes.py bench-results/bench.json

Prints, per concurrency level and repeat, every setting's tok/s with the host probe
before and after its run (``host_probe_ms``), whether the host ran at full speed (both
probes within ``FULL_SPEED`` times the level's fastest, as ``dspark bench``'s verdicts
judge it) and the medians of its host phases (drafter, apply, forward); then adaptive
against each fixed K: the paired ratios (same repeat), and those over the repeats whose
two runs both had the host at full speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dspark.bench.sweep import FULL_SPEED, fastest_probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    args = parser.parse_args()
    rows = json.loads(args.bench_json.read_text())["rows"]
    for level in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == level and "probe_ms_runs" in r]
        fastest = fastest_probe(at)
        if not at or fastest is None:
            continue
        limit = FULL_SPEED * fastest
        print(f"== concurrency {level} (full speed: both probes <= {limit:.3f} ms)")
        for row in at:
            print(f"  {row['label']}")
            for i, (tok_s, p, phases) in enumerate(
                zip(row["tok_s_runs"], row["probe_ms_runs"], row["phase_ms_runs"], strict=True)
            ):
                speed = "full" if max(p) <= limit else "slow"
                phase = " ".join(f"{k} {v:.2f}" for k, v in phases.items())
                print(
                    f"    repeat {i}: {tok_s:9.1f} tok/s  probe {p[0]:.3f}/{p[1]:.3f} ms "
                    f"({speed})  {phase}"
                )
        for a in (r for r in at if r["spec"] == "adaptive"):
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
                line = (
                    f"  {a['label']} / {base['label']}: paired median "
                    f"{statistics.median(ratios):.3f} ({len(ratios)})"
                )
                full = [x / y for x, y, pa, pb in pairs if max(pa) <= limit and max(pb) <= limit]
                if full:
                    line += (
                        f"; host at full speed in both: {statistics.median(full):.3f} ({len(full)})"
                    )
                print(line)


if __name__ == "__main__":
    main()
