import numpy as np
import pytest

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


def test_drafting_pays_reads_the_latest_record_and_relax_retries_skipped_slots():
    from dspark.scheduling import CostTables

    tables = CostTables(draft_ms=np.full(3, 4.0), verify_ms=10.0 + 0.1 * np.arange(20.0))
    verifier = AdaptiveVerifier(2, 2, tables, max_total_logits=16)
    verifier.add_request(0)
    args = (np.array([0]), np.array([2]), np.array([1]), 1)
    verifier.record(np.array([0]), np.array([[0.9, 0.9]]))
    # Population: 0.9 · 1 + 0.1 · [0.9, 0.81] = [0.99, 0.981].
    np.testing.assert_allclose(verifier.population_survival, [0.99, 0.981])
    verifier.record(np.array([0]), np.array([[0.1, 0.5]]))
    # Population: 0.9 · [0.99, 0.981] + 0.1 · [0.1, 0.05] = [0.901, 0.8879].
    np.testing.assert_allclose(verifier.population_survival, [0.901, 0.8879])
    # The latest record (survival [0.1, 0.05]) decides, not the stale [0.9, 0.81]:
    # without the drafter 1 / 10.1 = 0.099 tok/ms; with it at most 1.15 / 14.3 = 0.080.
    assert verifier.drafting_pays(*args) == 0
    # The plan (stale, the seed's semantics) still sees [0.9, 0.81].
    assert verifier.plan(*args) == 2
    verifier.relax(np.array([0]))
    # Halfway to the population: [0.5005, 0.46895]; (1 + 0.96945) / 14.3 = 0.1377 > 0.099.
    assert verifier.drafting_pays(*args) == 2
    with pytest.raises(ValueError, match="weight"):
        verifier.relax(np.array([0]), weight=1.5)
    with pytest.raises(ValueError, match="no request"):
        verifier.relax(np.array([1]))


def test_the_budget_reuses_the_gates_search_only_when_its_inputs_are_the_same():
    class Counting:
        calls = 0

        def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
            Counting.calls += 1
            return 10.0 + 0.7 * np.arange(max_drafts + 1)

    verifier = AdaptiveVerifier(3, 3, Counting(), max_total_logits=64)
    for slot in range(3):
        verifier.add_request(slot)
    slots, drafts, non_draft = np.arange(3), np.array([3, 3, 3]), np.ones(3, dtype=int)
    rng = np.random.default_rng(0)
    previous = np.ones((3, 3))  # new slots start at 1.0
    for _ in range(6):
        fresh = rng.uniform(0.05, 0.95, (3, 3))
        calls = Counting.calls
        verifier.drafting_pays(slots, drafts, non_draft, 3)
        verifier.record(slots, fresh)  # the rows the gate read become the stale ones
        budget = verifier.plan(slots, drafts, non_draft, 3)
        assert Counting.calls == calls + 1  # one search for the gate and the budget
        # And it is the seed's answer on the stale confidences.
        assert budget == choose_draft_budget(previous, drafts, non_draft, 3, Counting(), 64)
        previous = fresh
        # Different inputs (one request drafts less): searched again.
        calls = Counting.calls
        verifier.plan(slots, np.array([3, 2, 3]), non_draft, 3)
        assert Counting.calls == calls + 1


def test_a_learning_cost_model_invalidates_the_plan_memo():
    class Versioned:
        version = 0
        calls = 0

        def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
            Versioned.calls += 1
            return 1.0 + 0.01 * np.arange(max_drafts + 1)

    cost = Versioned()
    verifier = AdaptiveVerifier(4, 3, cost, max_total_logits=64)
    slots = np.arange(2)
    for slot in slots:
        verifier.add_request(slot)
    args = (slots, np.full(2, 3), np.ones(2, dtype=np.int64), 2)
    verifier.plan(*args)
    verifier.plan(*args)
    assert Versioned.calls == 1  # same inputs, same model: the search ran once
    cost.version = 1
    verifier.plan(*args)
    assert Versioned.calls == 2
