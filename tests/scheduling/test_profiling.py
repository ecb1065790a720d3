import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.scheduling import StepTiming, cost_curves, profile_sizes
from dspark.scheduling.profiling import monotone_curve


def test_profile_sizes_adds_tail_past_capture_limit():
    # 1.5 x 512 = 768, then doubling 1024, 2048, 4096, capped at 5000.
    assert profile_sizes([1, 2, 4, 512], 5000) == [1, 2, 4, 512, 768, 1024, 2048, 4096, 5000]


def test_profile_sizes_caps_tail_and_drops_duplicates():
    # 1.5 x 8 = 12 and 16 both exceed 10, so the tail collapses to the cap.
    assert profile_sizes([2, 8], 10) == [2, 8, 10]
    # The cap equal to a capture size is not repeated.
    assert profile_sizes([4, 8], 8) == [4, 8]


def test_profile_sizes_without_captures_profiles_nothing():
    assert profile_sizes([], 64) == []


@pytest.mark.parametrize("sizes", [[4, 2], [0, 1], [-1, 2]])
def test_profile_sizes_rejects_bad_capture_sizes(sizes):
    with pytest.raises(ValueError, match="capture_sizes"):
        profile_sizes(sizes, 64)


def sample(num_reqs, tokens, forward, drafter, graph=True):
    return StepTiming(num_reqs, tokens, forward, drafter, graph)


def test_cost_curves_take_medians_and_graph_samples_for_drafts():
    samples = [
        sample(4, 8, 1.0, 0.5),
        sample(4, 8, 3.0, 0.7),
        sample(4, 8, 2.0, 0.6),
        sample(4, 16, 5.0, 9.0, graph=False),  # eager: prices verify, never draft
        sample(8, 16, 7.0, 1.0),
    ]
    draft, verify = cost_curves(samples)
    assert draft == [(4, 0.6), (8, 1.0)]
    assert verify == [(8, 2.0), (16, 6.0)]


def test_cost_curves_without_graph_samples_is_a_clear_error():
    with pytest.raises(ValueError, match="adaptive verification off"):
        cost_curves([sample(1, 1, 1.0, 1.0, graph=False)])
    with pytest.raises(ValueError, match="empty"):
        cost_curves([])


def test_step_timing_rejects_nonsense():
    with pytest.raises(ValueError, match="non-negative"):
        StepTiming(-1, 4, 1.0, 1.0, True)
    with pytest.raises(ValueError, match="finite"):
        StepTiming(1, 4, float("nan"), 1.0, True)


def test_monotone_curve_pools_a_fall_with_its_neighbours():
    # 3 then 2 pool to 2.5; then 1 falls below 2.5 and pools all three to 2.0.
    curve = [(1, 1.0), (2, 3.0), (4, 2.0), (8, 4.0)]
    assert monotone_curve(curve) == [(1, 1.0), (2, 2.5), (4, 2.5), (8, 4.0)]
    assert monotone_curve([(1, 3.0), (2, 2.0), (4, 1.0)]) == [(1, 2.0), (2, 2.0), (4, 2.0)]


def test_monotone_curve_keeps_a_rise_the_running_maximum_hides():
    # A launch-bound profile: ~4 ms everywhere, one slow median at 4 tokens, and a real
    # rise at 80 tokens. The running maximum prices 16..80 flat at 5.0; the fit keeps
    # the rise.
    curve = [(1, 4.0), (4, 5.0), (16, 3.9), (32, 3.9), (64, 3.8), (80, 4.4), (96, 4.5)]
    fitted = dict(monotone_curve(curve))
    assert fitted[64] == pytest.approx((5.0 + 3.9 + 3.9 + 3.8) / 4)  # 4..64 pooled: 4.15
    assert fitted[80] == 4.4  # 0.25 ms above 64 tokens, where the maximum sees none
    assert np.maximum.accumulate([ms for _, ms in curve])[5] == 5.0  # the seed's: flat


def test_monotone_curve_leaves_a_rising_curve_alone():
    curve = [(1, 1.0), (2, 1.0), (4, 2.5), (8, 7.0)]
    assert monotone_curve(curve) == curve
    assert monotone_curve([]) == []


def _isotonic_oracle(values: list[float]) -> list[float]:
    """The min-max formula: the fit at i is max over j <= i of min over k >= i of the
    mean of values[j..k]."""
    n = len(values)
    return [
        max(min(float(np.mean(values[j : k + 1])) for k in range(i, n)) for j in range(i + 1))
        for i in range(n)
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12))
def test_monotone_curve_is_the_least_squares_non_decreasing_fit(values):
    curve = [(size, ms) for size, ms in enumerate(values, start=1)]
    fitted = [ms for _, ms in monotone_curve(curve)]
    assert fitted == pytest.approx(_isotonic_oracle(values), abs=1e-9)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(fitted))
    assert sum(fitted) == pytest.approx(sum(values), abs=1e-9)  # pooling keeps the mass


@pytest.mark.parametrize(
    ("curve", "match"),
    [
        ([(2, 1.0), (1, 2.0)], "ascending"),
        ([(1, 1.0), (1, 2.0)], "ascending"),
        ([(1, float("nan"))], "finite"),
    ],
)
def test_monotone_curve_rejects_bad_curves(curve, match):
    with pytest.raises(ValueError, match=match):
        monotone_curve(curve)
