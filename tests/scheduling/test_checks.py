import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dspark.scheduling._checks import (
    as_confidences,
    as_draft_counts,
    as_non_negative_int,
    count_total,
)

special = st.sampled_from([0.0, -0.0, 1.0, 1.0 + 1e-7, 1.0 + 1e-16, -1e-30, np.nan, np.inf])


@given(
    st.sampled_from([np.float32, np.float64]),
    hnp.array_shapes(min_dims=2, max_dims=2, max_side=6),
    st.data(),
)
def test_confidence_check_accepts_exactly_the_unit_interval(dtype, shape, data):
    drawn = data.draw(hnp.arrays(np.float64, shape, elements=st.one_of(special, st.floats(-2, 2))))
    values = drawn.astype(dtype)  # the check sees exactly these values
    is_valid = bool(np.all((values >= 0) & (values <= 1)))  # NaN compares False
    if is_valid:
        assert as_confidences("c", values) is values
    else:
        with pytest.raises(ValueError, match="c must be probabilities"):
            as_confidences("c", values)


def test_draft_counts_summarise_the_batch():
    counts = as_draft_counts("d", np.array([7, 3, 0]), 3, 7)
    assert counts.total == 10 and not counts.is_full
    assert as_draft_counts("d", [7, 7], 2, 7).is_full
    with pytest.raises(ValueError, match="d must be non-negative"):
        as_draft_counts("d", np.array([1, -2]), 2, 7)
    with pytest.raises(ValueError, match="d must be at most K=7"):
        as_draft_counts("d", np.array([8]), 1, 7)
    with pytest.raises(ValueError, match="d must hold integers"):
        as_draft_counts("d", np.array([1.5]), 1, 7)


def test_count_total_sums_checked_counts():
    assert count_total("t", np.array([1, 8, 0]), 3) == 9
    assert count_total("t", [2.0, 3.0], 2) == 5
    assert count_total("t", np.array([], dtype=np.int64), 0) == 0
    with pytest.raises(ValueError, match="t must be non-negative"):
        count_total("t", np.array([1, -1]), 2)
    with pytest.raises(ValueError, match="t must have length 3"):
        count_total("t", np.array([1, 1]), 3)


def test_non_negative_int_accepts_python_and_numpy_integers_only():
    assert as_non_negative_int("n", 3) == 3
    assert as_non_negative_int("n", np.int64(3)) == 3
    for bad, message in [(True, "an integer"), (2.0, "an integer"), (-1, "non-negative")]:
        with pytest.raises(ValueError, match=f"n must be {message}"):
            as_non_negative_int("n", bad)
