"""Survival scores and the order statistics both scheduling decisions are built on.

Layout: survival is kept position-major, ``[K, num_reqs]``, so that every vectorised
operation runs along the long request axis, and so that flattening it lists slots in
(position, request) order, which is the tie-break order of the allocation.
"""

from __future__ import annotations

import numpy as np

SORT_MAX_SLOTS = 384
"""Up to this many slots a full sort is cheaper than binning (measured on 2 cores)."""


def survival_by_position(confidences: np.ndarray, num_drafts: np.ndarray) -> np.ndarray:
    """Survival of every draft slot, position-major, with unscheduled slots zeroed.

    ``confidences`` is ``[num_reqs, K]``; the result is float64 ``[K, num_reqs]`` where
    entry ``[k, r]`` is ``c[r, 0] * ... * c[r, k]`` if ``k < num_drafts[r]``, else 0.
    The running product is taken left to right, as a sequential cumprod would.
    """
    survival = confidences.T.astype(np.float64, order="C")  # [K, num_reqs]
    zero_unscheduled(survival, num_drafts)
    for k in range(1, survival.shape[0]):
        np.multiply(survival[k - 1], survival[k], out=survival[k])
    return survival


def zero_unscheduled(survival: np.ndarray, num_drafts: np.ndarray) -> None:
    """Zero, in place, the ``[K, num_reqs]`` slots at positions ``>= num_drafts``."""
    positions = np.arange(survival.shape[0])[:, None]  # [K, 1]
    np.multiply(survival, positions < num_drafts, out=survival)


def bin_keys(scores: np.ndarray, num_bins: int) -> np.ndarray:
    """Bin index ``floor(score * num_bins)`` of scores in [0, 1]: 0 .. num_bins."""
    keys = np.empty(scores.shape[0], dtype=np.intp)
    np.multiply(scores, num_bins, out=keys, casting="unsafe")
    return keys


def num_bins_for(num_slots: int) -> int:
    """About four slots a bin, as a power of two between 64 and 4096."""
    return int(min(4096, max(64, 1 << max(0, (num_slots // 4).bit_length() - 1))))


def select_bins(scores: np.ndarray, keys: np.ndarray, low_key: int, high_key: int) -> np.ndarray:
    """The scores whose bin key lies in ``[low_key, high_key]``."""
    offset = keys - low_key
    return scores[offset.view(np.uintp) <= (high_key - low_key)]
