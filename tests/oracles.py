"""Brute-force oracles the fast scheduling code is checked against."""

from __future__ import annotations

import itertools

import numpy as np


def survival_rows(confidences: np.ndarray) -> np.ndarray:
    """[num_reqs, K] survival by a plain left-to-right running product."""
    return np.cumprod(np.asarray(confidences, dtype=np.float64), axis=1)


def budget_ratios(confidences, num_drafts, num_sampling, costs, cap) -> np.ndarray:
    """gain[b] / cost[b] for every b in 0..cap, straight from the definition."""
    survival = survival_rows(confidences)
    scores = sorted(
        (survival[r, k] for r in range(len(num_drafts)) for k in range(num_drafts[r])),
        reverse=True,
    )
    return np.array(
        [(num_sampling + sum(scores[:b])) / costs[b] for b in range(cap + 1)], dtype=np.float64
    )


def best_total_survival(confidences, num_drafts, budget) -> float:
    """Largest total survival of any per-request prefix assignment summing to budget."""
    survival = survival_rows(confidences)
    best = -1.0
    for counts in itertools.product(*(range(d + 1) for d in num_drafts)):
        if sum(counts) == budget:
            best = max(best, sum(survival[r, :c].sum() for r, c in enumerate(counts)))
    return best
