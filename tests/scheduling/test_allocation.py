import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dspark.scheduling import allocate_drafts
from dspark.scheduling import survival as survival_module
from dspark.scheduling.survival import kth_largest
from tests.oracles import best_total_survival, survival_rows


def test_global_top_budget_by_survival():
    conf = np.array([[0.9, 0.9, 0.9], [0.5, 1.0, 1.0], [0.95, 0.1, 1.0]])
    # Survival: r0 0.9 0.81 0.729; r1 0.5 0.5 0.5; r2 0.95 0.095 0.095.
    assert allocate_drafts(conf, [3, 3, 3], 4).tolist() == [3, 0, 1]
    assert allocate_drafts(conf, [3, 3, 3], 2).tolist() == [1, 0, 1]
    # r0 may only verify one draft: its 0.81 and 0.729 are out of reach.
    assert allocate_drafts(conf, [1, 3, 3], 3).tolist() == [1, 1, 1]


def test_ties_go_to_earlier_position_then_lower_request():
    conf = np.ones((3, 3))
    assert allocate_drafts(conf, [3, 3, 3], 4).tolist() == [2, 1, 1]
    assert allocate_drafts(conf, [3, 3, 3], 2).tolist() == [1, 1, 0]
    assert allocate_drafts(conf, [0, 3, 3], 3).tolist() == [0, 2, 1]


def test_zero_survival_slots_never_beat_unscheduled_order():
    # Scheduled zeros may win (budget forces them), unscheduled slots never do.
    conf = np.zeros((2, 3))
    assert allocate_drafts(conf, [1, 3], 3).tolist() == [1, 2]
    assert allocate_drafts(conf, [0, 3], 2).tolist() == [0, 2]


def test_zero_and_full_budgets():
    conf = np.full((2, 2), 0.5)
    assert allocate_drafts(conf, [2, 1], 0).tolist() == [0, 0]
    assert allocate_drafts(conf, [2, 1], 3).tolist() == [2, 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.full((2, 2), 0.5), [2, 2], 5), "budget must be at most the scheduled drafts \\(4\\)"),
        ((np.full((2, 2), 0.5), [2, 3], 1), "at most K=2"),
        ((np.full((2, 2), 0.5), [2], 1), "length 2"),
        ((np.full((2, 2), -0.1), [2, 2], 1), "\\[0, 1\\]"),
        ((np.full((2, 2), 0.5), [2, 2], -1), "budget must be non-negative"),
        ((np.full((2, 2), 0.5), [2, 2], 1.5), "budget must be an integer"),
    ],
)
def test_bad_input_is_a_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        allocate_drafts(*args)


@st.composite
def allocations(draw, max_reqs=5, max_k=4):
    num_reqs = draw(st.integers(1, max_reqs))
    k = draw(st.integers(1, max_k))
    values = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1))
    conf = draw(hnp.arrays(np.float64, (num_reqs, k), elements=values))
    drafts = draw(hnp.arrays(np.int64, num_reqs, elements=st.integers(0, k)))
    budget = draw(st.integers(0, int(drafts.sum())))
    return conf, drafts, budget


@settings(max_examples=400, deadline=None)
@given(allocations())
def test_allocation_is_an_optimal_prefix_assignment(case):
    conf, drafts, budget = case
    admitted = allocate_drafts(conf, drafts, budget)
    assert admitted.sum() == budget
    assert ((0 <= admitted) & (admitted <= drafts)).all()
    survival = survival_rows(conf)
    total = sum(survival[r, :a].sum() for r, a in enumerate(admitted))
    assert total == pytest.approx(best_total_survival(conf, drafts, budget), rel=1e-12, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(allocations(max_reqs=8, max_k=6))
def test_allocation_matches_a_stable_sort_with_the_tie_rule(case):
    conf, drafts, budget = case
    survival = survival_rows(conf)
    # Rank every scheduled slot by (-survival, position, request): a stable sort of the
    # position-major list.
    slots = [(k, r) for k in range(conf.shape[1]) for r in range(len(drafts)) if k < drafts[r]]
    ranked = sorted(slots, key=lambda kr: -survival[kr[1], kr[0]])
    expected = np.zeros(len(drafts), dtype=np.int64)
    for _, r in ranked[:budget]:
        expected[r] += 1
    assert allocate_drafts(conf, drafts, budget).tolist() == expected.tolist()


@settings(max_examples=200, deadline=None)
@given(st.integers(1025, 4000), st.integers(0, 2**32 - 1), st.booleans())
def test_binned_kth_largest_equals_sorting(size, seed, coarse):
    rng = np.random.default_rng(seed)
    scores = rng.random(size)
    if coarse:
        scores = np.round(scores * 16) / 16  # many exact ties
    k = int(rng.integers(1, size + 1))
    assert kth_largest(scores, k) == np.sort(scores)[::-1][k - 1]


@settings(max_examples=60, deadline=None)
@given(st.integers(150, 400), st.integers(0, 2**32 - 1))
def test_large_batches_allocate_like_the_tie_rule(num_reqs, seed):
    rng = np.random.default_rng(seed)
    conf = np.round(rng.beta(5, 1.2, (num_reqs, 7)) * 64) / 64  # ties on a grid
    drafts = rng.integers(0, 8, num_reqs)
    budget = int(rng.integers(1, drafts.sum()))
    survival = survival_rows(conf)
    order = sorted(
        ((k, r) for k in range(7) for r in range(num_reqs) if k < drafts[r]),
        key=lambda kr: -survival[kr[1], kr[0]],
    )
    expected = np.bincount([r for _, r in order[:budget]], minlength=num_reqs)
    assert allocate_drafts(conf, drafts, budget).tolist() == expected.tolist()


@pytest.mark.parametrize("num_bins", [1, 4, 64])
@settings(max_examples=150, deadline=None)
@given(case=allocations(max_reqs=8, max_k=6))
def test_binned_threshold_allocates_like_the_tie_rule_on_small_batches(num_bins, case):
    # The binned k-th largest forced on small batches: wide bins, exact ties at the
    # threshold, zero survival and unscheduled slots.
    conf, drafts, budget = case
    survival = survival_rows(conf)
    slots = [(k, r) for k in range(conf.shape[1]) for r in range(len(drafts)) if k < drafts[r]]
    ranked = sorted(slots, key=lambda kr: -survival[kr[1], kr[0]])
    expected = np.bincount([r for _, r in ranked[:budget]], minlength=len(drafts))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(survival_module, "RANKING", "bins")
        patch.setattr(survival_module, "num_bins_for", lambda num_slots: num_bins)
        admitted = allocate_drafts(conf, drafts, budget)
    assert admitted.tolist() == expected.tolist()


def test_ties_at_the_threshold_go_to_earlier_positions_then_lower_requests():
    # Survival 0.5 everywhere at positions 0 and 1 (confidences 0.5 then 1.0): six tied
    # slots, four admitted; in (position, request) order those are all of position 0 and
    # request 0's position 1.
    conf = np.array([[0.5, 1.0, 0.1], [0.5, 1.0, 0.1], [0.5, 1.0, 0.1]])
    assert allocate_drafts(conf, [3, 3, 3], 4).tolist() == [2, 1, 1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(survival_module, "RANKING", "bins")
        assert allocate_drafts(conf, [3, 3, 3], 4).tolist() == [2, 1, 1]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 3000), st.integers(0, 2**32 - 1), st.sampled_from(["grid", "zeros", "signed"])
)
def test_binned_kth_largest_with_zeros_ties_and_signed_zero(size, seed, kind):
    rng = np.random.default_rng(seed)
    scores = rng.random(size)
    if kind == "grid":
        scores = np.round(scores * 8) / 8  # ties, including exact 0.0 and 1.0
    elif kind == "zeros":
        scores[rng.random(size) < 0.5] = 0.0
    else:
        scores[rng.random(size) < 0.3] = -0.0  # a product with a -0.0 confidence
    k = int(rng.integers(1, size + 1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(survival_module, "RANKING", "bins")
        assert kth_largest(scores, k) == np.sort(scores)[::-1][k - 1]
