import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dspark.bench.seed_port import SeedRequestTable, seed_budget
from dspark.scheduling import budget as budget_module
from dspark.scheduling import build_cost_tables, choose_draft_budget
from dspark.scheduling.budget import (
    _best_budget_binned,
    _best_budget_sorted,
    _best_in_blocks,
    best_in_ranked,
)
from dspark.scheduling.survival import survival_by_position
from tests.oracles import budget_ratios


class LinearCost:
    """cost[b] = fixed + per_token * (num_tokens + b): a transparent test cost model."""

    def __init__(self, fixed: float, per_token: float) -> None:
        self.fixed, self.per_token = fixed, per_token

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return self.fixed + self.per_token * (num_tokens + np.arange(max_drafts + 1.0))


def budget(conf, drafts, non_draft, sampling, cost, logits=10_000):
    return choose_draft_budget(
        np.array(conf, dtype=np.float64), drafts, non_draft, sampling, cost, logits
    )


def test_idle_gpu_verifies_everything():
    # Drafts are free: every draft with positive survival raises the gain.
    assert budget([[0.5, 0.5], [0.1, 0.9]], [2, 2], [1, 1], 2, LinearCost(10.0, 0.0)) == 4


def test_only_the_marginal_draft_that_pays_is_admitted():
    # cost = 2 + 1 per draft; gain = 2 + survival. Scores 0.9, 0.5, 0.1:
    # b=0: 2/2 = 1.0; b=1: 2.9/3 = 0.967 ... no draft pays at this price.
    assert budget([[0.9, 0.5 / 0.9], [0.1, 1.0]], [2, 1], [1, 1], 2, LinearCost(0.0, 1.0)) == 0
    # Cheaper drafts (cost = 2 + 0.4 b): b=1: 2.9/2.4 = 1.208, b=2: 3.4/2.8 = 1.214,
    # b=3: 3.5/3.2 = 1.094. The second draft (0.5) still pays, the third (0.1) does not.
    cost = LinearCost(2.0 - 0.4 * 2, 0.4)
    assert budget([[0.9, 0.5 / 0.9], [0.1, 1.0]], [2, 1], [1, 1], 2, cost) == 2


def test_prefill_chunk_that_samples_nothing_lowers_the_base_gain():
    conf = [[0.2], [1.0]]
    cost = LinearCost(0.0, 1.0)  # request 1 is a 7-token prompt chunk: T = 8
    # Both sample: 2/8 = 0.250 beats 2.2/9 = 0.244, so the draft does not pay.
    assert budget(conf, [1, 0], [1, 7], 2, cost) == 0
    # The chunk does not finish its prompt and samples nothing: 1/8 = 0.125 loses to
    # 1.2/9 = 0.133, and the same draft is now worth verifying.
    assert budget(conf, [1, 0], [1, 7], 1, cost) == 1


def test_logits_cap_limits_the_budget():
    conf = np.ones((3, 4))
    # 3 requests x 1 bonus logit leave room for 5 draft logits out of 12 drafts.
    assert budget(conf, [4, 4, 4], [1, 1, 1], 3, LinearCost(1.0, 0.0), logits=8) == 5
    assert budget(conf, [4, 4, 4], [1, 1, 1], 3, LinearCost(1.0, 0.0), logits=2) == 0


def test_zero_budget_when_no_drafts_are_scheduled():
    assert budget(np.ones((2, 3)), [0, 0], [1, 1], 2, LinearCost(1.0, 0.0)) == 0


def test_ties_pick_the_smallest_budget():
    # Zero survival adds no gain, and a flat cost makes every b tie: b = 0.
    assert budget([[0.0, 0.0]], [2], [1], 1, LinearCost(1.0, 0.0)) == 0


def test_seed_tables_price_the_step():
    tables = build_cost_tables([(1, 1.0), (4, 1.0)], [(1, 2.0), (8, 2.0), (16, 20.0)], 4, 16, 8)
    # Up to 8 tokens a step costs 2.0 ms (graph padding), beyond that it jumps.
    conf = np.full((4, 3), 0.9)
    assert budget(conf, [3, 3, 3, 3], [1, 1, 1, 1], 4, tables) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stale_confidences": np.array([[1.5, 0.2]])}, "stale_confidences.*\\[0, 1\\]"),
        ({"stale_confidences": np.array([[np.nan, 0.2]])}, "no NaN"),
        ({"stale_confidences": np.array([0.5, 0.2])}, "2-D"),
        ({"num_drafts": [3]}, "at most K=2"),
        ({"num_drafts": [1, 1]}, "num_drafts must have length 1"),
        ({"num_drafts": [-1]}, "non-negative"),
        ({"num_non_draft": [1, 2]}, "num_non_draft must have length 1"),
        ({"num_sampling": 2}, "num_sampling must be at most"),
        ({"max_total_logits": -1}, "max_total_logits"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(kwargs, message):
    args = {
        "stale_confidences": np.array([[0.5, 0.5]]),
        "num_drafts": [2],
        "num_non_draft": [1],
        "num_sampling": 1,
        "tables": LinearCost(1.0, 0.1),
        "max_total_logits": 100,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        choose_draft_budget(**args)


@st.composite
def batches(draw, max_reqs=6, max_k=5):
    num_reqs = draw(st.integers(1, max_reqs))
    k = draw(st.integers(1, max_k))
    # Coarse grids produce exact ties; floats produce generic cases.
    values = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0, 1))
    conf = draw(hnp.arrays(np.float64, (num_reqs, k), elements=values))
    drafts = draw(hnp.arrays(np.int64, num_reqs, elements=st.integers(0, k)))
    non_draft = draw(hnp.arrays(np.int64, num_reqs, elements=st.integers(1, 4)))
    sampling = draw(st.integers(0, num_reqs))
    fixed = draw(st.floats(0.01, 10))
    per_token = draw(st.floats(0, 2))
    step = draw(st.integers(1, 8))  # graph-like padding: cost rises every `step` tokens
    logits = draw(st.integers(0, 60))
    return conf, drafts, non_draft, sampling, fixed, per_token, step, logits


class PaddedCost:
    def __init__(self, fixed, per_token, step):
        self.fixed, self.per_token, self.step = fixed, per_token, step

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        tokens = num_tokens + np.arange(max_drafts + 1)
        padded = -(-tokens // self.step) * self.step
        return self.fixed + self.per_token * padded


def assert_smallest_best_budget(chosen, conf, drafts, sampling, costs, cap):
    """``chosen`` maximises gain / cost over every b in 0..cap (brute force), and no
    smaller b does as well (up to rounding in the sums)."""
    ratios = budget_ratios(conf, drafts, sampling, costs, cap)
    best = ratios.max()
    assert 0 <= chosen <= cap
    assert ratios[chosen] >= best * (1 - 1e-12)
    assert not (ratios[:chosen] >= best * (1 + 1e-12)).any()
    assert not (ratios[:chosen] > ratios[chosen] * (1 + 1e-12)).any()


def small_case(batch):
    """(conf, drafts, sampling, cap, costs) of a drawn batch, or None when nothing can be
    drafted."""
    conf, drafts, non_draft, sampling, fixed, per_token, step, logits = batch
    cap = min(int(drafts.sum()), max(0, logits - len(drafts)))
    if cap == 0:
        return None
    costs = PaddedCost(fixed, per_token, step).step_costs_ms(len(drafts), int(non_draft.sum()), cap)
    return conf, drafts, sampling, cap, costs


@settings(max_examples=400, deadline=None)
@given(batches())
def test_budget_maximises_gain_over_cost_against_brute_force(batch):
    conf, drafts, non_draft, sampling, fixed, per_token, step, logits = batch
    cost = PaddedCost(fixed, per_token, step)
    chosen = choose_draft_budget(conf, drafts, non_draft, sampling, cost, logits)
    cap = min(int(drafts.sum()), max(0, logits - len(drafts)))
    costs = cost.step_costs_ms(len(drafts), int(non_draft.sum()), cap)
    assert_smallest_best_budget(chosen, conf, drafts, sampling, costs, cap)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(60, 400),
    st.integers(1, 8),
    st.floats(0.2, 0.99),
    st.floats(0.0, 0.3),
    st.integers(0, 2**32 - 1),
    st.sampled_from([1, 8, 64]),
)
def test_binned_search_equals_full_sort_on_large_batches(num_reqs, k, mean, spread, seed, step):
    rng = np.random.default_rng(seed)
    conf = np.clip(rng.normal(mean, spread, (num_reqs, k)), 0, 1)
    conf[rng.random(conf.shape) < 0.05] = 1.0  # new requests: exact ties at 1.0
    drafts = rng.integers(0, k + 1, num_reqs)
    scores = survival_by_position(conf, drafts).ravel()
    cap = int(drafts.sum())
    costs = PaddedCost(rng.uniform(0.1, 20), rng.uniform(0.001, 0.1), step).step_costs_ms(
        num_reqs, num_reqs, cap
    )
    sampling = int(rng.integers(0, num_reqs + 1))
    assert _best_budget_binned(scores, cap, sampling, costs) == _best_budget_sorted(
        scores, cap, sampling, costs
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 600), st.integers(0, 2**32 - 1))
def test_same_decisions_as_the_seed_on_seed_tables(num_reqs, seed):
    rng = np.random.default_rng(seed)
    k = 7
    tables = build_cost_tables(
        [(1, 0.7), (8, 0.8), (64, 3.7), (256, 13.6)],
        [(1, 5.0), (8, 5.4), (64, 9.0), (256, 17.0), (512, 31.0), (768, 45.0), (8192, 400.0)],
        1024,
        8192,
        cudagraph_limit=512,
    )
    conf = rng.beta(6, 1.5, (num_reqs, k)).astype(np.float32)
    drafts = rng.integers(0, k + 1, num_reqs)
    computed = rng.integers(0, 50, num_reqs)
    prompt = rng.integers(1, 50, num_reqs)
    non_draft = np.where(computed >= prompt, 1, np.minimum(prompt - computed, 8))
    sampling = int(np.count_nonzero(computed + non_draft >= prompt))
    logits = int(rng.integers(num_reqs, 9 * num_reqs))
    ids = [f"req-{i}" for i in range(num_reqs)]
    table = SeedRequestTable({r: i for i, r in enumerate(ids)}, computed, prompt, conf)
    seed_choice = seed_budget(
        table,
        {r: int(non_draft[i] + drafts[i]) for i, r in enumerate(ids)},
        {r: [0] * int(drafts[i]) for i, r in enumerate(ids)},
        tables.draft_ms,
        tables.verify_ms,
        logits,
    )
    ours = choose_draft_budget(conf, drafts, non_draft, sampling, tables, logits)
    assert ours == seed_choice


@pytest.mark.parametrize("num_bins", [1, 2, 4, 64])
@settings(max_examples=150, deadline=None)
@given(batch=batches(max_reqs=12, max_k=6))
def test_binned_search_on_small_batches_against_brute_force(num_bins, batch):
    # Few bins on small batches: wide bins, bins cut by cap, empty bins, zeros and ties.
    case = small_case(batch)
    if case is None:
        return
    conf, drafts, sampling, cap, costs = case
    scores = survival_by_position(conf, drafts).ravel()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(budget_module, "num_bins_for", lambda num_slots: num_bins)
        chosen = _best_budget_binned(scores, cap, sampling, costs)
    assert_smallest_best_budget(chosen, conf, drafts, sampling, costs, cap)


def test_binned_search_handles_exact_ties_zeros_and_a_cap_inside_a_bin():
    # 40 slots at exactly 0.5, 40 at 0.25 and 20 zeros; flat costs: every draft pays, so
    # the budget is cap, which lies inside the 0.25 bin.
    scores = np.concatenate([np.full(40, 0.5), np.full(40, 0.25), np.zeros(20)])
    assert _best_budget_binned(scores, 57, 3, np.full(58, 2.0)) == 57
    # Drafts cost more than a 0.25 slot brings (ratio (3 + 0.5 b) / (1 + 0.1 b) stops
    # paying below 0.25 at these rates): all 40 slots at 0.5 and none of the rest.
    costs = 1.0 + 0.1 * np.arange(101.0)
    assert _best_budget_binned(scores, 100, 3, costs) == _best_budget_sorted(scores, 100, 3, costs)
    # Only zeros beyond the positive slots: more of them never pays (smallest b on ties).
    assert _best_budget_binned(scores, 100, 3, np.full(101, 2.0)) == 80
    # Nothing but zeros: no draft pays.
    assert _best_budget_binned(np.zeros(50), 50, 0, np.full(51, 1.0)) == 0


def test_binned_search_finds_an_optimum_just_before_a_cost_step():
    # A step costs 1 up to 100 drafts and 100 + b beyond: the optimum is the last budget
    # before the step, inside a bin, while the bin that straddles the step has the best
    # bound (its gain past the step over its cost before it).
    rng = np.random.default_rng(7)
    scores = rng.uniform(0.3, 0.9, 2000)
    costs = np.where(np.arange(2001) <= 100, 1.0, 100.0 + np.arange(2001))
    assert _best_budget_binned(scores, 2000, 10, costs) == 100
    assert _best_budget_sorted(scores, 2000, 10, costs) == 100


@pytest.mark.parametrize("block", [1, 2, 3, 64])
@settings(max_examples=150, deadline=None)
@given(batch=batches(max_reqs=12, max_k=6))
def test_block_search_on_small_batches_against_brute_force(block, batch):
    # Small blocks on small batches: blocks cut by cap, zero slots and exact ties.
    case = small_case(batch)
    if case is None:
        return
    conf, drafts, sampling, cap, costs = case
    ranked = np.sort(-survival_by_position(conf, drafts).ravel())
    chosen = _best_in_blocks(ranked, cap, sampling, costs, block)
    assert_smallest_best_budget(chosen, conf, drafts, sampling, costs, cap)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(300, 1200),
    st.floats(0.2, 0.99),
    st.floats(0.0, 0.3),
    st.integers(0, 2**32 - 1),
    st.sampled_from([1, 8, 64, 100]),
)
def test_block_search_equals_the_rank_by_rank_sum_on_large_batches(
    num_reqs, mean, spread, seed, step
):
    # Above SEQUENTIAL_MAX_BUDGET the search runs by blocks: same budget as summing
    # every rank (costs with steps that fall inside blocks and at their edges).
    rng = np.random.default_rng(seed)
    conf = np.clip(rng.normal(mean, spread, (num_reqs, 7)), 0, 1)
    conf[rng.random(conf.shape) < 0.05] = 1.0
    drafts = rng.integers(0, 8, num_reqs)
    ranked = np.sort(-survival_by_position(conf, drafts).ravel())
    cap = min(int(drafts.sum()), int(rng.integers(1, 8 * num_reqs)))
    costs = PaddedCost(rng.uniform(0.1, 20), rng.uniform(0.001, 0.1), step).step_costs_ms(
        num_reqs, num_reqs, cap
    )
    sampling = int(rng.integers(0, num_reqs + 1))
    gains = np.concatenate(([0.0], np.cumsum(-ranked[:cap]))) + sampling
    assert best_in_ranked(ranked, cap, sampling, costs) == int((gains / costs).argmax())


def test_block_search_finds_an_optimum_just_before_a_cost_step_inside_a_block():
    # Costs 1 up to 100 drafts, then 100 + b: the optimum (100) lies inside the block of
    # ranks 65..128, whose bound (gain at 128 over the cost at 65) is the best.
    rng = np.random.default_rng(7)
    ranked = np.sort(-rng.uniform(0.3, 0.9, 3000))
    costs = np.where(np.arange(3001) <= 100, 1.0, 100.0 + np.arange(3001))
    assert _best_in_blocks(ranked, 3000, 10, costs) == 100
    assert best_in_ranked(ranked, 3000, 10, costs) == 100
    # Flat costs: every draft pays; cap 2500 ends inside a block.
    assert _best_in_blocks(ranked, 2500, 10, np.full(2501, 2.0)) == 2500
    # Only zeros past the positive slots: more of them never pays (smallest b on ties).
    padded = np.concatenate((ranked[:2100], np.zeros(900)))
    assert _best_in_blocks(padded, 3000, 10, np.full(3001, 2.0)) == 2100
    # A first draft that costs more than everything brings: the budget is zero.
    steep = np.concatenate(([1.0], np.full(3000, 1e9)))
    assert _best_in_blocks(ranked, 3000, 10, steep) == 0


def test_best_drafting_depth_hand_computed_and_ties_go_shallow():
    from dspark.scheduling.budget import best_drafting_depth, depth_rates

    survival = np.array([[0.9, 0.0, 0.0]])  # nothing past the first position survives
    verify = 10.0 + np.arange(4.0)  # 10 ms, +1 ms per verified draft
    flat = np.array([0.0, 2.0, 2.0, 2.0])
    # Without the drafter 1 / 10 = 0.1; any depth: 1.9 / (2 + 11) = 0.146 at b = 1, the
    # same at every depth (the deeper slots add nothing): the shallowest wins.
    np.testing.assert_allclose(depth_rates(survival, verify, 1, flat), [0.1] + [1.9 / 13] * 3)
    assert best_drafting_depth(survival, verify, 1, flat) == 1
    # An undrafted step that pays 10 ms more than its price loses to any drafted plan;
    # a drafter of 9 ms at every depth loses to the undrafted step: 1.9 / 20 < 0.1.
    assert best_drafting_depth(survival, verify, 1, np.array([10.0, 2.0, 2.0, 2.0])) == 1
    assert best_drafting_depth(survival, verify, 1, np.array([0.0, 9.0, 9.0, 9.0])) == 0


@pytest.mark.parametrize("mask_max_slots", [0, 10_000], ids=["merged", "masked"])
@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    num_reqs=st.integers(1, 6),
    k=st.integers(1, 5),
    sampling=st.integers(0, 3),
)
def test_depth_rates_match_every_depth_and_budget_by_brute_force(
    mask_max_slots, data, num_reqs, k, sampling
):
    from unittest import mock

    from dspark.scheduling.budget import depth_rates
    from dspark.scheduling.cost import VERIFY_FLOOR_MS

    confidences = data.draw(
        hnp.arrays(np.float64, (num_reqs, k), elements=st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
    )
    survival = np.cumprod(confidences, axis=1)
    cap = data.draw(st.integers(0, num_reqs * k))
    steps = data.draw(hnp.arrays(np.float64, cap + 1, elements=st.floats(0.0, 3.0)))
    verify_ms = 5.0 + np.cumsum(steps)  # non-decreasing
    draft_ms = np.concatenate(
        (
            [data.draw(st.floats(0.0, 2.0))],
            np.sort(data.draw(hnp.arrays(np.float64, k, elements=st.floats(0.0, 4.0)))),
        )
    )
    s = min(sampling, num_reqs)
    with mock.patch.object(budget_module, "DEPTH_MASK_MAX_SLOTS", mask_max_slots):
        rates = depth_rates(survival, verify_ms, s, draft_ms)
    assert rates[0] == pytest.approx(s / max(verify_ms[0] + draft_ms[0], VERIFY_FLOOR_MS))
    for depth in range(1, k + 1):
        # Every budget b >= 1 over the slots at positions < depth, ranked by survival.
        slots = np.sort(survival[:, :depth].ravel())[::-1]
        best = -np.inf
        for b in range(1, min(cap, slots.shape[0]) + 1):
            cost = max(verify_ms[b] + draft_ms[depth], VERIFY_FLOOR_MS)
            best = max(best, (s + slots[:b].sum()) / cost)
        assert (
            rates[depth] == pytest.approx(best, rel=1e-12)
            if np.isfinite(best)
            else (rates[depth] == -np.inf)
        )


@given(
    st.integers(1, 9),  # K
    st.integers(1, 400),  # requests
    st.sampled_from([0.0, 0.5, 1.0]),  # share of values drawn from a few ties
    st.integers(0, 2**31),
)
def test_ranking_by_position_then_merging_gives_the_full_sort(k, n, tied, seed):
    """``sort_ranked`` (each position sorted, then the runs merged, above
    ``MERGE_MIN_SLOTS``) returns the very values a full sort does, ties and zeros
    included; the budget searched over scores by request equals the flat search's."""
    from unittest import mock

    from dspark.scheduling import survival as survival_module
    from dspark.scheduling.budget import best_budget

    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.0, 1.0, (k, n))
    ties = rng.random((k, n)) < tied
    scores[ties] = rng.choice([0.0, 0.25, 0.5], ties.sum())
    expected = np.sort(scores.ravel())
    with mock.patch.object(survival_module, "MERGE_MIN_SLOTS", 1):
        merged = survival_module.sort_ranked(scores.copy())
    assert np.array_equal(merged, expected)
    assert np.array_equal(survival_module.sort_ranked(scores.copy()), expected)
    cap = k * n
    costs = np.maximum.accumulate(5.0 + rng.uniform(0.0, 0.02, cap + 1).cumsum())
    by_request = np.ascontiguousarray(scores.T)
    with mock.patch.object(survival_module, "RANKING", "sort"):  # both searches sort
        flat = best_budget(by_request.ravel(), cap, n, costs)
        with (
            mock.patch.object(survival_module, "MERGE_MIN_SLOTS", 1),
            mock.patch.object(budget_module, "MERGE_MIN_SLOTS", 1),
        ):
            assert best_budget(by_request, cap, n, costs) == flat
