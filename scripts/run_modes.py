"""Each run of a ``dspark bench`` JSON beside the host's speed around it.

    python scripts/run_modes.py bench-results/bench.json

Prints, per concurrency level and repeat, every setting's tok/s with the host probe
before and after its run (``host_probe_ms``), whether the host ran at full speed (both
probes within ``FULL_SPEED`` times the level's fastest, as ``dspark bench``'s verdicts
judge it) and the medians of its host phases (drafter, apply, forward); then adaptive
against each fixed K as the verdicts give it (``paired_ratios``: the paired ratios, and
their median over the repeats whose two runs both had the host at full speed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.bench.sweep import FULL_SPEED, fastest_probe, paired_ratios


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
                print(f"  {a['label']} / {base['label']}:{paired_ratios(a, base, fastest)}")


if __name__ == "__main__":
    main()
