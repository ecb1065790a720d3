"""Survival scores and the order statistics both scheduling decisions are built on.

Layout: survival is position-major, ``[K, num_reqs]``, so that every vectorised step
runs along the long request axis and so that flattening it lists slots in
(position, request) order, the allocation's tie-break order.

Order statistics by binning. A full sort of ``K * num_reqs`` float64 scores is the slow
part of both decisions on a CPU, yet each decision only needs the exact order near one
rank. Large batches are therefore binned by value, from the top down:
``key = round((1 - score) * num_bins)``, so key 0 holds the highest scores and the key
never increases with the score (rounding is monotone). One ``bincount`` gives every bin's
count, their running totals give the rank at which each bin ends, and only the members of
the bins that matter are sorted. Members are selected by key, never by a recomputed
value bound, so a selection always holds exactly the counted slots. (Keys run from the
top so that every later array is read forwards: NumPy's accumulate and argmax are several
times slower on reversed views.)

Whether binning pays depends on the machine: NumPy sorts and partitions float64 with
SIMD (x86-simd-sort) where the CPU has AVX-512, several times faster than without, and
there ranking everything wins up to several thousand slots. So above ``SORT_MAX_SLOTS``
the choice is measured, once per size class and decision, on the first batch of that
class (``sorting_is_faster``). Both ways give the same answers.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np

SORT_MAX_SLOTS = 1024
"""Up to this many slots ranking everything beats binning, with or without AVX-512;
above it ``sorting_is_faster`` measures."""

RANKING = "measured"
"""How batches above ``SORT_MAX_SLOTS`` are ranked: ``"measured"`` (whichever is faster
on this machine), or pinned to ``"sort"`` or ``"bins"``; pinned, it applies to every size
(tests pin ``"bins"`` to exercise binning on small batches)."""

_CALIBRATION_WARMUP = 3
_CALIBRATION_ROUNDS = 9
_CALIBRATION_BLOCK = 4  # calls of one way in a row per round; the first one untimed
_SORT_MARGIN = 0.9
"""Sorting is chosen when its median is below this share of binning's: on a machine whose
speed wanders both ways can measure alike while binning is the faster one in steady
running, and the choice lasts the process; where sorting is much faster (SIMD sorts),
10% changes nothing."""

ACCUMULATE_MAX_REQS = 96
"""Up to this many requests one ``multiply.accumulate`` call is cheaper than a loop over
positions; beyond it NumPy's accumulate along the short axis is the slower of the two."""


MERGE_MIN_SLOTS = 1024
"""From this many slots a full ranking (``sort_ranked``) sorts each position's scores and
merges the K sorted runs (a stable sort finds runs and merges them) instead of sorting
every slot at once: faster from here on, no faster below. The values come out the same
either way (equal scores are interchangeable), so gains summed from them are bit for bit
the same."""


def sort_ranked(ranked: np.ndarray) -> np.ndarray:
    """Every entry of a C-contiguous ``[K, n]`` array (one row per position) in ascending
    order, as a flat array; sorts ``ranked`` in place and may return a view of it."""
    if ranked.ndim == 2 and ranked.shape[0] > 1 and ranked.size >= MERGE_MIN_SLOTS:
        ranked.sort(axis=1)  # K runs, each ascending
        flat = ranked.ravel()
        flat.sort(kind="stable")  # a merge of the runs
        return flat
    flat = ranked.ravel()
    flat.sort()
    return flat


def survival_by_position(
    confidences: np.ndarray, num_drafts: np.ndarray, is_full: bool = False, negated: bool = False
) -> np.ndarray:
    """Survival of every draft slot, ``[K, num_reqs]`` float64, unscheduled slots zero.

    Entry ``[k, r]`` is ``c[r, 0] * ... * c[r, k]`` if ``k < num_drafts[r]``, else 0. The
    running product is taken left to right, as a sequential cumprod would. ``is_full``
    says every request schedules all K drafts (nothing to zero). ``negated`` returns
    minus the survival (the first position negated before the product: rounding is
    symmetric in sign, so each entry is exactly minus the survival), ready to sort
    ascending into descending survival.
    """
    survival = confidences.T.astype(np.float64, order="C")  # [K, num_reqs]
    num_positions = survival.shape[0]
    if negated:
        np.negative(survival[0], out=survival[0])
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
    for previous, row in itertools.pairwise(survival):  # rows: [num_reqs] views
        np.multiply(previous, row, row)
    return survival


def zero_unscheduled(survival: np.ndarray, num_drafts: np.ndarray) -> None:
    """Zero, in place, the ``[K, num_reqs]`` slots at positions ``>= num_drafts``."""
    positions = np.arange(survival.shape[0])[:, None]  # [K, 1]
    np.multiply(survival, positions < num_drafts, out=survival)


def num_bins_for(num_slots: int) -> int:
    """About four slots a bin, as a power of two between 64 and 4096."""
    return 1 << min(12, max(6, (num_slots // 4).bit_length() - 1))


def bin_keys(scores: np.ndarray, num_bins: int) -> np.ndarray:
    """``round((1 - score) * num_bins)`` of scores in [0, 1]: int64 keys 0 (top) .. num_bins.

    ``num_bins`` is a power of two. No float-to-int conversion (slow without AVX-512):
    ``offset + 1 - score`` with ``offset = 2**52 / num_bins`` lies in [offset,
    2 * offset), where floats are spaced exactly ``1 / num_bins`` apart, so the
    subtraction itself rounds to the key and its bits are ``bits(offset) + key``.
    """
    offset = 2.0**52 / num_bins
    keys = np.subtract(offset + 1.0, scores).view(np.int64)
    keys -= np.float64(offset).view(np.int64)
    return keys


def scores_in_bins(scores: np.ndarray, keys: np.ndarray, low_key: int, high_key: int) -> np.ndarray:
    """A new array of the scores whose key is in ``low_key..high_key``, unordered."""
    if low_key == high_key:
        is_inside = keys == low_key
    else:
        # Keys below low_key wrap around to huge unsigned offsets: one comparison does both ends.
        is_inside = (keys - low_key).view(np.uint64) <= high_key - low_key
    # A gather by index: boolean indexing mispredicts a branch per selected slot.
    return scores.take(is_inside.nonzero()[0])


def kth_largest(scores: np.ndarray, k: int) -> float:
    """The ``k``-th largest (1-based) of scores in [0, 1]."""
    if threshold_partitions(scores.shape[0]):
        return _kth_by_partition(scores, k)
    return _kth_by_bins(scores, k)


def threshold_partitions(num_slots: int) -> bool:
    """Whether ``kth_largest`` partitions all ``num_slots`` scores (else it bins them) on
    this machine (``sorting_is_faster``)."""
    return sorting_is_faster(_KTH_SORT_WINS, num_slots, _kth_by_partition, _kth_by_bins)


def _kth_by_bins(scores: np.ndarray, k: int) -> float:
    num_slots = scores.shape[0]
    num_bins = num_bins_for(num_slots)
    keys = bin_keys(scores, num_bins)
    # Slots in each bin and every bin above it; the k-th largest lies in the first bin
    # whose running count reaches k.
    at_or_above = np.add.accumulate(np.bincount(keys, None, num_bins + 1))
    key = int(at_or_above.searchsorted(k))
    members = scores_in_bins(scores, keys, key, key)
    rank = k - (int(at_or_above[key - 1]) if key else 0)  # its rank among the members
    members.partition(members.shape[0] - rank)  # a new array: partitioned in place
    return float(members[-rank])


def _kth_by_partition(scores: np.ndarray, k: int) -> float:
    return float(np.partition(scores, scores.shape[0] - k)[scores.shape[0] - k])


_KTH_SORT_WINS: dict[int, bool] = {}


def sorting_is_faster(
    wins: dict[int, bool],
    num_slots: int,
    by_sorting: Callable[[np.ndarray, int], object],
    by_binning: Callable[[np.ndarray, int], object],
) -> bool:
    """Whether ranking all ``num_slots`` scores beats binning them, for one decision.

    ``wins`` caches the answer per size class (slot counts of one bit length); a class
    not seen yet is measured now: both ways run on the same synthetic survival scores
    of the class's middle size (K = 7 products of confidences), taking turns, each a
    few calls in a row (``_CALIBRATION_BLOCK``, the first untimed), first
    ``_CALIBRATION_WARMUP`` rounds untimed, then ``_CALIBRATION_ROUNDS``; sorting wins
    when its median is below ``_SORT_MARGIN`` of binning's. That costs a few
    milliseconds once per class. ``by_*`` take ``(scores, rank)``, the rank a third of
    the slots down, where budgets and thresholds usually sit.

    Warm, and by the median: a step runs either way thousands of times, warm. Cold, the
    one sort routine pays less for its first calls than binning's dozen array calls, and
    the fastest of a few tries favours the way whose times spread more.
    """
    if RANKING != "measured":
        return RANKING == "sort"
    if num_slots <= SORT_MAX_SLOTS:
        return True
    size_class = num_slots.bit_length()
    answer = wins.get(size_class)
    if answer is None:
        answer = wins[size_class] = _sorting_measured_faster(size_class, by_sorting, by_binning)
    return answer


def _sorting_measured_faster(size_class: int, by_sorting, by_binning) -> bool:
    num_reqs = 3 * (1 << (size_class - 2)) // 7 + 1  # the class's middle size, at K = 7
    rng = np.random.default_rng(size_class)
    times: dict[Callable, list[float]] = {by_sorting: [], by_binning: []}
    for round_ in range(_CALIBRATION_WARMUP + _CALIBRATION_ROUNDS):
        # Fresh scores every round, as every step brings: sorting the same scores again
        # runs faster (the branch predictor learns them), which would favour sorting
        # where binning is faster on the steps that follow.
        batch = [
            running_product(rng.beta(3.0, 1.5, (7, num_reqs))).ravel()
            for _ in range(_CALIBRATION_BLOCK)
        ]
        rank = batch[0].shape[0] // 3
        # Each way runs a few calls in a row, the first untimed, as a step's decisions
        # run warm one after another: single calls alternating between the two ways
        # would each find the other's code and data evicted, which slows binning's two
        # dozen array calls more than the one sort. The ways take turns going first.
        order = (by_sorting, by_binning) if round_ % 2 == 0 else (by_binning, by_sorting)
        for way in order:
            way(batch[0], rank)
            start = time.perf_counter_ns()
            for scores in batch[1:]:
                way(scores, rank)
            if round_ >= _CALIBRATION_WARMUP:
                times[way].append((time.perf_counter_ns() - start) / (len(batch) - 1))
    return statistics.median(times[by_sorting]) < _SORT_MARGIN * statistics.median(
        times[by_binning]
    )
