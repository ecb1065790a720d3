import numpy as np
import pytest

from dspark.scheduling.ceiling import INCUMBENT, TRIAL, DepthCeiling


def drive(ceiling, steps, num_reqs, survival, ms_per_depth, seed=0, base_ms=5.0):
    """A synthetic engine: each step the cost model wants a depth (mostly deep); the step
    drafts ``min(wanted, ceiling)`` and emits, per request, one token plus each position
    that survives (``survival[i]``: the chance position ``i + 1`` is accepted, a prefix),
    in ``base_ms + ms_per_depth * depth`` with 3% noise. Returns the depths drafted."""
    rng = np.random.default_rng(seed)
    k = len(survival)
    drafted = []
    for _ in range(steps):
        wanted = int(
            rng.choice(np.arange(1, k + 1), p=np.linspace(1, 3, k) / np.linspace(1, 3, k).sum())
        )
        depth, arm = ceiling.decide(num_reqs, wanted)
        assert 1 <= depth <= wanted
        drafted.append(depth)
        alive = rng.random((num_reqs, depth)) < np.asarray(survival[:depth])
        tokens = num_reqs + int(np.cumprod(alive, axis=1).sum())
        wall = (base_ms + ms_per_depth * depth) * (1.0 + 0.03 * rng.standard_normal())
        if arm is not None:
            ceiling.record(arm, tokens, wall)
    return drafted


# Conditional survival of each position given the previous one survived; as a prefix
# the absolute survival is the product. SmolLM2-like: the first positions carry most.
SHALLOW = [0.42, 0.44, 0.49, 0.49, 0.5, 0.5, 0.5]
DEEP = [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]


def best_ceiling(survival, ms_per_depth, base_ms=5.0, num_reqs=16):
    """The ceiling with the most expected tokens per ms when every step is capped at it
    (the oracle the search should find, for steps that want the full depth)."""
    absolute = np.cumprod(survival)
    rates = [
        (num_reqs * (1 + absolute[:c].sum())) / (base_ms + ms_per_depth * c)
        for c in range(1, len(survival) + 1)
    ]
    return int(np.argmax(rates)) + 1, rates


def test_the_oracle_cases_are_what_the_tests_claim():
    # a hand check of the scenarios below: costly depths favour a shallow ceiling
    assert best_ceiling(SHALLOW, 0.45)[0] in (2, 3)
    assert best_ceiling(DEEP, 0.1)[0] == 7


def test_a_costly_depth_moves_the_ceiling_down_to_near_the_best():
    ceiling = DepthCeiling(7)
    drafted = drive(ceiling, 4000, 16, SHALLOW, ms_per_depth=0.45)
    best, rates = best_ceiling(SHALLOW, 0.45)
    found = ceiling.ceilings()[16]
    assert found <= 4 and ceiling.moves >= 1
    # within a few percent of the oracle's rate (the full depth is 20% behind it)
    assert rates[found - 1] >= 0.93 * rates[best - 1] > 1.15 * rates[-1], (found, best, rates)
    # and the late steps mostly draft at or below it
    late = np.array(drafted[-500:])
    assert np.mean(late <= found) > 0.9


def test_cheap_deep_drafts_keep_the_full_depth():
    ceiling = DepthCeiling(7)
    drive(ceiling, 4000, 16, DEEP, ms_per_depth=0.1)
    assert ceiling.ceilings()[16] == 7


def test_equal_ceilings_keep_the_cost_models_choice():
    # The wall grows with the depth exactly as the tokens do: every ceiling is equally
    # fast, and a tie keeps the incumbent.
    ceiling = DepthCeiling(4, confidence=2.0)
    rng = np.random.default_rng(3)
    for _ in range(3000):
        depth, arm = ceiling.decide(8, 4)
        if arm is not None:
            tokens = 8 * (1 + depth)
            ceiling.record(arm, tokens, tokens * 0.2 * (1 + 0.05 * rng.standard_normal()))
    assert ceiling.ceilings()[8] == 4
    assert ceiling.moves == 0


def test_steps_that_either_ceiling_allows_are_not_measured():
    ceiling = DepthCeiling(7)
    search_trial = 4  # from 7 over [1, 7]: the midpoint of the wider (lower) side
    depth, arm = ceiling.decide(16, 3)
    assert (depth, arm) == (3, None)
    depth, arm = ceiling.decide(16, search_trial)
    assert (depth, arm) == (4, None)
    # a deeper choice is informative: the incumbent first, then the trial (every other
    # decision while the trial has few steps)
    assert ceiling.decide(16, 6) == (6, (5, 0, INCUMBENT))
    assert ceiling.decide(16, 6) == (4, (5, 0, TRIAL))
    assert ceiling.decide(16, 7) == (7, (5, 0, INCUMBENT))


def test_buckets_search_apart_and_a_settled_bucket_caps_without_exploring():
    ceiling = DepthCeiling(2, window=4, min_steps=2, explore_every=2)
    # depth 2 against a trial of 1 at 4 requests (bucket 4-7): the trial clearly faster
    for _ in range(40):
        depth, arm = ceiling.decide(5, 2)
        if arm is not None:
            ceiling.record(arm, 10, 1.0 if depth == 1 else 3.0)
    assert ceiling.ceilings() == {4: 1}
    # settled on 1 (the range holds it alone): capped, nothing measured
    assert ceiling.decide(6, 2) == (1, None)
    # another bucket still starts from the full depth
    assert ceiling.decide(1, 2) == (2, (1, 0, INCUMBENT))


def test_a_settled_bucket_reopens_to_its_neighbours():
    ceiling = DepthCeiling(
        3, window=4, min_steps=2, explore_every=2, confidence=0.5, reopen_after=5
    )
    for _ in range(60):  # 1 is fastest: 3 -> trial 2 wins -> trial 1 wins, settled
        depth, arm = ceiling.decide(2, 3)
        if arm is None:
            break
        ceiling.record(arm, 10, float(depth))
    assert ceiling.ceilings() == {2: 1} and ceiling.moves == 2
    for _ in range(4):  # the settled decision above counted as the first of five
        assert ceiling.decide(2, 3) == (1, None)
    # reopened: the neighbour above is tried again
    decisions = [ceiling.decide(2, 3) for _ in range(2)]
    assert decisions == [(1, (2, 3, INCUMBENT)), (2, (2, 3, TRIAL))]  # the third pair


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_depth": 0}, "max_depth"),
        ({"max_depth": 3, "min_steps": 9, "window": 8}, "min_steps"),
        ({"max_depth": 3, "explore_every": 1}, "explore_every"),
        ({"max_depth": 3, "confidence": float("nan")}, "confidence"),
        ({"max_depth": 3, "reopen_after": 0}, "reopen_after"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DepthCeiling(**kwargs)


def test_bad_steps_are_refused():
    ceiling = DepthCeiling(3)
    with pytest.raises(ValueError, match="depth"):
        ceiling.decide(4, 0)
    _, arm = ceiling.decide(4, 3)
    with pytest.raises(ValueError, match="wall time"):
        ceiling.record(arm, 5, 0.0)
    with pytest.raises(ValueError, match="token count"):
        ceiling.record(arm, -1, 1.0)


def test_each_judgement_starts_both_windows_afresh():
    # A kept window would compare steps of one pair's subset with another's: a move from
    # 3 to 2 is judged again only on steps measured after it, on both arms.
    ceiling = DepthCeiling(3, window=4, min_steps=2, explore_every=2, confidence=0.5)
    search = None
    while ceiling.moves == 0:
        depth, arm = ceiling.decide(2, 3)
        ceiling.record(arm, 10, float(depth))
        search = ceiling._searches[arm[0]]
    assert search.ceiling == 2 and search.trial == 1
    assert [len(w.steps) for w in search.windows] == [0, 0]


def test_a_losing_trial_narrows_the_range_and_the_search_settles():
    # 2 is slower than 3: the trial (2) loses, the range becomes [3, 3], nothing more
    # is explored and every later step keeps the full depth.
    ceiling = DepthCeiling(3, window=8, min_steps=4, explore_every=2, confidence=0.5)
    for _ in range(40):
        depth, arm = ceiling.decide(4, 3)
        if arm is None:
            break
        ceiling.record(arm, 10, 1.0 if depth == 3 else 3.0)
    search = ceiling._searches[3]
    assert (search.lo, search.ceiling, search.hi, search.trial) == (3, 3, 3, None)
    assert ceiling.moves == 0 and ceiling.decide(4, 3) == (3, None)


def test_a_tie_is_dropped_once_the_trial_window_is_full():
    # Equal rates, bounds too wide to tell (confidence inf): the trial is judged when its
    # window fills, whatever min_steps says, and dropped; the incumbent stays.
    ceiling = DepthCeiling(2, window=5, min_steps=3, explore_every=2, confidence=float("inf"))
    trial_steps = 0
    while ceiling._searches.get(1) is None or ceiling._searches[1].trial is not None:
        _, arm = ceiling.decide(1, 2)
        trial_steps += arm[2] == TRIAL
        ceiling.record(arm, 10, 1.0)
        assert trial_steps <= 5
    assert trial_steps == 5 and ceiling.ceilings() == {1: 2} and ceiling.moves == 0


def test_a_record_for_an_earlier_pair_is_dropped():
    ceiling = DepthCeiling(3, window=4, min_steps=2, explore_every=2, confidence=0.5)
    _, stale = ceiling.decide(2, 3)  # decided, not yet recorded
    while ceiling.moves == 0:  # meanwhile other steps move 3 -> 2
        depth, arm = ceiling.decide(2, 3)
        ceiling.record(arm, 10, float(depth))
    search = ceiling._searches[2]
    ceiling.record(stale, 10, 100.0)  # a 3-deep step: not the new pair's to count
    assert [len(w.steps) for w in search.windows] == [0, 0]
