"""How the plan's batch-level shrink shapes budgets: scaling (``AdaptiveVerifier``) against
shifting the stale rows (its behaviour before), on rounds replayed independently.

Sixteen requests draft K = 7 each step from the published chat rounds
(``AcceptanceTrace.from_published``), so a slot's last round says nothing of its next
(predictiveness near 0). Each step's budget is planned from the stale rounds, and the
rate it gets is priced with the fresh ones (what the allocation ranks): ``(n + top-b
fresh survival) / cost[b]``, against verifying everything and against the best budget
known in hindsight. The verify cost is flat up to 48 tokens, then rises by SLOPE ms
over the next 80 (the 8B shape on an H200 at 16 requests: about 0.6).

    PYTHONPATH=src python3 scripts/shrink_sim.py [SLOPE ...]
"""

import sys
from unittest import mock

import numpy as np

from dspark.engine.replay import AcceptanceTrace
from dspark.scheduling import CostTables
from dspark.scheduling import verifier as verifier_module
from dspark.scheduling.survival import running_product


def shifted(rows: np.ndarray, population: np.ndarray, weight: float) -> None:
    """The shrink before: every row moved by the batch mean's shift, clipped to [0, 1]."""
    is_prior = rows[:, -1] == 1.0
    measured = rows[~is_prior]
    measured -= (1.0 - weight) * (measured.mean(axis=0) - population)
    rows[~is_prior] = np.clip(measured, 0.0, 1.0)


def simulate(slope: float, shrink, steps: int = 400, warm: int = 100) -> dict:
    n, k = 16, 7
    trace = AcceptanceTrace.from_published("chat")
    tokens = np.arange(n * (k + 1) + 1, dtype=np.float64)
    verify = np.where(tokens <= 48, 14.0, 14.0 + (tokens - 48) * slope / 80)
    tables = CostTables(draft_ms=np.zeros(n + 1), verify_ms=verify)
    rng = np.random.default_rng(1)
    with mock.patch.object(verifier_module, "_shrink_batch_level", shrink):
        verifier = verifier_module.AdaptiveVerifier(n, k, tables, max_total_logits=4096)
        slots = np.arange(n)
        for slot in slots:
            verifier.add_request(int(slot))
        budgets, to_full, to_best = [], [], []
        for step in range(steps):
            rounds = trace.confidences[rng.integers(0, trace.confidences.shape[0], n)]
            verifier.record(slots, rounds)
            if step < warm:
                continue
            budget = verifier.plan(slots, np.full(n, k), np.ones(n, dtype=np.int64), n)
            fresh = np.sort(running_product(rounds.T.astype(np.float64)).ravel())[::-1]
            rate = (n + np.concatenate(([0.0], np.cumsum(fresh)))) / verify[n:]
            budgets.append(budget)
            to_full.append(rate[budget] / rate[-1])
            to_best.append(rate[budget] / rate.max())
    budgets = np.array(budgets)
    return {
        "cut": float(np.mean(budgets < n * k)),
        "budget": float(budgets.mean()),
        "vs_full": float(np.mean(to_full)),
        "vs_best": float(np.mean(to_best)),
    }


def main() -> None:
    slopes = [float(s) for s in sys.argv[1:]] or [0.0, 0.2, 0.6, 1.5]
    print("slope ms | shrink | budgets cut | mean budget | rate / full verify | rate / best")
    print("---|---|---:|---:|---:|---:")
    for slope in slopes:
        for name, shrink in (
            ("shift", shifted),
            ("scale", verifier_module._shrink_batch_level),
        ):
            r = simulate(slope, shrink)
            print(
                f"{slope:g} | {name} | {r['cut']:.2f} | {r['budget']:.1f} | "
                f"{r['vs_full']:.5f} | {r['vs_best']:.5f}"
            )


if __name__ == "__main__":
    main()
