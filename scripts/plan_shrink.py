"""What the plan's batch-level shrink (``verifier._shrink_batch_level``) costs per call.

    python scripts/plan_shrink.py

Survival rows of K = 7 (running products of uniform(0.5, 1) confidences) at 1, 16, 256
and 1,024 requests, shrunk with predictiveness 0.3 towards a random population; the best
of 7 runs of 3,000 calls, µs per call (a copy of the rows included).
"""

import timeit

import numpy as np

from dspark.scheduling.verifier import _shrink_batch_level


def main() -> None:
    rng = np.random.default_rng(0)
    population = np.cumprod(rng.uniform(0.5, 1.0, 7))
    for num_reqs in (1, 16, 256, 1024):
        rows = np.cumprod(rng.uniform(0.5, 1.0, (num_reqs, 7)), axis=1)
        runs = timeit.repeat(
            lambda rows=rows: _shrink_batch_level(rows.copy(), population, 0.3),
            number=3000,
            repeat=7,
        )
        print(f"{num_reqs:>5} requests: {min(runs) / 3000 * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
