"""The draft budget: how many draft slots to verify this step, from stale confidences.

Objective (the seed's): with the scheduled slots' survival scores sorted descending and
cut to ``cap``, ``gain[b] = num_sampling + sum(scores[:b])`` expected tokens over
``cost[b]``, the step cost with ``b`` drafts; the budget is the smallest ``b``
maximising ``gain[b] / cost[b]``.

For large batches the scores are binned (see ``survival``): per-bin counts and sums give
the gain exactly at every bin boundary, and since costs never decrease, ``(gain at a
bin's end) / (cost at its start)`` bounds every budget inside the bin. Only the bins
whose bound reaches the best boundary are sorted, usually a few dozen scores around the
optimum; the answer is the same as the full sort's (up to rounding of the sums, which
only matters between budgets tied to ~1e-15).
"""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import (
    as_confidences,
    as_counts,
    as_draft_counts,
    as_non_negative_int,
)
from dspark.scheduling.cost import StepCostModel
from dspark.scheduling.survival import (
    SORT_MAX_SLOTS,
    bin_keys,
    num_bins_for,
    scores_in_bins,
    survival_by_position,
)

# Bins are sorted when their bound is within this relative distance of the best
# boundary, so that rounding in the bin sums never hides the true optimum.
_BOUND_SLACK = 1e-12


def draft_cap(num_drafts_total: int, num_reqs: int, max_total_logits: int, num_bonus: int) -> int:
    """Largest budget: the drafts scheduled, and what the logits buffer leaves room for."""
    return min(num_drafts_total, max(0, max_total_logits - num_reqs * num_bonus))


def best_budget(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    """Smallest ``b`` in ``0..cap`` maximising ``(num_sampling + top-b sum) / costs[b]``.

    ``scores`` are survival scores in [0, 1]; unscheduled slots may be present as zeros
    (they sort last and ``cap`` never reaches past the scheduled ones). ``costs`` is
    ``[cap + 1]``, positive and non-decreasing (the ``StepCostModel`` contract).
    """
    if cap == 0:
        return 0
    if scores.shape[0] <= SORT_MAX_SLOTS:
        return _best_budget_sorted(scores, cap, num_sampling, costs)
    return _best_budget_binned(scores, cap, num_sampling, costs)


def _best_budget_sorted(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    gain = np.empty(cap + 1)
    gain[0] = 0.0
    np.add.accumulate(np.sort(scores)[::-1][:cap], out=gain[1:])
    gain += num_sampling
    gain /= costs
    return int(gain.argmax())


def _best_budget_binned(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    num_bins = num_bins_for(scores.shape[0])
    keys = bin_keys(scores, num_bins)
    # Bins from the top score down: ends[j] is the rank where bin j ends, gains[j] the
    # exact top-ends[j] sum plus the sampled tokens.
    ends = np.add.accumulate(np.bincount(keys, minlength=num_bins + 1)[::-1])
    sums = np.bincount(keys, scores, num_bins + 1)
    sums[-1] += num_sampling  # the top bin's sum starts every gain
    gains = np.add.accumulate(sums[::-1])
    num_ends = num_bins + 1 if cap >= scores.shape[0] else int(np.searchsorted(ends, cap, "right"))

    end_costs = costs.take(ends[:num_ends])
    ratios = gains[:num_ends] / end_costs
    best_b, best_ratio = 0, num_sampling / costs[0]
    if num_ends:
        first = int(ratios.argmax())
        if ratios[first] > best_ratio:
            best_b, best_ratio = int(ends[first]), ratios[first]

    # Bound of bin j: gains[j] over the cost where it starts (the end of bin j - 1).
    num_open = min(num_ends + 1, num_bins + 1)
    bounds = np.empty(num_open)
    bounds[0] = gains[0] / costs[0]
    np.divide(gains[1:num_open], end_costs[: num_open - 1], out=bounds[1:])
    open_bins = np.flatnonzero(bounds >= best_ratio * (1.0 - _BOUND_SLACK))
    if open_bins.size == 0:
        return best_b
    low, high = int(open_bins[0]), int(open_bins[-1])
    low_rank = int(ends[low - 1]) if low else 0
    high_rank = min(int(ends[high]), cap)
    if high_rank <= low_rank:
        return best_b
    inside = scores_in_bins(scores, num_bins, num_bins - high, num_bins - low)
    ratios = np.add.accumulate(np.sort(inside)[::-1][: high_rank - low_rank])
    ratios += gains[low - 1] if low else num_sampling
    ratios /= costs[low_rank + 1 : high_rank + 1]
    k = int(ratios.argmax())
    if ratios[k] > best_ratio or (ratios[k] == best_ratio and low_rank + 1 + k < best_b):
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
        max_total_logits: logits the sampler verifies in one chunk; the budget plus
            ``num_bonus_tokens`` per request must fit.
        num_bonus_tokens: bonus tokens per request (1).
        context_tokens: KV tokens over the batch, for cost models that use them.
    """
    confidences = as_confidences("stale_confidences", stale_confidences)
    num_reqs, num_positions = confidences.shape
    drafts = as_draft_counts("num_drafts", num_drafts, num_reqs, num_positions)
    non_draft = as_counts("num_non_draft", num_non_draft, num_reqs)
    num_sampling = as_non_negative_int("num_sampling", num_sampling)
    if num_sampling > num_reqs:
        raise ValueError(f"num_sampling must be at most num_reqs={num_reqs}, got {num_sampling}")
    max_total_logits = as_non_negative_int("max_total_logits", max_total_logits)
    num_bonus_tokens = as_non_negative_int("num_bonus_tokens", num_bonus_tokens)

    cap = draft_cap(drafts.total, num_reqs, max_total_logits, num_bonus_tokens)
    if cap == 0:
        return 0
    costs = tables.step_costs_ms(num_reqs, int(non_draft.sum()), cap, context_tokens)
    scores = survival_by_position(confidences, drafts.counts, drafts.is_full).ravel()
    return best_budget(scores, cap, num_sampling, costs)
