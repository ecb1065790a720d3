"""Survival scores and the order statistics both scheduling decisions are built on.

Layout: survival is position-major, ``[K, num_reqs]``, so that every vectorised step
runs along the long request axis and so that flattening it lists slots in
(position, request) order, the allocation's tie-break order.

Order statistics by binning: a full sort of ``K * num_reqs`` scores is the slow part of
both decisions on a CPU (about 35 µs for 256 x 7 on two cores), so for large batches
the scores are binned by value (``floor(score * num_bins)`` with a power-of-two
``num_bins``, so bin edges are exact) and only the few bins that matter are sorted.
"""

from __future__ import annotations

import numpy as np

SORT_MAX_SLOTS = 1024
"""Up to this many slots a full sort is cheaper than binning (measured on 2 cores)."""

ACCUMULATE_MAX_REQS = 128
"""Up to this many requests one ``multiply.accumulate`` call is cheaper than a loop over
positions; beyond it NumPy's accumulate along the short axis is the slower of the two."""


def survival_by_position(
    confidences: np.ndarray, num_drafts: np.ndarray, is_full: bool = False
) -> np.ndarray:
    """Survival of every draft slot, ``[K, num_reqs]`` float64, unscheduled slots zero.

    Entry ``[k, r]`` is ``c[r, 0] * ... * c[r, k]`` if ``k < num_drafts[r]``, else 0. The
    running product is taken left to right, as a sequential cumprod would. ``is_full``
    says every request schedules all K drafts (nothing to zero).
    """
    survival = confidences.T.astype(np.float64, order="C")  # [K, num_reqs]
    num_positions = survival.shape[0]
    if not is_full:
        # A zero at the first unscheduled position zeroes every later one in the product.
        short = np.flatnonzero(num_drafts < num_positions)
        survival[num_drafts[short], short] = 0.0
    return running_product(survival)


def running_product(survival: np.ndarray) -> np.ndarray:
    """In place, along positions of a ``[K, num_reqs]`` array: entry k becomes the
    product of entries 0..k, multiplied left to right."""
    if survival.shape[1] <= ACCUMULATE_MAX_REQS:
        return np.multiply.accumulate(survival, axis=0, out=survival)
    for k in range(1, survival.shape[0]):
        np.multiply(survival[k - 1], survival[k], out=survival[k])
    return survival


def zero_unscheduled(survival: np.ndarray, num_drafts: np.ndarray) -> None:
    """Zero, in place, the ``[K, num_reqs]`` slots at positions ``>= num_drafts``."""
    positions = np.arange(survival.shape[0])[:, None]  # [K, 1]
    np.multiply(survival, positions < num_drafts, out=survival)


def num_bins_for(num_slots: int) -> int:
    """About four slots a bin, as a power of two between 64 and 4096."""
    return 1 << min(12, max(6, (num_slots // 4).bit_length() - 1))


def bin_keys(scores: np.ndarray, num_bins: int) -> np.ndarray:
    """Bin ``floor(score * num_bins)`` of scores in [0, 1]: 0 .. num_bins (score 1.0)."""
    keys = np.empty(scores.shape[0], dtype=np.intp)
    np.multiply(scores, num_bins, out=keys, casting="unsafe")
    return keys


def scores_in_bins(scores: np.ndarray, num_bins: int, low_bin: int, high_bin: int) -> np.ndarray:
    """The scores of bins ``low_bin..high_bin`` (ascending keys), selected by value.

    ``num_bins`` is a power of two, so ``key >= k`` is exactly ``score >= k / num_bins``.
    """
    return scores[(scores >= low_bin / num_bins) & (scores < (high_bin + 1) / num_bins)]


def kth_largest(scores: np.ndarray, k: int) -> float:
    """The ``k``-th largest (1-based) of scores in [0, 1]."""
    num_slots = scores.shape[0]
    if num_slots <= SORT_MAX_SLOTS:
        return float(np.partition(scores, num_slots - k)[num_slots - k])
    num_bins = num_bins_for(num_slots)
    # Counts from the top bin down; the k-th largest lies in the first bin reaching k.
    above = np.add.accumulate(np.bincount(bin_keys(scores, num_bins), minlength=num_bins + 1)[::-1])
    top = int(np.searchsorted(above, k, side="left"))
    members = scores_in_bins(scores, num_bins, num_bins - top, num_bins - top)
    rank = k - (int(above[top - 1]) if top else 0)
    return float(np.partition(members, members.shape[0] - rank)[-rank])
