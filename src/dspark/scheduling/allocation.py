"""The allocation: which requests get the budget's draft slots, from fresh confidences.

The budget's slots go to the slots of highest survival over the whole batch (a global
top-``budget``). Ties go to the earlier position, then to the lower request index.
Survival never increases along a request, and ties favour earlier positions, so each
request's winners are always its first slots: the result is a draft count per request.
"""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import as_confidences, as_draft_counts, as_non_negative_int
from dspark.scheduling.survival import kth_largest, survival_by_position


def admit_top_slots(survival: np.ndarray, num_drafts: np.ndarray, budget: int) -> np.ndarray:
    """Draft counts per request for a global top-``budget`` of ``[K, num_reqs]`` survival.

    Unscheduled slots must already be zero (``survival_by_position`` does that); the
    caller guarantees ``0 < budget < num_drafts.sum()``.
    """
    flat = survival.ravel()  # position-major: slot (k, r) at k * num_reqs + r
    threshold = kth_largest(flat, budget)
    admitted = np.add.reduce(survival > threshold, axis=0)
    missing = budget - int(admitted.sum())
    if missing:
        # Slots equal to the threshold: the first `missing` in (position, request) order.
        ties = survival == threshold
        if threshold == 0.0:  # a zero could be an unscheduled slot
            ties &= np.arange(survival.shape[0])[:, None] < num_drafts
        tied = np.flatnonzero(ties.ravel())[:missing]
        admitted += np.bincount(tied % survival.shape[1], minlength=survival.shape[1])
    return admitted


def allocate_drafts(confidences: np.ndarray, num_drafts: np.ndarray, budget: int) -> np.ndarray:
    """Admitted drafts per request: the ``budget`` slots of highest survival.

    Args:
        confidences: ``[num_reqs, K]`` fresh confidences, those of the drafts being
            verified in this step.
        num_drafts: ``[num_reqs]`` drafts scheduled per request; slots at positions
            ``>= num_drafts[r]`` never win.
        budget: slots to admit, at most ``num_drafts.sum()``.

    Returns:
        int64 ``[num_reqs]``, each at most ``num_drafts[r]``, summing to ``budget``.
    """
    confidences = as_confidences("confidences", confidences)
    num_reqs, num_positions = confidences.shape
    drafts = as_draft_counts("num_drafts", num_drafts, num_reqs, num_positions)
    budget = as_non_negative_int("budget", budget)
    if budget > drafts.total:
        raise ValueError(
            f"budget must be at most the scheduled drafts ({drafts.total}), got {budget}"
        )
    if budget == drafts.total:
        return drafts.counts.astype(np.int64)
    if budget == 0:
        return np.zeros(num_reqs, dtype=np.int64)
    survival = survival_by_position(confidences, drafts.counts, drafts.is_full)
    return admit_top_slots(survival, drafts.counts, budget)
