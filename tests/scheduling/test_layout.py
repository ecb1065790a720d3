import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dspark.scheduling import upper_bound_split, verification_layout


def test_layout_offsets_by_hand():
    qsl, cu_logits = verification_layout([2, 0, 3], [1, 5, 1])
    assert qsl.tolist() == [0, 3, 8, 12]
    assert cu_logits.tolist() == [0, 3, 4, 8]


def test_padded_tail_repeats_the_total():
    qsl, _ = verification_layout([1, 1], [1, 1], padded_len=4)
    assert qsl.tolist() == [0, 2, 4, 4, 4]


def test_layout_rejects_short_padding_and_mismatched_lengths():
    with pytest.raises(ValueError, match="padded_len"):
        verification_layout([1, 1], [1, 1], padded_len=1)
    with pytest.raises(ValueError, match="num_non_draft must have length 2"):
        verification_layout([1, 1], [1])
    with pytest.raises(ValueError, match="admitted must be non-negative"):
        verification_layout([-1, 1], [1, 1])


def test_upper_bound_split_spreads_budget_evenly_over_verifying_requests():
    tokens, cu_logits = upper_bound_split([3, 3, 0, 2], [1, 1, 4, 1], budget=5)
    # 5 drafts over 3 verifying requests: 2, 2, 1 in batch order; total exact.
    assert tokens.tolist() == [3, 3, 4, 2]
    assert tokens.sum() == 4 + 1 + 1 + 1 + 5
    # The logits layout stays the scheduled one: an upper bound.
    assert cu_logits.tolist() == [0, 4, 8, 9, 12]


def test_upper_bound_split_is_exact_at_zero_and_full_budgets():
    tokens, cu_logits = upper_bound_split([3, 0, 2], [1, 4, 1], budget=0)
    assert tokens.tolist() == [1, 4, 1]
    assert cu_logits.tolist() == [0, 1, 2, 3]
    tokens, cu_logits = upper_bound_split([3, 0, 2], [1, 4, 1], budget=5)
    assert tokens.tolist() == [4, 4, 3]
    assert cu_logits.tolist() == [0, 4, 5, 8]


def test_upper_bound_split_rejects_budget_beyond_drafts():
    with pytest.raises(ValueError, match="budget must be at most"):
        upper_bound_split([1, 1], [1, 1], budget=3)


@given(
    st.lists(st.tuples(st.integers(0, 7), st.integers(1, 9)), min_size=1, max_size=20),
    st.integers(0, 2),
)
def test_layout_is_consistent_with_counts(rows, bonus):
    admitted = np.array([a for a, _ in rows])
    non_draft = np.array([t for _, t in rows])
    qsl, cu_logits = verification_layout(admitted, non_draft, bonus)
    assert (np.diff(qsl) == admitted + non_draft).all()
    assert (np.diff(cu_logits) == admitted + bonus).all()
    assert qsl[0] == 0 and cu_logits[0] == 0
