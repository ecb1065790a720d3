"""The throughput gate's cost a step at one request, across versions of ``gate.py``.

    .venv/bin/python scripts/gate_cost_ab.py [COMMIT ...]

Loads ``src/dspark/scheduling/gate.py`` as it was at each COMMIT (``git show``) and as it
is in the working tree, fills each gate's two windows (16 or 128 steps an arm) with drafted
steps of 3.5-8.5 ms (some above twice the shortest, so the outlier cap applies) and
undrafted ones of 3.2-3.5 ms, then times a decision and its record per step, the
versions taking turns within every pass. Prints the median of 9 passes of 1,000 steps.
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GATE = "src/dspark/scheduling/gate.py"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def stepper(module, window: int, tokens, walls, undrafted_walls):
    gate = module.ThroughputGate(alone_window=window)
    for i in range(window):
        gate.record(1, True, tokens[i], walls[i])
        gate.record(1, False, 1, undrafted_walls[i])
    position = [0]

    def run(steps: int) -> None:
        i = position[0]
        for _ in range(steps):
            i = (i + 1) % len(tokens)
            drafted = gate.should_draft(1)
            if drafted:
                gate.record(1, True, tokens[i], walls[i])
            else:
                gate.record(1, False, 1, undrafted_walls[i])
        position[0] = i

    return run


def main(commits: list[str]) -> None:
    rng = np.random.default_rng(0)
    count = 50_000
    tokens = rng.integers(1, 9, count).tolist()
    walls = rng.uniform(3.5, 8.5, count).tolist()
    undrafted_walls = rng.uniform(3.2, 3.5, count).tolist()
    modules = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, commit in enumerate(commits):
            source = subprocess.run(
                ["git", "show", f"{commit}:{GATE}"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            path = Path(tmp) / f"gate_{n}.py"
            path.write_bytes(source)
            modules[commit] = load(f"gate_at_{n}", path)
        modules["working tree"] = load("gate_now", ROOT / GATE)
    runs = {
        (name, window): stepper(module, window, tokens, walls, undrafted_walls)
        for name, module in modules.items()
        for window in (16, 128)
    }
    for run in runs.values():
        run(200)  # warm-up
    times: dict[tuple[str, int], list[float]] = {key: [] for key in runs}
    for _ in range(9):
        for key, run in runs.items():
            start = time.perf_counter()
            run(1000)
            times[key].append((time.perf_counter() - start) / 1000 * 1e6)
    print("µs a step (decision + record) at one request, median of 9 passes of 1,000 steps")
    for (name, window), values in times.items():
        print(f"  {name:14s} window {window:3d}: {statistics.median(values):6.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
