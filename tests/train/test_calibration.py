"""ECE, AUROC and sequential temperature scaling against hand values and brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.train.calibration import (
    TEMPERATURE_GRID,
    auroc,
    calibration_report,
    ece,
    fit_sequential_temperatures,
    observed_survival,
    predicted_survival,
    sigmoid,
)


def test_ece_by_hand():
    # Bins of width 1/15: 0.05 and 0.06 share bin 0, 0.95 is in bin 14.
    predicted = np.array([0.05, 0.06, 0.95, 0.95])
    observed = np.array([0, 1, 1, 1])
    # bin 0: mean p 0.055, rate 0.5, weight 1/2; bin 14: mean 0.95, rate 1, weight 1/2
    assert np.isclose(ece(predicted, observed), 0.5 * 0.445 + 0.5 * 0.05)
    assert ece(np.array([0.3, 0.3, 0.3]), np.array([1, 0, 0])) < 0.0334


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40))
def test_auroc_equals_pair_counting(pairs):
    scores = np.array([s for s, _ in pairs], dtype=float)
    labels = np.array([y for _, y in pairs])
    value = auroc(scores, labels)
    positives, negatives = scores[labels], scores[~labels]
    if not positives.size or not negatives.size:
        assert np.isnan(value)
        return
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    assert np.isclose(value, wins / (positives.size * negatives.size))


def test_survival_is_the_cumulative_product_and_observation_the_prefix():
    logits = np.array([[0.0, 0.0, np.log(3.0)]])
    np.testing.assert_allclose(predicted_survival(logits), [[0.5, 0.25, 0.1875]])
    np.testing.assert_allclose(
        predicted_survival(logits, [1.0, 1.0, 2 * np.log(3.0)]), [[0.5, 0.25, 0.25 * sigmoid(0.5)]]
    )
    np.testing.assert_array_equal(
        observed_survival(np.array([0, 2, 3]), 3),
        [[False, False, False], [True, True, False], [True, True, True]],
    )


def synthetic_rounds(n=40_000, k=4, true_scale=(0.5, 2.0, 1.0, 0.7), seed=0):
    """Rounds whose raw logits are miscalibrated: the true conditional acceptance at
    position i is sigmoid(logit / true_scale[i])."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.5, 2.0, size=(n, k))
    probs = sigmoid(logits / np.array(true_scale))
    accept = rng.random((n, k)) < probs
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    return logits, accepted, np.array(true_scale)


def test_sts_recovers_the_temperatures_and_lowers_ece():
    logits, accepted, truth = synthetic_rounds()
    temperatures, shifts = fit_sequential_temperatures(logits[:20_000], accepted[:20_000])
    np.testing.assert_allclose(temperatures, truth, rtol=0.15)
    assert not shifts.any()  # plain STS
    held_out = logits[20_000:], accepted[20_000:]
    before = calibration_report(*held_out, None)
    after = calibration_report(*held_out, temperatures)
    assert max(after["ece"]) < 0.01 < max(before["ece"])
    assert all(a <= b + 1e-3 for a, b in zip(after["ece"], before["ece"], strict=True))


def test_shifts_remove_a_constant_overconfidence_that_temperatures_cannot():
    rng = np.random.default_rng(1)
    n, k = 40_000, 3
    logits = rng.normal(0.0, 1.5, size=(n, k))
    accept = rng.random((n, k)) < sigmoid(logits - 0.8)  # the head is 0.8 logits too high
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    half = n // 2
    # Every fourth temperature of the grid (1.0 among them): the joint search over shifts
    # and temperatures costs a quarter of the full grid's.
    grid = TEMPERATURE_GRID[::4]
    plain, _ = fit_sequential_temperatures(logits[:half], accepted[:half], grid)
    temperatures, shifts = fit_sequential_temperatures(
        logits[:half], accepted[:half], grid, shift=True
    )
    np.testing.assert_allclose(shifts, -0.8, atol=0.15)
    np.testing.assert_allclose(temperatures, 1.0, atol=0.2)
    only_t = calibration_report(logits[half:], accepted[half:], plain)
    both = calibration_report(logits[half:], accepted[half:], temperatures, shifts)
    assert max(both["ece"]) < 0.01 < only_t["ece"][0]


def test_vectorised_ece_matches_the_loop():
    from dspark.train.calibration import ece_columns

    rng = np.random.default_rng(2)
    predicted = rng.random((500, 9))
    observed = (rng.random(500) < 0.4).astype(float)
    expected = [ece(predicted[:, j], observed) for j in range(9)]
    np.testing.assert_allclose(ece_columns(predicted, observed), expected)
