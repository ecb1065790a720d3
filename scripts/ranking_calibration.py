"""How the sort-or-bin calibration (``survival.sorting_is_faster``) decides on this
machine, against what each way costs warm, for any source tree.

    PYTHONPATH=<tree>/src python scripts/ranking_calibration.py

Prints (1) the budget's calibration at 1,540 slots (the 256-request class) run ten times
in a row in one process, (2) the budget's and the allocation threshold's choices at
1,792 slots in ten fresh processes (True: sort / partition, False: bins), and (3) the
budget search timed warm both ways at 256 requests x 7 over 64 batches for several kinds
of confidences, median µs per search. Session 34 ran it on the tree before the
calibration changed (``git archive 8f17b59^ src``) and after it
(``docs/results/ranking_calibration_session34.txt``).
"""

import os
import subprocess
import sys
import timeit

import numpy as np

from dspark.bench.scheduler import realistic_confidences
from dspark.engine.replay import AcceptanceTrace
from dspark.scheduling import survival
from dspark.scheduling.budget import (
    _best_budget_binned,
    _binned_trial,
    _sorted_trial,
    best_in_ranked,
)
from dspark.scheduling.survival import sort_ranked, survival_by_position

NUM_REQS, K = 256, 7
CHOICES = (
    "from dspark.scheduling.budget import search_sorts\n"
    "from dspark.scheduling.survival import threshold_partitions\n"
    "print(int(search_sorts(1792)), int(threshold_partitions(1792)))"
)


def warm_search_us(confidences: list[np.ndarray]) -> tuple[float, float]:
    """Median µs of one budget search, binned and sorted, over the batches, warm."""
    full = np.full(NUM_REQS, K)
    cap = NUM_REQS * K
    costs = np.linspace(6.0, 12.0, cap + 1)
    costs[: cap // 8] = 6.0
    flat = [survival_by_position(c, full, True).ravel() for c in confidences]
    negated = [survival_by_position(c, full, True, True) for c in confidences]

    def binned():
        for scores in flat:
            _best_budget_binned(scores, cap, NUM_REQS, costs)

    def ranked():
        for scores in negated:
            best_in_ranked(sort_ranked(scores.copy()), cap, NUM_REQS, costs)

    runs = len(confidences)
    return tuple(
        float(np.median(timeit.repeat(way, number=1, repeat=11))) / runs * 1e6
        for way in (binned, ranked)
    )


def main() -> None:
    in_a_row = [
        survival._sorting_measured_faster(11, _sorted_trial, _binned_trial) for _ in range(10)
    ]
    print(f"one process, ten calibrations at 1,540 slots: sorting chosen {sum(in_a_row)} times")
    fresh = [
        subprocess.run(
            [sys.executable, "-c", CHOICES],
            capture_output=True,
            text=True,
            env=os.environ,
            check=True,
        ).stdout.split()
        for _ in range(10)
    ]
    sorts = sum(int(budget) for budget, _ in fresh)
    partitions = sum(int(threshold) for _, threshold in fresh)
    print(
        f"ten fresh processes at 1,792 slots: the budget sorted in {sorts}, the threshold "
        f"partitioned in {partitions}"
    )
    rng = np.random.default_rng(0)
    smollm2 = AcceptanceTrace.resolve(None).confidences.astype(np.float64)
    chat = AcceptanceTrace.resolve("published:chat").confidences.astype(np.float64)
    kinds = {
        "uniform(0.5, 1)": lambda: rng.uniform(0.5, 1.0, (NUM_REQS, K)),
        "uniform(0.3, 1)": lambda: rng.uniform(0.3, 1.0, (NUM_REQS, K)),
        "Beta(2, 2)": lambda: rng.beta(2.0, 2.0, (NUM_REQS, K)),
        "bench-scheduler's": lambda: realistic_confidences(rng, NUM_REQS).astype(np.float64),
        "SmolLM2 trace rows": lambda: smollm2[rng.integers(0, len(smollm2), NUM_REQS)],
        "published-chat rows": lambda: chat[rng.integers(0, len(chat), NUM_REQS)],
    }
    print("warm budget search at 256 x 7, median µs: binned / sorted")
    for name, draw in kinds.items():
        binned, ranked = warm_search_us([draw() for _ in range(64)])
        print(f"  {name:20s} {binned:6.1f} / {ranked:6.1f}")


if __name__ == "__main__":
    main()
