import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dspark.scheduling.survival as survival_module
from dspark.scheduling.survival import (
    bin_keys,
    scores_in_bins,
    sorting_is_faster,
    survival_by_position,
)
from tests.oracles import survival_rows

unit = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 0.5, 2.0**-1074, 1.0 - 2.0**-53]), st.floats(0, 1)
)


@pytest.mark.parametrize("num_bins", [1, 64, 256, 4096])
@settings(max_examples=100, deadline=None)
@given(scores=hnp.arrays(np.float64, st.integers(1, 200), elements=unit))
def test_bin_keys_run_from_the_top_and_never_rise_with_the_score(num_bins, scores):
    keys = bin_keys(scores, num_bins)
    assert keys.dtype == np.int64
    assert ((0 <= keys) & (keys <= num_bins)).all()
    # round((1 - score) * num_bins), up to the rounding of 1 - score itself.
    assert (np.abs(keys - (1.0 - scores) * num_bins) <= 0.5 + 1e-9).all()
    order = np.argsort(scores, kind="stable")
    assert (np.diff(keys[order]) <= 0).all()


def test_bin_keys_of_the_ends_and_of_grid_points():
    scores = np.array([1.0, 0.75, 0.5, 0.25, 0.0, -0.0])
    assert bin_keys(scores, 4).tolist() == [0, 1, 2, 3, 4, 4]
    assert bin_keys(scores, 64).tolist() == [0, 16, 32, 48, 64, 64]


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(np.float64, st.integers(1, 300), elements=unit),
    st.integers(0, 16),
    st.integers(0, 16),
)
def test_scores_in_bins_selects_exactly_the_keys_in_range(scores, low, width):
    keys = bin_keys(scores, 16)
    high = min(low + width, 16)
    inside = scores_in_bins(scores, keys, low, high)
    expected = scores[(keys >= low) & (keys <= high)]
    assert sorted(inside.tolist()) == sorted(expected.tolist())


@pytest.mark.parametrize("num_reqs", [3, 200])  # one accumulate call; a loop over positions
def test_survival_is_the_left_to_right_running_product(num_reqs):
    rng = np.random.default_rng(num_reqs)
    conf = rng.uniform(0, 1, (num_reqs, 5)).astype(np.float32)
    drafts = rng.integers(0, 6, num_reqs)
    survival = survival_by_position(conf, drafts)  # [K, num_reqs]
    expected = survival_rows(conf).T * (np.arange(5)[:, None] < drafts)
    assert np.array_equal(survival, expected)
    full = survival_by_position(conf, np.full(num_reqs, 5), True)
    assert np.array_equal(full, survival_rows(conf).T)


def test_ranking_choice_is_measured_once_per_size_class_and_can_be_pinned():
    calls = {"sort": [], "bins": []}

    def slow_sort(scores, rank):
        calls["sort"].append(scores.shape[0])
        time.sleep(0.002)

    def quick_bins(scores, rank):
        calls["bins"].append(scores.shape[0])

    wins: dict[int, bool] = {}
    limit = survival_module.SORT_MAX_SLOTS
    # Small batches always sort, without measuring.
    assert sorting_is_faster(wins, limit, slow_sort, quick_bins)
    assert calls == {"sort": [], "bins": []} and wins == {}
    # The first batch of a class measures both ways on the class's middle size...
    assert not sorting_is_faster(wins, 3000, slow_sort, quick_bins)
    rounds = survival_module._CALIBRATION_WARMUP + survival_module._CALIBRATION_ROUNDS
    rounds *= survival_module._CALIBRATION_BLOCK  # each way a few calls in a row a round
    assert len(calls["sort"]) == len(calls["bins"]) == rounds
    assert 2048 <= calls["sort"][0] < 4096 and set(calls["sort"]) == set(calls["bins"])
    # ...and every later batch of the class reuses the answer; another class measures.
    assert not sorting_is_faster(wins, 4095, slow_sort, quick_bins)
    assert len(calls["sort"]) == rounds and list(wins) == [12]
    assert sorting_is_faster(wins, 5000, quick_bins, slow_sort)  # here sorting is quicker
    assert wins == {12: False, 13: True}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(survival_module, "RANKING", "bins")
        assert not sorting_is_faster(wins, 1, quick_bins, slow_sort)
        patch.setattr(survival_module, "RANKING", "sort")
        assert sorting_is_faster(wins, 4000, slow_sort, quick_bins)


def test_sorting_must_win_by_the_margin(monkeypatch):
    """With a clock that each call advances by a fixed time: sorting 5% faster than
    binning is not enough (a tie, within a machine's noise), 20% faster is; each way's
    calls are timed in blocks, all but each block's first."""
    clock = {"now": 0}
    monkeypatch.setattr(survival_module.time, "perf_counter_ns", lambda: clock["now"])
    timed = []

    def way(cost_ns):
        def call(scores, rank):
            clock["now"] += cost_ns
            timed.append(cost_ns)

        return call

    block = survival_module._CALIBRATION_BLOCK
    assert 0.85 < survival_module._SORT_MARGIN < 0.95
    assert not survival_module._sorting_measured_faster(11, way(95_000), way(100_000))
    assert survival_module._sorting_measured_faster(11, way(80_000), way(100_000))
    rounds = survival_module._CALIBRATION_WARMUP + survival_module._CALIBRATION_ROUNDS
    assert len(timed) == 2 * 2 * rounds * block
