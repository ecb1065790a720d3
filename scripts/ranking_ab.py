"""Sorting against binning on this machine: the budget search and the allocation's
threshold pinned each way (``survival.RANKING``) on the same realistic batches, taking
turns within every repeat; medians of 15 passes over 32 batches, µs per call. Also times
one full float64 sort of the 256 x 7 scores against one binned budget search.

    PYTHONPATH=src python scripts/ranking_ab.py
"""

import statistics
import time
import timeit

import numpy as np

import dspark.scheduling.survival as survival
from dspark.bench.scheduler import NUM_POSITIONS, h200_seed_tables, make_batch
from dspark.scheduling import allocate_drafts, choose_draft_budget
from dspark.scheduling.budget import _best_budget_binned


def main() -> None:
    tables = h200_seed_tables(1024)
    rng = np.random.default_rng(1)
    for n in (256, 1024):
        batches = [make_batch(rng, n) for _ in range(32)]
        times: dict[str, list[tuple[float, float]]] = {"sort": [], "bins": []}
        for _ in range(15):
            for mode in times:
                survival.RANKING = mode
                start = time.perf_counter_ns()
                for b in batches:
                    choose_draft_budget(b.stale, b.num_drafts, b.num_non_draft, n, tables, n * 8)
                middle = time.perf_counter_ns()
                for b in batches:
                    allocate_drafts(b.fresh, b.num_drafts, n * 3)
                end = time.perf_counter_ns()
                times[mode].append(((middle - start) / 32e3, (end - middle) / 32e3))
        for mode, samples in times.items():
            budget = statistics.median(s[0] for s in samples)
            allocate = statistics.median(s[1] for s in samples)
            print(f"{n} requests, {mode}: budget {budget:.1f} us, allocate {allocate:.1f} us")
    survival.RANKING = "measured"
    n = 256
    b = make_batch(rng, n)
    scores = survival.survival_by_position(b.stale, b.num_drafts, True).ravel()
    cap = n * NUM_POSITIONS
    costs = tables.step_costs_ms(n, n, cap)
    for name, call in (
        ("full sort of the scores", lambda: np.sort(scores)),
        ("binned budget search", lambda: _best_budget_binned(scores, cap, n, costs)),
    ):
        best = min(timeit.repeat(call, number=2000, repeat=7)) / 2000 * 1e6
        print(f"{n} x {NUM_POSITIONS}: {name} {best:.1f} us")


if __name__ == "__main__":
    main()
