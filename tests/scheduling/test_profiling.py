import numpy as np
import pytest

from dspark.scheduling import StepTiming, cost_curves, profile_sizes


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


def _isotonic_oracle(values: list[float]) -> list[float]:
    """The min-max formula: the fit at i is max over j <= i of min over k >= i of the
    mean of values[j..k]."""
    n = len(values)
    return [
        max(min(float(np.mean(values[j : k + 1])) for k in range(i, n)) for j in range(i + 1))
        for i in range(n)
    ]
