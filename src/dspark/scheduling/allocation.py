"""The allocation: which requests get the budget's draft slots, from fresh confidences.

The budget's slots go to the slots of highest survival over the whole batch (a global
top-``budget``). Ties go to the earlier position, then to the lower request index.
Survival never increases along a request, and ties favour earlier positions, so each
request's winners are always its first slots: the result is a draft count per request.

How: the ``budget``-th largest survival is the threshold (``kth_largest``: binned, so
only one bin of scores is partitioned). Every slot at or above it counts; when slots
tie at the threshold the count exceeds the budget, and the last tied slots in
(position, request) order are dropped again. With distinct scores (the usual case) that
is one comparison and two sums.
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
    num_reqs = survival.shape[1]
    threshold = kth_largest(survival.ravel(), budget)
    if threshold == 0.0:
        return _admit_down_to_zero(survival, num_drafts, budget)
    admitted = np.add.reduce(survival >= threshold, axis=0)  # [num_reqs]
    excess = int(np.add.reduce(admitted)) - budget
    if excess:
        # Slots tied at the threshold beyond the budget: the last in (position, request)
        # order lose, which keeps every request's winners a prefix of its slots.
        tied = np.flatnonzero((survival == threshold).ravel())[-excess:]
        admitted -= np.bincount(tied % num_reqs, minlength=num_reqs)
    return admitted


def _admit_down_to_zero(survival: np.ndarray, num_drafts: np.ndarray, budget: int) -> np.ndarray:
    """The budget reaches zero survival: every positive slot wins, then the first zero
    slots in (position, request) order, skipping the unscheduled ones."""
    num_reqs = survival.shape[1]
    admitted = np.add.reduce(survival > 0.0, axis=0)
    missing = budget - int(admitted.sum())
    ties = (survival == 0.0) & (np.arange(survival.shape[0])[:, None] < num_drafts)
    tied = np.flatnonzero(ties.ravel())[:missing]
    return admitted + np.bincount(tied % num_reqs, minlength=num_reqs)


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
