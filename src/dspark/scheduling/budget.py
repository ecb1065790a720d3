"""The draft budget: how many draft slots to verify this step, from stale confidences.

Objective (the seed's): with the scheduled slots' survival scores sorted descending and
cut to ``cap``, ``gain[b] = num_sampling + sum(scores[:b])`` expected tokens over
``cost[b]``, the step cost with ``b`` drafts; the budget is the smallest ``b``
maximising ``gain[b] / cost[b]``.

Where sorting is fast (x86 with AVX-512: see ``survival``, which measures), the scores
are sorted; above ``SEQUENTIAL_MAX_BUDGET`` the gains are then summed by blocks of ranks,
and rank by rank only in the blocks that can hold the optimum.

For large batches on machines where sorting is slow (without AVX-512: see ``survival``,
which measures), the search never sorts everything. The scores are binned by value
from the top down (see ``survival``); one bincount gives every bin's count, another its
sum, and their running totals the rank at which each bin ends and the exact gain there.
Inside a bin the gain is at most the gain at its end and the cost at least the cost
where it starts (gains grow, costs never fall), which bounds every budget in the bin.
The bin with the best bound lies next to the optimum, so the exact ratio at one of its
ends is a bar that every other bin's bound must reach to hold a better budget. The
bins that do form a range of ranks, a few dozen around the optimum at 256 x 7; their
members are gathered by key, sorted, and every budget among them is priced exactly.
The answer is the full sort's (up to rounding of the sums, which only matters between
budgets tied to ~1e-15).
"""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import (
    as_confidences,
    as_draft_counts,
    as_non_negative_int,
    count_total,
)
from dspark.scheduling.cost import VERIFY_FLOOR_MS, StepCostModel
from dspark.scheduling.survival import (
    MERGE_MIN_SLOTS,
    bin_keys,
    num_bins_for,
    scores_in_bins,
    sort_ranked,
    sorting_is_faster,
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

    ``scores`` are survival scores in [0, 1], flat or ``[num_reqs, K]`` (then a full
    ranking sorts each position's column and merges them, ``sort_ranked``); unscheduled
    slots may be present as zeros (they sort last and ``cap`` never reaches past the
    scheduled ones). ``costs`` is ``[cap + 1]``, positive and non-decreasing (the
    ``StepCostModel`` contract).
    """
    if cap == 0:
        return 0
    if search_sorts(scores.size):
        return _best_budget_sorted(scores, cap, num_sampling, costs)
    return _best_budget_binned(scores.ravel(), cap, num_sampling, costs)


def search_sorts(num_slots: int) -> bool:
    """Whether the budget search sorts all ``num_slots`` scores (else it bins them) on
    this machine: measured once per size class, see ``survival.sorting_is_faster``."""
    return sorting_is_faster(_SORT_WINS, num_slots, _sorted_trial, _binned_trial)


_SORT_WINS: dict[int, bool] = {}


def _trial_costs(num_slots: int) -> np.ndarray:
    # A cost curve with one step and a linear tail, as profiled tables look.
    costs = np.linspace(6.0, 12.0, num_slots + 1)
    costs[: num_slots // 8] = 6.0
    return costs


def _sorted_trial(scores: np.ndarray, _rank: int) -> int:
    num_slots = scores.shape[0]
    by_request = scores.reshape(7, -1).T  # the trial's scores are position-major, K = 7
    return _best_budget_sorted(by_request, num_slots, num_slots // 7, _trial_costs(num_slots))


def _binned_trial(scores: np.ndarray, _rank: int) -> int:
    num_slots = scores.shape[0]
    return _best_budget_binned(scores, num_slots, num_slots // 7, _trial_costs(num_slots))


def best_drafting_depth(
    survival: np.ndarray, verify_ms: np.ndarray, num_sampling: int, draft_ms: np.ndarray
) -> int:
    """The drafting depth whose best budget expects the most tokens per millisecond.

    ``survival`` is ``[num_reqs, K]`` (unscheduled positions zero), ``verify_ms`` the
    target's step cost with ``b`` drafts for ``b = 0..cap`` and ``draft_ms`` ``[K + 1]``
    what drafting ``d`` deep adds to it (``draft_ms[0]``: what an undrafted step adds,
    usually 0). Depth ``d`` may verify only positions ``< d``: its best plan is the top-b
    of those, at ``(num_sampling + gain) / (draft_ms[d] + verify_ms[b])``. Returns 0 when
    no plan beats ``num_sampling / (draft_ms[0] + verify_ms[0])`` (no drafter), else the
    depth of the best plan; ties go to the shallower depth.
    """
    rates = depth_rates(survival, verify_ms, num_sampling, draft_ms)
    best = int(rates.argmax())  # the first maximum: ties go to the shallower depth
    return best if rates[best] > rates[0] else 0


DEPTH_MASK_MAX_SLOTS = 512
"""Up to this many draft slots (requests x K: 73 requests at K = 7) ``depth_rates`` ranks
once under a ``[K, slots]`` mask (a dozen array calls, which on the step's path also lose
less to cold caches); beyond it, merging column by column touches less memory and wins."""


def depth_rates(
    survival: np.ndarray, verify_ms: np.ndarray, num_sampling: int, draft_ms: np.ndarray
) -> np.ndarray:
    """``[K + 1]``: the best expected tokens per millisecond at each drafting depth (index
    0: without the drafter; -inf where a depth has nothing to verify). See
    ``best_drafting_depth``.

    Small batches rank every slot once: depth ``d`` keeps those at positions ``< d`` (a
    ``[K, slots]`` mask), so its gain and rank after each kept slot are running sums
    along the mask, and its best rate the largest ratio at a kept slot within ``cap``:
    about a dozen array calls whatever K. Large ones sort each position's column once
    and merge them depth by depth (a stable sort of two sorted runs is a merge), which
    touches K times less memory. Ties in survival may rank either way: the gain at a
    rank does not depend on it.
    """
    num_reqs, k = survival.shape
    cap = verify_ms.shape[0] - 1
    rates = np.full(k + 1, -np.inf)
    rates[0] = num_sampling / max(float(verify_ms[0] + draft_ms[0]), VERIFY_FLOOR_MS)
    if cap == 0 or num_reqs == 0:
        return rates
    if survival.size <= DEPTH_MASK_MAX_SLOTS:
        rates[1:] = _depth_rates_masked(survival, verify_ms, num_sampling, draft_ms, cap)
    else:
        rates[1:] = _depth_rates_merged(survival, verify_ms, num_sampling, draft_ms, cap)
    return rates


def _depth_rates_masked(survival, verify_ms, num_sampling, draft_ms, cap) -> np.ndarray:
    k = survival.shape[1]
    flat = survival.ravel()  # request-major: slot i sits at position i % k
    order = np.argsort(flat)[::-1]  # descending survival
    kept = (order % k)[None, :] < np.arange(1, k + 1)[:, None]  # [K, slots]: depth d = row d-1
    ranks = np.cumsum(kept, axis=1)
    gains = np.cumsum(kept * flat[order], axis=1)
    gains += num_sampling
    costs = verify_ms.take(np.minimum(ranks, cap)) + draft_ms[1:, None]
    np.maximum(costs, VERIFY_FLOOR_MS, out=costs)
    gains /= costs
    gains[~kept | (ranks > cap)] = -np.inf
    return gains.max(axis=1)


def _depth_rates_merged(survival, verify_ms, num_sampling, draft_ms, cap) -> np.ndarray:
    k = survival.shape[1]
    rates = np.empty(k)
    columns = np.sort(survival, axis=0)  # ascending, per position
    ranked = columns[:, 0]
    for depth in range(1, k + 1):
        if depth > 1:
            ranked = np.sort(np.concatenate((ranked, columns[:, depth - 1])), kind="stable")
        top = ranked[::-1][:cap]
        gains = np.add.accumulate(top)
        gains += num_sampling
        gains /= np.maximum(verify_ms[1 : top.shape[0] + 1] + draft_ms[depth], VERIFY_FLOOR_MS)
        rates[depth - 1] = gains.max()
    return rates


def _best_budget_sorted(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    # Negated scores sort ascending into the descending order of the scores, so running
    # sums read forwards (several times faster than over a reversed view). Many scores
    # by request are ranked position by position, then merged (``sort_ranked``).
    if scores.ndim == 2 and scores.size >= MERGE_MIN_SLOTS:
        return best_in_ranked(
            sort_ranked(np.negative(scores.T, order="C")), cap, num_sampling, costs
        )
    ranked = np.negative(scores.ravel())
    ranked.sort()
    return best_in_ranked(ranked, cap, num_sampling, costs)


SEQUENTIAL_MAX_BUDGET = 2048
"""Up to this cap the search sums every rank in order, as the seed does (bit for bit the
seed's gains); beyond it the running sum, one dependent add per rank, is the slowest
part of the search, and it sums blocks of ranks instead (``_best_in_blocks``)."""

RANK_BLOCK = 64
_BLOCK_STARTS = np.arange(0, 1 << 22, RANK_BLOCK)  # the first rank of each block (cached)
_BLOCK_STARTS.flags.writeable = False


def best_in_ranked(ranked: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    """``best_budget`` from the negated scores sorted ascending (``-ranked[:b]`` are the
    top ``b`` scores)."""
    if cap > SEQUENTIAL_MAX_BUDGET:
        return _best_in_blocks(ranked, cap, num_sampling, costs)
    # The sum of negated terms is exactly the negated sum, and s - (-g) exactly s + g:
    # the gains are bit for bit the seed's.
    gain = np.empty(cap + 1)
    gain[0] = 0.0
    np.add.accumulate(ranked[:cap], out=gain[1:])
    np.subtract(num_sampling, gain, out=gain)
    gain /= costs
    return int(gain.argmax())


def _best_in_blocks(
    ranked: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray, block: int = RANK_BLOCK
) -> int:
    """``best_in_ranked`` by blocks of ``block`` ranks: one vectorised sum per block gives
    the gain where each block ends; the bound used for bins (that gain over the cost of
    the block's first budget) closes every block that cannot hold the optimum, and only
    the open ones are summed rank by rank. Gains round as block sums do, so only budgets
    tied to ~1e-15 may resolve differently from the seed's."""
    num_blocks = -(-cap // block)
    if block == RANK_BLOCK and num_blocks <= _BLOCK_STARTS.shape[0]:
        starts = _BLOCK_STARTS[:num_blocks]
    else:
        starts = np.arange(0, cap, block)
    gains = np.add.reduceat(ranked[:cap], starts)  # [num_blocks]: negated block sums
    np.add.accumulate(gains, out=gains)
    np.subtract(num_sampling, gains, out=gains)  # the gain where each block ends
    bounds = gains / costs[1::block]  # over the cost of each block's first budget
    best = int(bounds.argmax())
    # The better exact ratio at the best-bound block's ends is the bar (see the binned
    # search: its start wins when the optimum sits just before a step in the costs).
    zero_ratio = num_sampling / float(costs[0])
    bar = max(zero_ratio, float(gains[best]) / float(costs[min((best + 1) * block, cap)]))
    if best:
        bar = max(bar, float(gains[best - 1]) / float(costs[best * block]))
    open_blocks = (bounds >= bar * (1.0 - _BOUND_SLACK)).nonzero()[0]
    if open_blocks.shape[0] == 0:
        return 0
    low, high = int(open_blocks[0]), int(open_blocks[-1])
    low_rank, high_rank = low * block, min((high + 1) * block, cap)
    ratios = np.add.accumulate(ranked[low_rank:high_rank])
    np.subtract(float(gains[low - 1]) if low else num_sampling, ratios, out=ratios)
    ratios /= costs[low_rank + 1 : high_rank + 1]
    k = int(ratios.argmax())
    return low_rank + 1 + k if ratios[k] > zero_ratio else 0


def _best_budget_binned(scores: np.ndarray, cap: int, num_sampling: int, costs: np.ndarray) -> int:
    num_slots = scores.shape[0]
    num_bins = num_bins_for(num_slots)
    keys = bin_keys(scores, num_bins)  # 0 for the top bin
    # Bin j holds the ranks starts[j] + 1 .. starts[j + 1] of the descending order, and
    # gains[j] is the exact gain at rank starts[j + 1].
    starts = np.zeros(num_bins + 2, dtype=np.intp)
    np.add.accumulate(np.bincount(keys, None, num_bins + 1), out=starts[1:])
    sums = np.bincount(keys, scores, num_bins + 1)
    sums[0] += num_sampling  # the top bin's sum starts every gain
    gains = np.add.accumulate(sums)
    if cap < num_slots:
        # Only bins that start below cap hold budgets; the last of them may end past it.
        num_used = int(starts.searchsorted(cap))
        starts, gains = starts[: num_used + 1], gains[:num_used]
    start_costs = costs.take(starts, mode="clip")  # [num_used + 1]

    # No budget inside bin j beats bounds[j], its gain where it ends over its cost where
    # it starts (gains grow and costs never fall). The bin with the best bound lies next
    # to the optimum; the better of the exact ratios at its two ends is the bar every
    # other bin's bound must reach to be searched (its start wins when the optimum sits
    # just before a step in the costs).
    bounds = gains / start_costs[:-1]
    best = int(bounds.argmax())
    zero_ratio = num_sampling / costs[0]
    bar = max(zero_ratio, _ratio_at_ends(gains, start_costs, starts, best, cap))
    is_open = bounds >= bar * (1.0 - _BOUND_SLACK)
    open_bins = is_open.nonzero()[0]
    if open_bins.shape[0] == 0:
        return 0
    low, high = int(open_bins[0]), int(open_bins[-1])
    low_rank, high_rank = int(starts[low]), min(int(starts[high + 1]), cap)

    # Every budget in low_rank + 1 .. high_rank, priced exactly; the rest cannot win.
    inside = scores_in_bins(scores, keys, low, high)
    inside.sort()
    top = inside[::-1][: high_rank - low_rank]
    if top.shape[0] == 0:
        return 0
    top[0] += gains[low - 1] if low else num_sampling  # the gain at low_rank
    ratios = np.add.accumulate(top)  # gains at ranks low_rank + 1 .. high_rank
    ratios /= costs[low_rank + 1 : high_rank + 1]
    k = int(ratios.argmax())
    return low_rank + 1 + k if ratios[k] > zero_ratio else 0


def _ratio_at_ends(
    gains: np.ndarray, start_costs: np.ndarray, starts: np.ndarray, j: int, cap: int
) -> float:
    """The better exact ratio at the two ends of bin j (its end only if within cap)."""
    at_start = gains[j - 1] / start_costs[j] if j else 0.0
    if starts[j + 1] > cap:
        return at_start
    return max(at_start, gains[j] / start_costs[j + 1])


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
    num_tokens = count_total("num_non_draft", num_non_draft, num_reqs)
    num_sampling = as_non_negative_int("num_sampling", num_sampling)
    if num_sampling > num_reqs:
        raise ValueError(f"num_sampling must be at most num_reqs={num_reqs}, got {num_sampling}")
    max_total_logits = as_non_negative_int("max_total_logits", max_total_logits)
    num_bonus_tokens = as_non_negative_int("num_bonus_tokens", num_bonus_tokens)

    cap = draft_cap(drafts.total, num_reqs, max_total_logits, num_bonus_tokens)
    if cap == 0:
        return 0
    costs = tables.step_costs_ms(num_reqs, num_tokens, cap, context_tokens)
    num_slots = confidences.size
    if search_sorts(num_slots):
        ranked = survival_by_position(confidences, drafts.counts, drafts.is_full, True)
        return best_in_ranked(sort_ranked(ranked), cap, num_sampling, costs)
    scores = survival_by_position(confidences, drafts.counts, drafts.is_full).ravel()
    return _best_budget_binned(scores, cap, num_sampling, costs)
