"""Input checks shared by the scheduling functions.

Every check raises ``ValueError`` naming the argument and what was expected; none of
them import anything beyond NumPy.
"""

from __future__ import annotations

import numpy as np


def as_int_vector(name: str, values: object, length: int | None = None) -> np.ndarray:
    """A 1-D int64 array of non-negative counts, optionally of a given length."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of counts, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        if array.dtype.kind != "f" or not np.array_equal(array, np.round(array)):
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if length is not None and array.shape[0] != length:
        raise ValueError(
            f"{name} must have length {length} (one per request), got {array.shape[0]}"
        )
    if array.size and array.min() < 0:
        raise ValueError(f"{name} must be non-negative, got minimum {array.min()}")
    return array


def as_confidences(name: str, values: object) -> np.ndarray:
    """A ``[num_reqs, K]`` float array with every entry in [0, 1] (NaN rejected)."""
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [num_reqs, K] array, got shape {array.shape}")
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    if array.size:
        low, high = array.min(), array.max()
        # NaN fails both comparisons, so it is reported here too.
        if not (low >= 0.0 and high <= 1.0):
            raise ValueError(
                f"{name} must be probabilities in [0, 1] with no NaN, got range [{low}, {high}]"
            )
    return array


def check_drafts_fit(name: str, num_drafts: np.ndarray, num_positions: int) -> None:
    """Each request schedules at most ``num_positions`` drafts."""
    if num_drafts.size and num_drafts.max() > num_positions:
        raise ValueError(
            f"{name} must be at most K={num_positions} (the confidences' width), "
            f"got {num_drafts.max()}"
        )


def check_non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return int(value)
