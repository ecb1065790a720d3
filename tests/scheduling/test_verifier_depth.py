"""The verifier's drafting depth and its choice between a slot's own rounds and the
population's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.scheduling import AdaptiveVerifier, choose_draft_budget
from tests.scheduling.test_verifier import _brute_force_budget


def _depth_verifier(depth_ms, confidences, verify_per_token, k=3):
    """One request recorded once with ``confidences``; the drafter costs ``depth_ms[d]``
    at depth d (any request count) and verifying T tokens 10 + verify_per_token · T."""
    from dspark.scheduling import CostTables
    from dspark.scheduling.cost import ObservedDraftCost

    depth_ms = np.asarray(depth_ms, dtype=float)
    table = np.repeat(depth_ms[:, None], 3, axis=1)
    tables = CostTables(
        draft_ms=table[k].copy(), verify_ms=10.0 + verify_per_token * np.arange(40.0)
    )
    verifier = AdaptiveVerifier(2, k, ObservedDraftCost(tables, depth_ms=table), 64)
    verifier.add_request(0)
    verifier.record(np.array([0]), np.array([confidences]))
    return verifier


def test_drafting_depth_trades_deeper_drafts_against_what_they_cost_to_draft():
    args = (np.array([0]), np.array([3]), np.array([1]), 1)
    # Survival 0.9, 0.81, 0.729; verifying T tokens costs 10 + 0.5 T ms.
    #   no drafter: 1 / 10.5 = 0.0952 tok/ms
    #   depth 1 (1 ms): 1.9 / 12 = 0.158;  depth 2 (2 ms): 2.71 / 13.5 = 0.2007
    #   depth 3 (8 ms): 3.439 / 20 = 0.172
    assert _depth_verifier([0, 1, 2, 8], [0.9] * 3, 0.5).drafting_pays(*args) == 2
    # Every depth priced as the full block (the seed's model): the deepest plan wins.
    assert _depth_verifier([0, 8, 8, 8], [0.9] * 3, 0.5).drafting_pays(*args) == 3
    # A full block that never pays (1 / 10.5 beats 3.439 / 42) can still pay shallow:
    # depth 1 at 0.5 ms gives 1.9 / 11.5 = 0.165.
    assert _depth_verifier([0, 0.5, 30, 30], [0.9] * 3, 0.5).drafting_pays(*args) == 1


def test_the_budget_prices_the_drafter_at_the_depth_it_drafted():
    # Survival 0.3, 0.09; verifying T tokens costs 10 + 3 T ms. With the drafter at D ms
    # two drafts beat one when 1.39 / (D + 19) > 1.3 / (D + 16), i.e. D > 27.3.
    args = (np.array([0]), np.array([2]), np.array([1]), 1)
    cheap = _depth_verifier([0, 1, 2, 40], [0.3, 0.3, 0.3], 3.0)
    cheap.record(np.array([0]), np.array([[0.5] * 3]))  # the first record becomes stale
    assert cheap.plan(*args) == 1  # drafted 2 deep at 2 ms
    costly = _depth_verifier([0, 40, 40, 40], [0.3, 0.3, 0.3], 3.0)
    costly.record(np.array([0]), np.array([[0.5] * 3]))
    assert costly.plan(*args) == 2  # the same two drafts, but at 40 ms


def _random_depth_case(data):
    """A drawn batch of n requests (K drafts each, one round recorded), drafter prices by
    depth and a linear verify cost: the verifier, its ``drafting_pays`` arguments, the
    recorded survival ``[n, K]``, the drafter's cost by depth and the verify costs."""
    from dspark.scheduling import CostTables
    from dspark.scheduling.cost import ObservedDraftCost

    k = data.draw(st.integers(1, 4))
    n = data.draw(st.integers(1, 4))
    unit = st.floats(0.0, 1.0)
    confidences = np.array(
        data.draw(st.lists(st.lists(unit, min_size=k, max_size=k), min_size=n, max_size=n))
    )
    steps = data.draw(st.lists(st.floats(0.0, 5.0), min_size=k, max_size=k))
    depth_ms = np.concatenate([[0.0], np.cumsum(steps)])
    table = np.repeat(depth_ms[:, None], n + 1, axis=1)
    per_token = data.draw(st.floats(0.01, 3.0))
    verify = 5.0 + per_token * np.arange(n * (k + 1) + 1.0)
    tables = CostTables(draft_ms=table[k].copy(), verify_ms=verify)
    verifier = AdaptiveVerifier(n, k, ObservedDraftCost(tables, depth_ms=table), 1000)
    slots = np.arange(n)
    for slot in slots:
        verifier.add_request(int(slot))
    verifier.record(slots, confidences)
    args = (slots, np.full(n, k), np.ones(n, dtype=int), n)
    return verifier, args, np.cumprod(confidences, axis=1), depth_ms, verify


def _brute_depth_rates(survival, depth_ms, verify) -> np.ndarray:
    """``[K + 1]`` by brute force: tokens per ms without the drafter (index 0), then the
    best over every budget b of the top-b survival among the first d positions, at each
    drafting depth d."""
    n, k = survival.shape
    rates = [n / verify[n]]
    for depth in range(1, k + 1):
        ranked = np.sort(survival[:, :depth].ravel())[::-1]
        rates.append(
            max(
                (n + ranked[:b].sum()) / (depth_ms[depth] + verify[n + b])
                for b in range(1, ranked.size + 1)
            )
        )
    return np.array(rates)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_drafting_depth_is_the_best_depth_and_budget_by_brute_force(data):
    verifier, args, survival, depth_ms, verify = _random_depth_case(data)
    chosen = verifier.drafting_pays(*args)

    rates = _brute_depth_rates(survival, depth_ms, verify)
    without, best = rates[0], rates[1:].max()
    if chosen == 0:
        assert best <= without * (1 + 1e-9)
    else:
        assert rates[chosen] > without
        assert rates[chosen] >= best * (1 - 1e-9)


def test_probe_depth_is_the_best_drafted_plan_even_when_not_drafting_wins():
    args = (np.array([0]), np.array([3]), np.array([1]), 1)
    # A 30 ms drafter at every depth: 1.9 / 41, 2.71 / 41.5 and 3.439 / 42 tok/ms, all
    # below 1 / 10.5 without it; the best of them is 3 deep.
    verifier = _depth_verifier([0, 30, 30, 30], [0.9] * 3, 0.5)
    assert verifier.drafting_pays(*args) == 0
    assert verifier.probe_depth == 3
    # Nothing to draft: no probe either.
    assert verifier.drafting_pays(np.array([0]), np.array([0]), np.array([1]), 1) == 0
    assert verifier.probe_depth == 0


def _recorded_verifier(rounds, decay=1.0):
    """Two slots, ``rounds`` a list of [2, 2] confidences recorded in turn."""
    from dspark.scheduling import CostTables

    tables = CostTables(draft_ms=np.full(3, 4.0), verify_ms=10.0 + 0.1 * np.arange(20.0))
    verifier = AdaptiveVerifier(2, 2, tables, max_total_logits=16)
    verifier.predictiveness_decay = decay
    for slot in range(2):
        verifier.add_request(slot)
    for confidences in rounds:
        verifier.record(np.array([0, 1]), np.asarray(confidences))
    return verifier


def test_predictiveness_is_the_correlation_of_consecutive_rounds_of_a_slot():
    from dspark.scheduling.verifier import PREDICTIVENESS_MIN_PAIRS

    rng = np.random.default_rng(3)
    rounds = rng.uniform(0.2, 0.95, (40, 2, 2))
    # Make consecutive rounds of a slot related: each drifts from its previous one.
    for t in range(1, 40):
        rounds[t] = np.clip(0.6 * rounds[t - 1] + 0.4 * rounds[t], 0, 1)
    verifier = _recorded_verifier(rounds)
    # The brute-force oracle: expected accepted drafts c0 + c0·c1 per slot and round, and
    # the correlation over every (previous, next) pair of the same slot (decay 1: plain sums).
    expected = rounds[:, :, 0] + rounds[:, :, 0] * rounds[:, :, 1]  # [rounds, slots]
    pairs_x, pairs_y = expected[:-1].ravel(), expected[1:].ravel()
    assert pairs_x.shape[0] >= PREDICTIVENESS_MIN_PAIRS
    oracle = np.corrcoef(pairs_x, pairs_y)[0, 1]
    assert 0.3 < oracle < 1.0
    assert verifier.predictiveness == pytest.approx(oracle, rel=1e-9)
    # Too few pairs: the latest round is taken as it is.
    assert _recorded_verifier(rounds[:10]).predictiveness == 1.0
    # Rounds that repeat exactly have no spread within a slot but differ across slots:
    # fully predictive.
    same = [np.array([[0.9, 0.9], [0.3, 0.5]])] * 40
    assert _recorded_verifier(same).predictiveness == pytest.approx(1.0)


def test_a_small_batch_drafts_from_the_population_when_rounds_do_not_predict_each_other():
    # Independent rounds (as when acceptance is replayed round by round): the slot's last
    # round says nothing about its next, so a poor last round must not stop drafting.
    rng = np.random.default_rng(0)
    rounds = [rng.choice([0.1, 0.95], size=(2, 1)) * np.ones((2, 2)) for _ in range(80)]
    poor = np.array([[0.1, 0.1], [0.95, 0.95]])  # slot 0's last round looked poor
    verifier = _recorded_verifier([*rounds, poor], decay=0.99)
    assert abs(verifier.predictiveness) < 0.25  # measured, near zero
    args = (np.array([0]), np.array([2]), np.array([1]), 1)
    # Shrunk towards the population (about half the rounds at 0.95, half at 0.1), slot 0
    # is priced near the population's ~0.5 / 0.45 survival: drafting pays (1 / 10.1 =
    # 0.099 tok/ms without the drafter; about 1.9 / 14.3 = 0.13 with it).
    assert verifier.drafting_pays(*args) == 2
    # Taken as it is (fully predictive rounds), the poor round would stop it:
    # (1 + 0.1 + 0.01) / 14.3 = 0.078 < 0.099.
    persistent = [poor] * 80
    assert _recorded_verifier(persistent, decay=0.99).drafting_pays(*args) == 0
    # The budget of a lone request is planned from its predicted survival too: with
    # verifying at 3 ms a token, slot 0's poor stale round [0.1, 0.01] taken as is (the
    # seed) admits nothing (1 / 17 = 0.059 beats 1.1 / 20 = 0.055), where its prediction,
    # near the population's ~0.5 / 0.45, admits both drafts (about 1.95 / 23 = 0.085).
    from dspark.scheduling import CostTables

    population, weight = verifier.population_survival, verifier.predictiveness
    verifier.record(np.array([0, 1]), poor)  # the poor round becomes the stale one
    verifier.cost_model = CostTables(draft_ms=np.full(3, 4.0), verify_ms=10 + 3 * np.arange(20.0))
    assert choose_draft_budget(poor[:1], [2], [1], 1, verifier.cost_model, 16) == 0
    predicted = population + weight * (np.array([0.1, 0.01]) - population)
    assert 0.4 < predicted[0] < 0.6 and 0.35 < predicted[1] < 0.55
    assert verifier.plan(*args) == 2
    assert verifier.plan(*args) == _brute_force_budget(predicted[None], 1, verifier.cost_model)
    # Fully predictive rounds keep the seed's budget.
    persistent = _recorded_verifier([poor] * 81, decay=0.99)
    persistent.cost_model = verifier.cost_model
    assert persistent.predictiveness == pytest.approx(1.0)
    assert persistent.plan(*args) == 0
