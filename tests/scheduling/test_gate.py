import pytest

from dspark.scheduling.gate import ThroughputGate


def drive(gate, num_reqs, drafted_rate, undrafted_rate, steps):
    """Run ``steps`` decisions against fixed true rates; returns the drafted fraction."""
    drafted = 0
    for _ in range(steps):
        draft = gate.should_draft(num_reqs)
        drafted += draft
        gate.record(num_reqs, draft, 100, 100 / (drafted_rate if draft else undrafted_rate))
    return drafted / steps


def test_measures_both_arms_then_keeps_the_faster_exploring_the_other_periodically():
    gate = ThroughputGate(explore_every=10, min_steps=2)
    # Drafted first (the cost model asked for it), twice; then undrafted twice.
    assert [gate.should_draft(8) for _ in range(2)] == [True, True]
    for _ in range(2):
        gate.record(8, True, 30, 10.0)  # 3 tokens / ms
    assert [gate.should_draft(8) for _ in range(2)] == [False, False]
    for _ in range(2):
        gate.record(8, False, 50, 10.0)  # 5 tokens / ms
    assert gate.rates(8) == (3.0, 5.0)
    # Undrafted wins; decisions 5..20: only the 10th and 20th draft (exploration).
    choices = [gate.should_draft(8) for _ in range(16)]
    assert [i + 5 for i, c in enumerate(choices) if c] == [10, 20]


def test_follows_a_change_in_which_arm_is_faster():
    gate = ThroughputGate(explore_every=8)
    assert drive(gate, 64, drafted_rate=2.0, undrafted_rate=5.0, steps=400) < 0.2
    # The load drops: drafting becomes the faster arm; exploration notices (five
    # exploring steps move the drafted median of eight from 2 past 5), then it drafts
    # except for one exploring step in eight.
    assert drive(gate, 64, drafted_rate=9.0, undrafted_rate=5.0, steps=100) > 0.3
    assert drive(gate, 64, drafted_rate=9.0, undrafted_rate=5.0, steps=200) == 1 - 25 / 200


def test_batch_sizes_in_different_power_of_two_buckets_learn_separately():
    gate = ThroughputGate(explore_every=8)
    drive(gate, 1, drafted_rate=9.0, undrafted_rate=5.0, steps=100)
    drive(gate, 64, drafted_rate=2.0, undrafted_rate=5.0, steps=100)
    assert gate.bucket(64) == gate.bucket(127) != gate.bucket(128)
    fast, slow = gate.rates(1), gate.rates(100)
    assert fast[0] > fast[1] and slow[0] < slow[1]
    assert gate.rates(1000) == (None, None)


def test_rates_are_medians_of_the_last_window_steps():
    gate = ThroughputGate(window=3, min_steps=1)
    for tokens in (10, 30, 1000, 20):  # 10 falls out of the window; 1000 is an outlier
        gate.record(4, True, tokens, 1.0)
    assert gate.rates(4) == (30.0, None)


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="explore_every"):
        ThroughputGate(explore_every=1)
    with pytest.raises(ValueError, match="min_steps"):
        ThroughputGate(window=2, min_steps=3)
    with pytest.raises(ValueError, match="wall time"):
        ThroughputGate().record(4, True, 3, 0.0)
