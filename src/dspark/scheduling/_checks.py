"""Input checks shared by the scheduling functions.

Every check raises ``ValueError`` naming the argument and what was expected; none of
them import anything beyond NumPy. They run on every call, so each costs one or two
reductions at most.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def as_counts(name: str, values: object, length: int | None = None) -> np.ndarray:
    """A 1-D integer array of non-negative counts, optionally of a given length."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of counts, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if array.size and (array.dtype.kind != "f" or not np.array_equal(array, np.round(array))):
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
        array = array.astype(np.int64)
    if length is not None and array.shape[0] != length:
        raise ValueError(
            f"{name} must have length {length} (one per request), got {array.shape[0]}"
        )
    if array.dtype.kind == "i" and array.size and np.minimum.reduce(array) < 0:
        raise ValueError(f"{name} must be non-negative, got minimum {array.min()}")
    return array


def count_total(name: str, values: object, length: int) -> int:
    """The sum of ``length`` non-negative counts (checked as ``as_counts`` does)."""
    return int(np.add.reduce(as_counts(name, values, length)))


class DraftCounts(NamedTuple):
    """Validated per-request draft counts and what the hot paths need to know of them."""

    counts: np.ndarray  # [num_reqs], each in 0..K
    total: int
    is_full: bool  # every request schedules all K drafts


def as_draft_counts(name: str, values: object, length: int, num_positions: int) -> DraftCounts:
    """Counts in ``0..num_positions``, one per request (one histogram checks them all)."""
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        array = as_counts(name, values, length)
    elif array.shape[0] != length:
        raise ValueError(
            f"{name} must have length {length} (one per request), got {array.shape[0]}"
        )
    try:
        histogram = np.bincount(array, None, num_positions + 1)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be non-negative, got minimum {array.min()}") from None
    if histogram.shape[0] > num_positions + 1:
        raise ValueError(
            f"{name} must be at most K={num_positions} (the confidences' width), got {array.max()}"
        )
    is_full = bool(histogram[num_positions] == length)
    total = length * num_positions if is_full else int(np.add.reduce(array))
    return DraftCounts(array, total, is_full)


# For IEEE floats in [+0, 1], the bit pattern read as an unsigned integer is at most that
# of 1.0; a sign bit, NaN or anything above one reads larger. One reduction checks all.
_ONE_BITS = {
    np.dtype(np.float32): (np.uint32, np.uint32(0x3F800000)),
    np.dtype(np.float64): (np.uint64, np.uint64(0x3FF0000000000000)),
}


def as_confidences(name: str, values: object) -> np.ndarray:
    """A ``[num_reqs, K]`` float array with every entry in [0, 1] (NaN rejected)."""
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [num_reqs, K] array, got shape {array.shape}")
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    if array.size:
        bits = _ONE_BITS.get(array.dtype)
        if bits is not None and array.flags.c_contiguous:
            unsigned, one = bits
            if np.maximum.reduce(array.view(unsigned), axis=None) <= one:
                return array
        low, high = array.min(), array.max()
        # NaN fails both comparisons, so it is reported here too.
        if not (low >= 0.0 and high <= 1.0):
            raise ValueError(
                f"{name} must be probabilities in [0, 1] with no NaN, got range [{low}, {high}]"
            )
    return array


def as_non_negative_int(name: str, value: object) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return int(value)
