"""A/B the scheduler benchmark between an earlier commit and the working tree.

    python scripts/commit_ab.py REV [--sizes 256 1024] [--rounds 3]

Checks REV out into a temporary git worktree and runs `bench-scheduler`'s measurement
(no torch) from each source tree in turn, ``--rounds`` times, alternating, so that the
VM's speed phases hit both alike. Prints µs per call of the budget and the allocation
and the same-run ratio to the seed port, per round and as medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = """
import json, sys
from pathlib import Path
from dspark.bench.scheduler import BenchConfig, run
sizes = tuple(int(s) for s in sys.argv[1:])
results = run(BenchConfig(sizes=sizes, torch_device=None, out_dir=Path("/tmp/commit_ab")))
print(json.dumps({r.num_reqs: [r.us["budget"], r.us["allocate"], r.us["seed_budget"],
                               r.budget_mismatches] for r in results}))
"""


def measure(src: Path, sizes: list[int]) -> dict[str, list[float]]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *map(str, sizes)],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit (e.g. HEAD~1)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.rev],
            check=True,
            capture_output=True,
        )
        try:
            runs: dict[str, list[dict]] = {args.rev: [], "working tree": []}
            for round_ in range(args.rounds):
                for name, src in ((args.rev, tree / "src"), ("working tree", ROOT / "src")):
                    result = measure(src, args.sizes)
                    runs[name].append(result)
                    for size, (budget, allocate, seed, mismatches) in result.items():
                        print(
                            f"round {round_ + 1} {name:>12} {size:>5} requests: budget "
                            f"{budget:6.1f} µs (seed port {seed / budget:.2f}x, {mismatches} "
                            f"mismatches), allocate {allocate:6.1f} µs"
                        )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
            )
    print("\nmedians over rounds (µs per call):")
    for size in map(str, args.sizes):
        for name, results in runs.items():
            budget = statistics.median(r[size][0] for r in results)
            ratio = statistics.median(r[size][2] / r[size][0] for r in results)
            allocate = statistics.median(r[size][1] for r in results)
            print(
                f"{size:>5} requests {name:>12}: budget {budget:6.1f} ({ratio:.2f}x the seed "
                f"port), allocate {allocate:6.1f}"
            )


if __name__ == "__main__":
    main()
