"""The draft budget: how many draft slots to verify this step, from stale confidences.

Objective (the seed's, exactly): with the valid slots' survival scores sorted
descending and cut to ``cap``, ``gain[b] = num_sampling + sum(scores[:b])`` expected
tokens and ``cost[b]`` the step cost with ``b`` drafts; the budget is the smallest
``b`` maximising ``gain[b] / cost[b]``.

A full sort is the obvious way and the slow one (about 35 µs for 256 x 7 slots on two
cores). For large batches we bin the scores instead: per-bin counts and sums give the
gain exactly at every bin boundary, and ``(gain at the bin's end) / (cost at its
start)`` bounds every budget inside a bin. Only the bins whose bound reaches the best
boundary value are sorted, usually a few dozen scores around the optimum.
"""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import (
    as_confidences,
    as_int_vector,
    check_drafts_fit,
    check_non_negative_int,
)
from dspark.scheduling.cost import StepCostModel
from dspark.scheduling.survival import (
    SORT_MAX_SLOTS,
    bin_keys,
    num_bins_for,
    select_bins,
    survival_by_position,
)

# Bins are refined when their bound is within this relative distance of the best
# boundary, so that rounding in the bin sums can never hide the true optimum.
_BOUND_SLACK = 1e-12


def draft_cap(num_drafts_total: int, num_reqs: int, max_total_logits: int, num_bonus: int) -> int:
    """Largest budget: the drafts scheduled, and what the logits buffer leaves room for."""
    return min(num_drafts_total, max(0, max_total_logits - num_reqs * num_bonus))


def best_budget(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    """Smallest ``b`` in ``0..cap`` maximising ``(num_sampling + top-b sum) / costs[b]``.

    ``scores`` are the survival scores in [0, 1] (unscheduled slots may be present as
    zeros: they sort last and ``cap`` never reaches past the scheduled ones), ``costs``
    is ``[cap + 1]`` and positive.
    """
    if cap == 0:
        return 0
    if scores.shape[0] <= SORT_MAX_SLOTS:
        return _best_budget_sorted(scores, cap, num_sampling, costs)
    return _best_budget_binned(scores, cap, num_sampling, costs)


def _best_budget_sorted(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    top = np.sort(scores)[::-1][:cap]
    gain = np.empty(cap + 1)
    gain[0] = num_sampling
    np.add(np.add.accumulate(top), num_sampling, out=gain[1:])
    return int(np.argmax(gain / costs))


def _best_budget_binned(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    num_bins = num_bins_for(scores.shape[0])
    keys = bin_keys(scores, num_bins)  # ascending; bin j from the top holds key num_bins - j
    ends = np.add.accumulate(np.bincount(keys, minlength=num_bins + 1)[::-1])  # [num_bins + 1]
    gains = np.add.accumulate(np.bincount(keys, scores, num_bins + 1)[::-1])
    # Bin boundaries are ranks where the top-b sum is known exactly: b = 0 and each end.
    num_ends = int(np.searchsorted(ends, cap, side="right"))
    numerators = gains[: num_ends + 1] + num_sampling
    end_costs = costs[ends[:num_ends]]
    end_ratios = numerators[:num_ends] / end_costs
    best_ratio, best_b = num_sampling / costs[0], 0
    if num_ends:
        first = int(end_ratios.argmax())
        if end_ratios[first] > best_ratio:
            best_ratio, best_b = end_ratios[first], int(ends[first])
    # Inside bin j every budget gains at most numerators[j] and costs at least the cost
    # at the bin's start (costs never decrease): bins whose bound cannot reach the best
    # boundary are skipped; the others are sorted.
    bounds = np.empty(numerators.shape[0])
    bounds[0] = numerators[0] / costs[0]
    np.divide(numerators[1:], end_costs[: numerators.shape[0] - 1], out=bounds[1:])
    open_bins = np.flatnonzero(bounds >= best_ratio * (1.0 - _BOUND_SLACK))
    if open_bins.size == 0:
        return best_b
    low_bin, high_bin = int(open_bins[0]), int(open_bins[-1])
    low_rank = int(ends[low_bin - 1]) if low_bin else 0
    high_rank = min(int(ends[high_bin]), cap)
    if high_rank <= low_rank:
        return best_b
    inside = select_bins(scores, keys, num_bins - high_bin, num_bins - low_bin)
    inner = np.add.accumulate(np.sort(inside)[::-1][: high_rank - low_rank])
    inner += num_sampling + (gains[low_bin - 1] if low_bin else 0.0)
    inner /= costs[low_rank + 1 : high_rank + 1]
    k = int(inner.argmax())
    if inner[k] > best_ratio or (inner[k] == best_ratio and low_rank + 1 + k < best_b):
        return low_rank + 1 + k
    return best_b


def choose_draft_budget(
    stale_confidences: np.ndarray,
    num_drafts: np.ndarray,
    num_non_draft: np.ndarray,
    num_sampling: int,
    tables: StepCostModel,
    max_total_logits: int,
    num_bonus_tokens: int = 1,
    *,
    context_tokens: int = 0,
) -> int:
    """How many draft slots this step verifies, in total over the batch.

    Args:
        stale_confidences: ``[num_reqs, K]`` confidences recorded one step earlier for
            the batch's requests, in batch order (1.0 for a request added since). Never
            the confidences of the drafts being verified now: see ``AdaptiveVerifier``.
        num_drafts: ``[num_reqs]`` drafts scheduled per request (0..K).
        num_non_draft: ``[num_reqs]`` non-draft tokens per request (1 for a decode, the
            chunk length for a prefill).
        num_sampling: requests that sample a token this step (a prefill chunk that does
            not finish its prompt samples nothing).
        tables: the step-cost model.
        max_total_logits: logits the sampler verifies in one chunk; the budget plus one
            bonus token per request must fit.
        num_bonus_tokens: bonus tokens per request (1).
        context_tokens: KV tokens over the batch, for cost models that use them.
    """
    confidences = as_confidences("stale_confidences", stale_confidences)
    num_reqs, num_positions = confidences.shape
    drafts = as_int_vector("num_drafts", num_drafts, num_reqs)
    check_drafts_fit("num_drafts", drafts, num_positions)
    non_draft = as_int_vector("num_non_draft", num_non_draft, num_reqs)
    num_sampling = check_non_negative_int("num_sampling", num_sampling)
    if num_sampling > num_reqs:
        raise ValueError(f"num_sampling must be at most num_reqs={num_reqs}, got {num_sampling}")
    max_total_logits = check_non_negative_int("max_total_logits", max_total_logits)
    num_bonus_tokens = check_non_negative_int("num_bonus_tokens", num_bonus_tokens)

    cap = draft_cap(int(drafts.sum()), num_reqs, max_total_logits, num_bonus_tokens)
    costs = tables.step_costs_ms(num_reqs, int(non_draft.sum()), cap, context_tokens)
    scores = survival_by_position(confidences, drafts).ravel()
    return best_budget(scores, cap, num_sampling, costs)
