import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.scheduling import AdaptiveVerifier, allocate_drafts, choose_draft_budget


class LinearCost:
    def __init__(self, fixed, per_token):
        self.fixed, self.per_token = fixed, per_token

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return self.fixed + self.per_token * (num_tokens + np.arange(max_drafts + 1.0))


def make(num_slots=4, k=3, cost=None):
    return AdaptiveVerifier(num_slots, k, cost or LinearCost(1.0, 0.25), max_total_logits=1000)


def test_budget_uses_previous_round_allocation_uses_this_round():
    verifier = make()
    slots = np.array([2, 0])
    verifier.add_request(0)
    verifier.add_request(2)
    round_1 = np.array([[0.1, 0.1, 0.1], [0.9, 0.9, 0.9]])
    round_2 = np.array([[0.9, 0.9, 0.9], [0.1, 0.1, 0.1]])
    drafts, non_draft = np.array([3, 3]), np.array([1, 1])

    verifier.record(slots, round_1)
    # First round: new requests are planned as if every draft survives (1.0).
    assert verifier.plan(slots, drafts, non_draft, 2) == choose_draft_budget(
        np.ones((2, 3)), drafts, non_draft, 2, verifier.cost_model, 1000
    )
    verifier.record(slots, round_2)
    budget = verifier.plan(slots, drafts, non_draft, 2)
    assert budget == choose_draft_budget(round_1, drafts, non_draft, 2, verifier.cost_model, 1000)
    assert budget == 3  # computed by hand: 0.9, 0.81, 0.729 pay at 0.25 ms/token; 0.1 doesn't
    # ... while the allocation ranks this round's confidences: slot 2 now leads.
    assert verifier.allocate(slots, drafts, budget).tolist() == [3, 0]
    assert (
        verifier.allocate(slots, drafts, 2).tolist() == allocate_drafts(round_2, drafts, 2).tolist()
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_budget_planned_ahead_is_the_plan_after_the_next_record(data):
    """``plan(..., ahead=True)`` before a round is recorded equals ``plan`` after it, for
    any history (new slots, skipped and relaxed ones) and any drafts scheduled."""
    k, num_slots = 4, 6
    verifier = make(num_slots, k, LinearCost(1.0, 0.2))
    for slot in range(num_slots):
        verifier.add_request(slot)
    unit = st.floats(0.0, 1.0)
    for _ in range(data.draw(st.integers(0, 4))):  # some history
        slots = np.array(data.draw(st.lists(st.integers(0, num_slots - 1), unique=True)))
        if data.draw(st.booleans()):
            verifier.record(
                slots,
                np.array(
                    data.draw(
                        st.lists(
                            st.lists(unit, min_size=k, max_size=k),
                            min_size=len(slots),
                            max_size=len(slots),
                        )
                    )
                ).reshape(len(slots), k),
            )
        else:
            verifier.relax(slots)
    slots = np.array(data.draw(st.lists(st.integers(0, num_slots - 1), min_size=1, unique=True)))
    n = len(slots)
    drafts = np.array(data.draw(st.lists(st.integers(1, k), min_size=n, max_size=n)))
    non_draft = np.ones(n, dtype=np.int64)
    ahead = verifier.plan(slots, drafts, non_draft, n, ahead=True)
    verifier.record(
        slots,
        np.array(
            data.draw(st.lists(st.lists(unit, min_size=k, max_size=k), min_size=n, max_size=n))
        ).reshape(n, k),
    )
    assert verifier.plan(slots, drafts, non_draft, n) == ahead


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_shares_of_a_budget_planned_ahead_are_its_top_slots_by_request(data):
    """``plan_shares``: the budget is ``plan(..., ahead=True)``'s, and each request's share
    is its count in a brute-force global top-budget of the survival that plan ranked (the
    latest recorded round, predictiveness still 1), earlier position then lower request
    first on ties; shares sum to the budget and never exceed the drafts."""
    k, num_slots = 3, 5
    verifier = make(num_slots, k, LinearCost(1.0, data.draw(st.sampled_from([0.05, 0.3, 0.9]))))
    for slot in range(num_slots):
        verifier.add_request(slot)
    # Coarse confidences, so that survival ties are common.
    unit = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])
    rows = np.array(
        data.draw(st.lists(st.lists(unit, min_size=k, max_size=k), min_size=5, max_size=5))
    ).reshape(num_slots, k)
    verifier.record(np.arange(num_slots), rows)
    slots = np.array(data.draw(st.lists(st.integers(0, num_slots - 1), min_size=1, unique=True)))
    n = len(slots)
    drafts = np.array(data.draw(st.lists(st.integers(0, k), min_size=n, max_size=n)))
    non_draft = np.ones(n, dtype=np.int64)
    budget, shares = verifier.plan_shares(slots, drafts, non_draft, n)
    assert budget == verifier.plan(slots, drafts, non_draft, n, ahead=True)
    assert shares.sum() == budget and (shares <= drafts).all() and (shares >= 0).all()
    survival = np.cumprod(rows[slots], axis=1)
    ranked = sorted(
        ((-survival[r, p], p, r) for r in range(n) for p in range(drafts[r])),
    )
    expected = np.zeros(n, dtype=np.int64)
    for _, _, r in ranked[:budget]:
        expected[r] += 1
    assert shares.tolist() == expected.tolist()


def test_shares_of_a_budget_planned_ahead_by_hand():
    """Two requests, K = 3, 0.25 ms a token on a 1 ms step: the budget is 3 (0.9, 0.81,
    0.729 pay, 0.1 does not), all three slots of the first request."""
    verifier = make()
    for slot in (0, 2):
        verifier.add_request(slot)
    verifier.record(np.array([2, 0]), np.array([[0.9, 0.9, 0.9], [0.1, 0.1, 0.1]]))
    budget, shares = verifier.plan_shares(np.array([2, 0]), np.array([3, 3]), np.ones(2), 2)
    assert budget == 3 and shares.tolist() == [3, 0]


def test_stale_is_per_slot_and_skipped_steps_keep_the_last_record():
    verifier = make()
    for slot in (0, 1):
        verifier.add_request(slot)
    a = np.full((1, 3), 0.3)
    verifier.record(np.array([0]), a)
    verifier.record(np.array([1]), np.full((1, 3), 0.8))  # slot 0 not in this batch
    verifier.record(np.array([0]), np.full((1, 3), 0.6))
    drafts, non_draft = np.array([3]), np.array([1])
    assert verifier.plan(np.array([0]), drafts, non_draft, 1) == choose_draft_budget(
        a, drafts, non_draft, 1, verifier.cost_model, 1000
    )


def test_reused_slot_starts_again_at_one():
    verifier = make(cost=LinearCost(1.0, 0.3))
    verifier.add_request(1)
    verifier.record(np.array([1]), np.zeros((1, 3)))
    verifier.record(np.array([1]), np.zeros((1, 3)))
    drafts, non_draft = np.array([3]), np.array([1])
    assert verifier.plan(np.array([1]), drafts, non_draft, 1) == 0
    verifier.remove_request(1)
    verifier.add_request(1)
    verifier.record(np.array([1]), np.zeros((1, 3)))
    assert verifier.plan(np.array([1]), drafts, non_draft, 1) == 3


def test_lifecycle_errors_are_clear():
    verifier = make()
    with pytest.raises(ValueError, match="hold no request"):
        verifier.record(np.array([0]), np.ones((1, 3)))
    verifier.add_request(0)
    with pytest.raises(ValueError, match="already holds"):
        verifier.add_request(0)
    with pytest.raises(ValueError, match="slot must be in"):
        verifier.add_request(9)
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        verifier.record(np.array([0]), np.ones((1, 2)))
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        verifier.record(np.array([0]), np.full((1, 3), 2.0))
    with pytest.raises(ValueError, match="at most K=3"):
        verifier.plan(np.array([0]), np.array([4]), np.array([1]), 1)
    with pytest.raises(ValueError, match="budget must be in"):
        verifier.allocate(np.array([0]), np.array([2]), 3)
    verifier.remove_request(0)
    with pytest.raises(ValueError, match="holds no request"):
        verifier.remove_request(0)


def test_drafting_pays_compares_against_a_step_without_the_drafter():
    from dspark.scheduling import CostTables

    def verifier_with(draft_ms):
        tables = CostTables(
            draft_ms=np.full(5, draft_ms), verify_ms=10.0 + 0.5 * np.arange(40, dtype=float)
        )
        verifier = AdaptiveVerifier(4, 3, tables, max_total_logits=64)
        for slot in range(2):
            verifier.add_request(slot)
        # Two recordings: the stale survival becomes [0.9, 0.81, 0.729] for both slots.
        for _ in range(2):
            verifier.record(np.array([0, 1]), np.full((2, 3), 0.9))
        return verifier

    args = (np.array([0, 1]), np.array([3, 3]), np.array([1, 1]), 2)
    # Without the drafter: 2 tokens / (10 + 0.5*2) ms = 0.1818 tok/ms. With 6 drafts and a
    # 1 ms drafter: (2 + 2*(0.9+0.81+0.729)) / (1 + 10 + 0.5*8) = 6.878 / 15 = 0.4585.
    assert verifier_with(1.0).drafting_pays(*args) == 3  # budget 6, capped at K = 3
    # A 30 ms drafter: the best budget gives at most 6.878 / (30 + 14) = 0.156 < 0.1818.
    assert verifier_with(30.0).drafting_pays(*args) == 0
    # No drafts possible: nothing to verify, never worth drafting.
    assert not verifier_with(1.0).drafting_pays(
        np.array([0, 1]), np.array([0, 0]), np.array([1, 1]), 2
    )


def test_the_population_forgets_by_rounds_at_small_batches_and_by_calls_at_large_ones():
    from dspark.scheduling import CostTables
    from dspark.scheduling.verifier import POPULATION_RECORD_DECAY, POPULATION_ROUND_DECAY

    tables = CostTables(draft_ms=np.full(301, 4.0), verify_ms=10.0 + 0.1 * np.arange(2000.0))

    def population_after(num_reqs: int) -> np.ndarray:
        verifier = AdaptiveVerifier(num_reqs, 1, tables, max_total_logits=4096)
        slots = np.arange(num_reqs)
        for slot in slots:
            verifier.add_request(int(slot))
        verifier.record(slots, np.full((num_reqs, 1), 0.8))
        verifier.record(slots, np.full((num_reqs, 1), 0.2))
        return verifier.population_survival

    # Two records of a mean of 0.8, then 0.2: (d · 0.8 + 0.2) / (d + 1), d the decay of
    # the second record: 0.995 a round at one request, 0.995^4 at four, and never below
    # 0.9 a call (0.995^256 = 0.28 at 256 requests).
    for num_reqs, decay in [
        (1, POPULATION_ROUND_DECAY),
        (4, POPULATION_ROUND_DECAY**4),
        (256, POPULATION_RECORD_DECAY),
    ]:
        expected = (decay * 0.8 + 0.2) / (decay + 1)
        np.testing.assert_allclose(population_after(num_reqs), [expected])
    assert POPULATION_ROUND_DECAY**256 < POPULATION_RECORD_DECAY == 0.9


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=12,
    )
)
def test_the_population_is_the_decayed_mean_of_every_record_brute_force(records):
    """Against the weights written out: record i of n_i rows weighs (1 - d_i) times the
    decays d_j of every later record, d = max(0.9, 0.995^n); the population is the
    weighted mean of the records' per-position means."""
    from dspark.scheduling import CostTables

    tables = CostTables(draft_ms=np.full(41, 4.0), verify_ms=10.0 + 0.1 * np.arange(400.0))
    verifier = AdaptiveVerifier(40, 2, tables, max_total_logits=400)
    for slot in range(40):
        verifier.add_request(slot)
    means, decays = [], []
    rng = np.random.default_rng(len(records))
    for num_rows, low, high in records:
        first = rng.uniform(min(low, high), max(low, high), num_rows)
        rows = np.stack([first, np.full(num_rows, 0.5)], axis=1)
        verifier.record(np.arange(num_rows), rows)
        means.append(np.stack([first, first * 0.5], axis=1).mean(axis=0))  # survival
        decays.append(max(0.9, 0.995**num_rows))
    weights = np.array([(1 - d) * np.prod(decays[i + 1 :]) for i, d in enumerate(decays)])
    expected = weights @ np.array(means) / weights.sum()
    np.testing.assert_allclose(verifier.population_survival, expected, rtol=1e-10, atol=1e-12)


def test_drafting_pays_reads_the_latest_record_and_relax_retries_skipped_slots():
    from dspark.scheduling import CostTables

    tables = CostTables(draft_ms=np.full(3, 4.0), verify_ms=10.0 + 0.1 * np.arange(20.0))
    verifier = AdaptiveVerifier(2, 2, tables, max_total_logits=16)
    verifier.add_request(0)
    args = (np.array([0]), np.array([2]), np.array([1]), 1)
    verifier.record(np.array([0]), np.array([[0.9, 0.9]]))
    # Population: the first record itself (no blend with the 1.0 a new slot starts at).
    np.testing.assert_allclose(verifier.population_survival, [0.9, 0.81])
    verifier.record(np.array([0]), np.array([[0.1, 0.5]]))
    # One round per record decays by the round (0.995, above the per-call 0.9):
    # (0.995 · [0.9, 0.81] + [0.1, 0.05]) / 1.995 = [0.9955, 0.85595] / 1.995.
    np.testing.assert_allclose(verifier.population_survival, [0.9955 / 1.995, 0.85595 / 1.995])
    # The latest record (survival [0.1, 0.05]) decides, not the stale [0.9, 0.81]:
    # without the drafter 1 / 10.1 = 0.099 tok/ms; with it at most 1.15 / 14.3 = 0.080.
    assert verifier.drafting_pays(*args) == 0
    # The plan (stale, the seed's semantics) still sees [0.9, 0.81].
    assert verifier.plan(*args) == 2
    verifier.relax(np.array([0]))
    # Halfway to the population: [0.29950, 0.23953]; (1 + 0.53903) / 14.3 = 0.1076 > 0.099.
    assert verifier.drafting_pays(*args) == 2
    # A request with no round recorded is priced at the population's survival, not 1.0:
    # (1 + 0.49900 + 0.42905) / 14.3 = 0.1348 drafted (1.0 would give 3 / 14.3 = 0.2098).
    verifier.add_request(1)
    verifier.relax(np.array([0]), weight=0.0)
    one = (np.array([1]), np.array([2]), np.array([1]), 1)
    assert verifier.drafting_pays(*one) == 2
    verifier.cost_model = CostTables(draft_ms=np.full(3, 8.0), verify_ms=tables.verify_ms)
    # A drafter of 8 ms: 1.928 / 18.3 = 0.1054 > 0.099 still pays; at 1.0 both would.
    assert verifier.drafting_pays(*one) == 2
    verifier.cost_model = CostTables(draft_ms=np.full(3, 10.0), verify_ms=tables.verify_ms)
    # 10 ms: 1.928 / 20.3 = 0.095 < 0.099 does not, though 3 / 20.3 = 0.148 would have.
    assert verifier.drafting_pays(*one) == 0
    with pytest.raises(ValueError, match="weight"):
        verifier.relax(np.array([0]), weight=1.5)
    verifier.remove_request(1)
    with pytest.raises(ValueError, match="no request"):
        verifier.relax(np.array([1]))


def test_the_budget_after_the_gate_is_the_seeds_answer_on_the_stale_confidences():
    class Linear:
        def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
            return 10.0 + 0.7 * np.arange(max_drafts + 1)

    verifier = AdaptiveVerifier(3, 3, Linear(), max_total_logits=64)
    for slot in range(3):
        verifier.add_request(slot)
    slots, drafts, non_draft = np.arange(3), np.array([3, 3, 3]), np.ones(3, dtype=int)
    rng = np.random.default_rng(0)
    previous = np.ones((3, 3))  # new slots start at 1.0
    for _ in range(6):
        fresh = rng.uniform(0.05, 0.95, (3, 3))
        verifier.drafting_pays(slots, drafts, non_draft, 3)
        verifier.record(slots, fresh)  # the rows the gate read become the stale ones
        budget = verifier.plan(slots, drafts, non_draft, 3)
        assert budget == choose_draft_budget(previous, drafts, non_draft, 3, Linear(), 64)
        previous = fresh


def _brute_force_budget(survival_rows, num_sampling, tables):
    """Every budget b priced: (num_sampling + top-b survival) / cost; the smallest best."""
    scores = np.sort(survival_rows.ravel())[::-1]
    n = survival_rows.shape[0]
    costs = tables.step_costs_ms(n, n, scores.shape[0])
    ratios = [(num_sampling + scores[:b].sum()) / costs[b] for b in range(scores.shape[0] + 1)]
    return int(np.argmax(ratios))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_plan_keeps_the_batch_spread_and_shrinks_its_mean(data):
    """Oracle: the stale survival rows scaled per position so that their mean over the
    batch becomes predictiveness x that mean + (1 - predictiveness) x the population's,
    clipped at 1, every budget priced; rows of requests with no round yet (all 1.0)
    unscaled and out of the mean. The same budget planned ahead, before the round is
    recorded."""
    from dspark.scheduling import CostTables

    k, num_slots = 3, 8
    tables = CostTables(draft_ms=np.full(num_slots + 1, 2.0), verify_ms=8.0 + 0.4 * np.arange(64.0))
    verifier = AdaptiveVerifier(num_slots, k, tables, max_total_logits=64)
    for slot in range(num_slots):
        verifier.add_request(slot)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    everyone = np.arange(num_slots)
    for _ in range(data.draw(st.integers(12, 30))):  # independent rounds: predictiveness < 1
        verifier.record(everyone, rng.uniform(0.05, 1.0, (num_slots, k)))
    fresh_slot = data.draw(st.booleans())
    if fresh_slot:  # a request with no round yet sits in the batch
        verifier.remove_request(0)
        verifier.add_request(0)
    slots = np.array(data.draw(st.lists(st.integers(0, num_slots - 1), min_size=1, unique=True)))
    n = len(slots)
    drafts = np.full(n, k)
    args = (slots, drafts, np.ones(n, dtype=np.int64), n)
    population, weight = verifier.population_survival, verifier.predictiveness
    assert weight < 1.0
    ahead = verifier.plan(*args, ahead=True)
    stale = verifier._fresh[slots].copy()  # what the next record turns stale
    verifier.record(slots, rng.uniform(0.05, 1.0, (n, k)))
    budget = verifier.plan(*args)
    assert budget == ahead
    prior = (stale == 1.0).all(axis=1)
    rows = stale.copy()
    if (~prior).any():
        mean = stale[~prior].mean(axis=0)
        target = weight * mean + (1 - weight) * population
        rows[~prior] = np.minimum(stale[~prior] * (target / mean), 1.0)
    assert budget == _brute_force_budget(rows, n, tables)


def test_the_batch_level_shrink_by_hand():
    """Each position's rows scaled so that their mean moves ``1 - weight`` of the way to
    the population's; a position whose rows are all 0 takes that mean; clipped at 1; a
    row of the prior (all 1.0) neither moves nor counts."""
    from dspark.scheduling.verifier import _shrink_batch_level

    rows = np.array([[0.5, 0.0], [0.3, 0.0], [1.0, 1.0]])
    _shrink_batch_level(rows, np.array([0.6, 0.2]), 0.5)
    # Means over the first two rows 0.4 and 0; targets 0.5 and 0.1: x1.25, then 0.1.
    np.testing.assert_allclose(rows, [[0.625, 0.1], [0.375, 0.1], [1.0, 1.0]])
    rows = np.array([[0.9], [0.1]])
    _shrink_batch_level(rows, np.array([0.9]), 0.0)  # mean 0.5 to 0.9: x1.8, clipped
    np.testing.assert_allclose(rows, [[1.0], [0.18]])


def test_the_shrunk_plan_never_drops_a_draft_that_costs_nothing():
    """Independent rounds (predictiveness near 0), a verify that costs the same for every
    draft count, and a lucky stale batch (its mean far above the population's): each
    slot's survival is scaled down, never to 0, so the budget admits every draft, as
    the best budget on any fresh round does. (Shifting the rows by the mean's excess
    would put slot 1's last position at 0, and the smallest best budget would leave it
    out.)"""
    from dspark.scheduling import CostTables

    rng = np.random.default_rng(3)
    rounds = [rng.choice([0.2, 0.9], size=(2, 1)) * np.ones((2, 3)) for _ in range(120)]
    flat = CostTables(draft_ms=np.full(3, 2.0), verify_ms=np.full(16, 10.0))
    verifier = AdaptiveVerifier(2, 3, flat, max_total_logits=16)
    verifier.predictiveness_decay = 0.99
    for slot in range(2):
        verifier.add_request(slot)
    for confidences in rounds:
        verifier.record(np.array([0, 1]), confidences)
    assert verifier.predictiveness < 0.25
    lucky = np.array([[0.95, 0.95, 0.95], [0.6, 0.3, 0.2]])  # slot 1: 0.6, 0.18, 0.036
    verifier.record(np.array([0, 1]), lucky)
    verifier.record(np.array([0, 1]), rng.uniform(0.1, 0.9, (2, 3)))  # lucky turns stale
    args = (np.array([0, 1]), np.array([3, 3]), np.array([1, 1]), 2)
    assert verifier.plan(*args) == 6
    # The rows it prices: the stale ones scaled towards the population, all above 0.
    population, weight = verifier._planning_state
    stale = verifier._stale[[0, 1]].copy()
    mean = stale.mean(axis=0)
    scaled = stale * ((weight * mean + (1 - weight) * population) / mean)
    assert (scaled > 0).all()
    shifted = stale - (1 - weight) * (mean - population)
    assert shifted[1, 2] < 0  # what the shift did: slot 1's last survival below 0,
    assert _brute_force_budget(np.clip(shifted, 0.0, 1.0), 2, flat) == 5  # and cut there


def _chunk_verifier(confidence, k=1, num_slots=2):
    """Slot 0 recorded once at ``confidence``; a 2 ms drafter and verify costs 10 + t ms."""
    from dspark.scheduling import CostTables

    tables = CostTables(draft_ms=np.full(num_slots + 1, 2.0), verify_ms=10.0 + np.arange(64.0))
    verifier = AdaptiveVerifier(num_slots, k, tables, max_total_logits=64)
    for slot in range(num_slots):
        verifier.add_request(slot)
    verifier.record(np.array([0]), np.full((1, k), confidence))
    return verifier


def test_a_step_with_a_prompt_chunk_prices_drafts_against_decoding_alone():
    """Slot 0 decodes with one draft beside slot 1's 20-token prompt chunk (samples
    nothing). Priced with the chunk in, drafting pays once (1 + s) / (2 + 32) beats
    1 / 31, i.e. s > 0.097. Against decoding alone, the chunk's 20 tokens are paid
    whatever is drafted: (1 + s) / (2 + 12 + 1) must beat 1 / 12, i.e. s > 0.25."""
    args = (np.array([0, 1]), np.array([1, 0]), np.array([1, 20]), 1)
    assert _chunk_verifier(0.2).drafting_pays(*args) == 0  # 1.2 / 15 = 0.080 < 0.0833
    assert _chunk_verifier(0.3).drafting_pays(*args) == 1  # 1.3 / 15 = 0.0867
    # The same request decoding alone: the same decisions (the chunk changes nothing).
    alone = (np.array([0, 1]), np.array([1, 0]), np.array([1, 1]), 1)
    assert _chunk_verifier(0.2).drafting_pays(*alone) == 0
    assert _chunk_verifier(0.3).drafting_pays(*alone) == 1


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_plan_of_a_step_with_a_prompt_chunk_by_brute_force(data):
    """Oracle: every budget b priced at the drafter plus the decodes alone plus what b
    drafts add after the chunk's tokens, V(n) + V(T + b) - V(T), on a verify curve with
    steps (costs are multiples of 1/4: exact in floating point)."""
    from dspark.scheduling import CostTables

    k, n = 3, 6
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    # Flat stretches and jumps of up to 12/4 ms a token (a graph-padded curve's steps).
    verify = 4.0 + np.cumsum(rng.integers(0, 13, 400) * (rng.random(400) < 0.5)) / 4.0
    tables = CostTables(draft_ms=np.full(n + 1, 2.0), verify_ms=verify)
    verifier = AdaptiveVerifier(n, k, tables, max_total_logits=64)
    slots = np.arange(n)
    for slot in slots:
        verifier.add_request(slot)
    for _ in range(2):  # two rounds: the first one becomes stale; predictiveness still 1
        verifier.record(slots, rng.uniform(0.05, 1.0, (n, k)))
    chunk = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    non_draft = np.where(
        chunk, np.array(data.draw(st.lists(st.integers(2, 60), min_size=n, max_size=n))), 1
    )
    drafts = np.where(chunk, 0, k)
    num_sampling = data.draw(st.integers(int((~chunk).sum()), n))
    budget = verifier.plan(slots, drafts, non_draft, num_sampling)
    rows = verifier._stale[slots] * (drafts[:, None] > np.arange(k))
    scores = np.sort(rows.ravel())[::-1][: int(drafts.sum())]
    total = int(non_draft.sum())
    ratios = [
        (num_sampling + scores[:b].sum()) / (2.0 + verify[n] + verify[total + b] - verify[total])
        for b in range(scores.shape[0] + 1)
    ]
    assert budget == int(np.argmax(ratios))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_recut_of_the_ranking_ahead_is_the_steps_own_plan(data):
    """``recut``: the rows ``plan_ranking`` ranked for some decoding requests, taken by a
    later step of a subset of them (some drafting fewer) beside prompt chunks that draft
    nothing, give the budget ``plan(..., ahead=True)`` gives that step, on a verify curve
    with steps and a drafter priced by depth (predictiveness 1, as until enough rounds
    are paired, so the batch-level shrink leaves the rows as they are)."""
    from dspark.scheduling import CostTables

    k, num_slots = 4, 8
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    steps = rng.choice([0.0, 0.0, 0.0, 0.25, 3.0], size=200).cumsum()
    # The drafter's full-depth price (18 ms) is in the tables' step cost (20 ms).
    tables = CostTables(draft_ms=np.full(num_slots + 1, 20.0), verify_ms=10.0 + steps)

    class DepthPriced:
        def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
            return tables.step_costs_ms(num_reqs, num_tokens, max_drafts, context_tokens)

        def draft_cost_ms(self, num_reqs, depth=None):
            return 2.0 + 4.0 * (k if depth is None else depth)

    verifier = AdaptiveVerifier(num_slots, k, DepthPriced(), max_total_logits=60)
    for slot in range(num_slots):
        verifier.add_request(slot)
    recorded = rng.integers(0, num_slots, data.draw(st.integers(1, num_slots)))
    recorded = np.unique(recorded)  # the others keep the prior of 1.0
    unit = np.array([0.0, 0.3, 0.6, 0.9, 1.0])
    verifier.record(recorded, rng.choice(unit, size=(recorded.shape[0], k)))
    ahead_slots = rng.permutation(num_slots)[: data.draw(st.integers(1, num_slots - 1))]
    n = ahead_slots.shape[0]
    depth = data.draw(st.integers(1, k))
    ones = np.ones(n, dtype=np.int64)
    _, _, ranked = verifier.plan_ranking(ahead_slots, ones * depth, ones, n)
    assert ranked is not None and ranked.shape == (n, k)
    # The later step: some of those requests (in another order), each at most ``depth``
    # drafts, then prompt chunks of slots the look-ahead did not plan for.
    keep = rng.permutation(n)[: data.draw(st.integers(1, n))]
    counts = rng.integers(0, depth + 1, keep.shape[0])
    counts[0] = depth  # the step drafts that deep
    others = np.setdiff1d(np.arange(num_slots), ahead_slots)
    chunks = others[: data.draw(st.integers(0, others.shape[0]))]
    slots = np.concatenate([ahead_slots[keep], chunks])
    num_drafts = np.concatenate([counts, np.zeros(chunks.shape[0], dtype=np.int64)])
    chunk_tokens = rng.integers(1, 40, chunks.shape[0])
    non_draft = np.concatenate([np.ones(keep.shape[0], dtype=np.int64), chunk_tokens])
    num_sampling = keep.shape[0] + int(data.draw(st.integers(0, chunks.shape[0])))
    expected = verifier.plan(slots, num_drafts, non_draft, num_sampling, ahead=True)
    picked = ranked[keep] * (np.arange(k) < counts[:, None])
    got = verifier.recut(
        picked,
        int(counts.sum()),
        slots.shape[0],
        int(non_draft.sum()),
        num_sampling,
        int(counts.max()),
    )
    assert got == expected


def test_recut_by_hand():
    """One request recorded at survival 0.9, 0.81, 0.729 (K = 3) beside a 20-token prompt
    chunk; verify costs 10 ms to 40 tokens, then 20 ms; no drafter price. Decoding alone
    (1 token) every draft pays (3.44 / 10). With the chunk the step has 21 tokens: the
    drafts' marginal cost is 0 up to 19 more tokens, so all three still pay, and at a
    step of 38 tokens the third crosses 40: (1 + 1.71) / 10 beats (1 + 2.439) / 20."""
    from dspark.scheduling import CostTables

    verify = np.where(np.arange(64) <= 40, 10.0, 20.0)
    tables = CostTables(draft_ms=np.zeros(3), verify_ms=verify)
    verifier = AdaptiveVerifier(2, 3, tables, max_total_logits=64)
    verifier.add_request(0)
    verifier.record(np.array([0]), np.array([[0.9, 0.9, 0.9]]))
    _, _, ranked = verifier.plan_ranking(np.array([0]), np.array([3]), np.array([1]), 1)
    assert np.allclose(ranked, [[0.9, 0.81, 0.729]])
    assert verifier.recut(ranked, 3, 1, 1, 1, 3) == 3
    assert verifier.recut(ranked, 3, 2, 21, 1, 3) == 3
    assert verifier.recut(ranked, 3, 2, 38, 1, 3) == 2


def test_recut_rejects_bad_input():
    """``recut`` names what is wrong: rows of another K, more rows than requests, fewer
    tokens than requests, more sampling than requests, a depth past K."""
    verifier = make(4, 3)
    rows = np.full((2, 3), 0.5)
    for kwargs, named in [
        ({"survival": np.full((2, 4), 0.5)}, "survival must be"),
        ({"num_reqs": 1}, "more than num_reqs"),
        ({"num_tokens": 1}, "num_tokens must be"),
        ({"num_sampling": 3}, "num_sampling must be"),
        ({"depth": 4}, "depth must be"),
        ({"num_drafts": -1}, "num_drafts must be"),
    ]:
        args = {"survival": rows, "num_drafts": 6, "num_reqs": 2, "num_tokens": 2}
        args |= {"num_sampling": 2, "depth": 3} | kwargs
        with pytest.raises(ValueError, match=named):
            verifier.recut(**args)
    # The same arguments, valid: every draft pays at 0.25 ms a token on a 1 ms step.
    assert verifier.recut(rows, 6, 2, 2, 2, 3) == 6
