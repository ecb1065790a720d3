import numpy as np
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
    gate = ThroughputGate(explore_every=10, window=2, min_steps=2, confidence=0.0)
    # Drafted first (the cost model asked for it), twice; then undrafted twice.
    assert [gate.should_draft(8) for _ in range(2)] == [True, True]
    for _ in range(2):
        gate.record(8, True, 30, 10.0)  # 3 tokens / ms
    assert [gate.should_draft(8) for _ in range(2)] == [False, False]
    for _ in range(2):
        gate.record(8, False, 50, 10.0)  # 5 tokens / ms
    assert gate.rates(8) == (3.0, 5.0)
    # Undrafted wins; both windows are full, so decisions 5..20 draft only at the 10th
    # and 20th (exploration).
    choices = [gate.should_draft(8) for _ in range(16)]
    assert [i + 5 for i, c in enumerate(choices) if c] == [10, 20]


def test_follows_a_change_in_which_arm_is_faster():
    gate = ThroughputGate(explore_every=8)
    assert drive(gate, 64, drafted_rate=2.0, undrafted_rate=5.0, steps=400) < 0.2
    # The load drops: drafting becomes the faster arm; exploration notices (13 of the
    # 16 drafted steps in the window must be new before the figure passes 5: about 104
    # decisions), then it drafts except for one exploring step in 32 (8, backed off 4x:
    # drafting leads 1.8x), counted from the last exploration: 6 of the next 200.
    assert drive(gate, 64, drafted_rate=9.0, undrafted_rate=5.0, steps=200) > 0.3
    assert drive(gate, 64, drafted_rate=9.0, undrafted_rate=5.0, steps=200) == 1 - 6 / 200


def test_batch_sizes_in_different_power_of_two_buckets_learn_separately():
    gate = ThroughputGate(explore_every=8)
    drive(gate, 1, drafted_rate=9.0, undrafted_rate=5.0, steps=100)
    drive(gate, 64, drafted_rate=2.0, undrafted_rate=5.0, steps=100)
    assert gate.bucket(64) == gate.bucket(127) != gate.bucket(128)
    fast, slow = gate.rates(1), gate.rates(100)
    assert fast[0] > fast[1] and slow[0] < slow[1]
    assert gate.rates(1000) == (None, None)


def test_rates_are_tokens_over_time_summed_over_the_last_window_steps():
    gate = ThroughputGate(window=3, min_steps=1)
    for tokens, wall in ((50, 1.0), (1, 2.0), (1, 2.0), (8, 4.0)):  # the first falls out
        gate.record(4, True, tokens, wall)
    assert gate.rates(4) == (10 / 8, None)


def test_skewed_token_counts_do_not_hide_the_faster_arm():
    """Drafted steps emit 1 token 60% of the time and 4 otherwise (mean 2.2 per 12 ms:
    0.183 tokens/ms); undrafted steps emit 1 per 8 ms (0.125). A median of per-step
    rates would see 1/12 for drafting and switch it off."""
    gate = ThroughputGate(explore_every=16)
    pattern = [1, 4, 1, 1, 4]
    drafted = 0
    for step in range(500):
        draft = gate.should_draft(1)
        drafted += draft
        gate.record(1, draft, pattern[step % 5] if draft else 1, 12.0 if draft else 8.0)
    assert drafted / 500 > 0.85


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="explore_every"):
        ThroughputGate(explore_every=1)
    with pytest.raises(ValueError, match="confidence"):
        ThroughputGate(confidence=-1.0)
    with pytest.raises(ValueError, match="confidence"):  # a NaN bound would never veto
        ThroughputGate(confidence=float("nan"))
    with pytest.raises(ValueError, match="alone_confidence"):
        ThroughputGate(alone_confidence=float("nan"))
    with pytest.raises(ValueError, match="alone_window"):
        ThroughputGate(alone_window=0)
    with pytest.raises(ValueError, match="min_steps"):
        ThroughputGate(window=2, min_steps=3)
    for wall in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="wall time"):
            ThroughputGate().record(4, True, 3, wall)


def test_slow_first_steps_of_an_arm_are_measured_again_soon():
    """Slow first drafted steps (first-call warm-up, few tokens accepted) must not keep
    drafting off for long: the arm measured less gets an optimistic bound, so it is
    measured again soon."""
    gate = ThroughputGate(explore_every=32, window=16, min_steps=3)
    for tokens, wall in ((1, 99.3), (1, 71.1), (2, 98.1)):  # 0.0149 tokens/ms
        assert gate.should_draft(1)
        gate.record(1, True, tokens, wall)
    for _ in range(3):
        assert not gate.should_draft(1)
        gate.record(1, False, 1, 60.0)  # 0.0167
    drafted_at = []
    for decision in range(7, 60):
        draft = gate.should_draft(1)
        if draft:
            drafted_at.append(decision)
        gate.record(1, draft, 3 if draft else 1, 70.0 if draft else 60.0)  # 0.043 vs 0.0167
    assert drafted_at[0] <= 10  # measured again within four decisions
    assert len(drafted_at) > 45  # and drafting took over


def test_an_arm_clearly_behind_is_rarely_explored():
    gate = ThroughputGate(explore_every=32)
    fraction = drive(gate, 16, drafted_rate=3.0, undrafted_rate=5.0, steps=640)
    assert fraction < 0.07  # the three first steps, a few optimistic ones, 1 in 32


def test_undrafted_steps_far_behind_are_explored_less_and_drafting_falls_back_at_once():
    gate = ThroughputGate(explore_every=32)
    # Drafting 2x faster: after the first measurements, one undrafted step in 128.
    drive(gate, 4, drafted_rate=10.0, undrafted_rate=5.0, steps=256)
    assert gate.rates(4)[1] == 5.0
    assert 1 - drive(gate, 4, drafted_rate=10.0, undrafted_rate=5.0, steps=1024) == 8 / 1024
    # 1.2x faster: the drafted arm's upper bound is 6 + 50 / 266.7 = 6.1875 tokens/ms (one
    # pseudo-step of 100 tokens over sqrt(4): the bucket's smallest size), the undrafted one's
    # 5.0: an exploring step gives up 19.2% of a step's tokens, so one every
    # 0.192 / 0.0025 = 76 decisions: decisions 304, 380, ..., 1216 (13) of 257..1280.
    close = ThroughputGate(explore_every=32)
    drive(close, 4, drafted_rate=6.0, undrafted_rate=5.0, steps=256)
    assert 1 - drive(close, 4, drafted_rate=6.0, undrafted_rate=5.0, steps=1024) == 13 / 1024
    # Barely faster (1.02x; bound 5.1 + 0.16 against 5.0): one in 32, the most often.
    level = ThroughputGate(explore_every=32)
    drive(level, 4, drafted_rate=5.1, undrafted_rate=5.0, steps=256)
    assert 1 - drive(level, 4, drafted_rate=5.1, undrafted_rate=5.0, steps=1024) == 32 / 1024
    # Acceptance collapses: the drafted arm's own steps show it, and the gate stops
    # drafting within a few steps, without waiting for an exploring step (then it
    # explores drafting at the full rate, one step in 32). Steps 5x slower than the
    # window's median count as 2x slower (a stall, OUTLIER_WALL) until they are half the
    # window: the eighth moves the median to 50 ms and ends drafting (1600 tokens over
    # 8 x 10 + 8 x 50 ms = 3.3 tokens/ms; with seven, 1600 / 230 ms = 7.0, above 5).
    choices = []
    for _ in range(96):
        draft = gate.should_draft(4)
        choices.append(draft)
        gate.record(4, draft, 100, 100 / (2.0 if draft else 5.0))
    first_undrafted = choices.index(False)
    assert first_undrafted == 8
    assert sum(choices[first_undrafted:]) <= 4


def test_confidence_zero_is_greedy_on_the_measured_rates():
    gate = ThroughputGate(explore_every=1000, min_steps=1, confidence=0.0)
    assert drive(gate, 2, drafted_rate=5.0, undrafted_rate=4.9, steps=200) > 0.98


def test_probes_of_declined_drafting_back_off_and_reset_per_bucket():
    gate = ThroughputGate(explore_every=4)
    waits = []
    for _ in range(4):  # declined steps until each probe: 4, then 8, 16, 16 (capped at 4x)
        count = 1
        while not gate.should_probe(8):
            count += 1
        waits.append(count)
    assert waits == [4, 8, 16, 16]
    # Another bucket counts on its own.
    assert [gate.should_probe(2) for _ in range(4)] == [False, False, False, True]
    # The cost model drafting on its own in the bucket resets the wait.
    gate.should_draft(9)
    assert [gate.should_probe(9) for _ in range(4)] == [False, False, False, True]


def test_an_unmeasured_bucket_follows_its_nearest_measured_neighbour():
    gate = ThroughputGate(explore_every=1000, min_steps=2)
    for _ in range(2):  # bucket of 4..7: undrafted 1 token/ms, drafted 3 tokens/ms
        gate.record(4, True, 30, 10.0)
        gate.record(4, False, 10, 10.0)
    # Requests 2..3 and 8..15 measured nothing: they follow the 4..7 bucket (draft),
    # instead of first measuring both arms (which starts with... drafting, then not).
    assert all(gate.should_draft(2) for _ in range(5))
    assert all(gate.should_draft(9) for _ in range(5))
    fresh = ThroughputGate(explore_every=1000, min_steps=2)
    fresh.record(4, True, 30, 10.0)
    fresh.record(4, True, 30, 10.0)
    # Nothing measured on both arms anywhere: measure the undrafted arm too.
    assert fresh.should_draft(4) is False


def test_steps_with_a_prompt_chunk_learn_apart_and_borrow_only_while_unmeasured():
    gate = ThroughputGate(explore_every=1000, min_steps=2)
    for _ in range(2):  # decoding steps of 8..15 requests: drafting 3 tokens/ms, not 1
        gate.record(8, True, 30, 10.0)
        gate.record(8, False, 10, 10.0)
    assert gate.rates(8, mixed=True) == (None, None)
    # Mixed steps have no figures yet: they follow the decoding bucket (draft).
    assert all(gate.should_draft(8, mixed=True) for _ in range(3))
    for _ in range(2):  # with a prompt chunk drafting loses: 1 token/ms against 2
        gate.record(8, True, 10, 10.0, mixed=True)
        gate.record(8, False, 20, 10.0, mixed=True)
    assert gate.rates(8, mixed=True) == (1.0, 2.0) and gate.rates(8) == (3.0, 1.0)
    assert not any(gate.should_draft(8, mixed=True) for _ in range(5))
    assert all(gate.should_draft(8) for _ in range(5))  # decoding steps still draft
    # A mixed bucket of another size follows the measured mixed one, not the decoding one.
    assert not any(gate.should_draft(40, mixed=True) for _ in range(5))


def test_a_lucky_streak_against_drafting_does_not_switch_it_off():
    """At one request a drafted step emits 1 to 8 tokens (the published chat acceptance,
    3.5 a step on average, in 11 ms) and an undrafted one exactly 1 (in 7.3 ms): drafting
    is 2.3x faster, yet 16 drafted steps in a row can average under 2 tokens. A bound
    that ignores that spread would veto drafting for whole exploration periods (over 100
    of these 300 steps); the standard error keeps such runs to the exploring steps (1 in
    128). Counted from step 64: three unlucky first drafted steps (1 token each, about 2%
    of runs) can still leave drafting off until the first exploration, at step 32."""
    import numpy as np

    from dspark.engine.replay import AcceptanceTrace

    accepted = AcceptanceTrace.from_published("chat", num_rounds=4000).accepted
    rng = np.random.default_rng(0)
    worst = []
    for _ in range(60):
        gate = ThroughputGate()
        vetoes = 0
        for step in range(300):
            if gate.should_draft(1):
                gate.record(1, True, int(accepted[rng.integers(len(accepted))]) + 1, 11.0)
            else:
                gate.record(1, False, 1, 7.3)
                vetoes += step >= 64
        worst.append(vetoes)
    assert max(worst) <= 3


def test_drafting_that_measures_clearly_faster_overrules_the_cost_model():
    gate = ThroughputGate(explore_every=8, window=4, min_steps=2)
    for tokens in (30, 34, 26, 30):  # drafted: 3 tokens/ms, a little spread
        gate.record(2, True, tokens, 10.0)
    for _ in range(4):
        gate.record(2, False, 10, 10.0)  # undrafted: 1 token/ms
    # By hand: drafted rate 120 / 40 = 3.0; squared deviations 0 + 16 + 16 + 0, plus the
    # pseudo-step (3.0 x 40 / 4)^2 = 900 over the bucket's smallest batch, 2: error
    # sqrt(482) / 40 = 0.55, lower bound 2.45, above the undrafted 1.0 (no spread: 0).
    rate, error = gate._get(2, False).rate_and_error(0)
    assert rate == 3.0
    assert error == pytest.approx(482**0.5 / 40)
    # The same steps at one request: the pseudo-step counts in full, sqrt(932) / 40.
    single = ThroughputGate(explore_every=8, window=4, min_steps=2)
    for tokens in (30, 34, 26, 30):
        single.record(1, True, tokens, 10.0)
    assert single._get(1, False).rate_and_error(0)[1] == pytest.approx(932**0.5 / 40)
    # Every declined step is drafted, but one in 8 (the undrafted figure stays current).
    choices = [gate.should_probe(2) for _ in range(16)]
    assert choices == [True] * 7 + [False] + [True] * 7 + [False]
    # A neighbouring bucket with nothing measured follows it.
    assert gate.should_probe(3)
    # Steps with a prompt chunk are not overruled, by their own lead nor a neighbour's:
    # only the probes' schedule (the first after 8 declined steps).
    for tokens in (30, 34, 26, 30):
        gate.record(2, True, tokens, 10.0, mixed=True)
        gate.record(2, False, 10, 10.0, mixed=True)
    assert [gate.should_probe(2, mixed=True) for _ in range(8)] == [False] * 7 + [True]


def test_an_overruling_lead_fades_when_drafting_the_declined_steps_does_not_pay():
    gate = ThroughputGate(explore_every=32, window=8, min_steps=2)
    for _ in range(8):
        gate.record(1, True, 40, 10.0)  # drafted when confidences looked good: 4 tok/ms
        gate.record(1, False, 10, 10.0)  # 1 token/ms
    choices = []
    for _ in range(40):
        choices.append(gate.should_probe(1))
        if choices[-1]:
            gate.record(1, True, 5, 10.0, declined=True)  # drafted anyway: 0.5 tokens/ms
        else:
            gate.record(1, False, 10, 10.0)
    # By hand: until min_steps = 2 declined steps are drafted, the chosen ones stand in
    # (lower bound 4 - sqrt((4 x 80 / 8)^2) / 80 = 3.5 > 1.0): two overruled steps. Then
    # the declined arm decides: 0.5 - sqrt((0.5 x 20 / 2)^2) / 20 = 0.25, under the
    # undrafted 1.0, so the cost model's declines stand, but for the first backed-off
    # probe (the 32nd declined step).
    assert choices == [True] * 2 + [False] * 31 + [True] + [False] * 6
    # The chosen drafted steps keep their own figure: drafting where the cost model
    # chooses to is still taken.
    assert gate.rates(1) == (4.0, 1.0)
    assert gate.should_draft(1)


def test_probes_of_poor_steps_do_not_veto_the_steps_the_cost_model_chooses():
    """Chosen drafted steps emit 36 tokens per 100 ms, probes (drafted where the cost
    model declined) 25, undrafted steps 10 per 38 ms (0.263 tokens/ms). In one drafted
    window the last 16 steps, all probes, would put drafting at 0.25, under the undrafted
    figure, and veto every chosen step. Measured apart, the chosen steps' 0.36 stands
    whatever the probes do."""
    gate = ThroughputGate(explore_every=32, window=16, min_steps=3)
    for _ in range(16):
        gate.record(1, True, 36, 100.0)
        gate.record(1, False, 10, 38.0)
    for _ in range(16):
        gate.record(1, True, 25, 100.0, declined=True)
    assert gate.rates(1) == (pytest.approx(0.36), pytest.approx(10 / 38))
    choices = [gate.should_draft(1) for _ in range(31)]
    assert choices == [True] * 31
    # The probes' own figure, under the undrafted one, keeps declined steps undrafted
    # (no overruling): only the backed-off probe schedule drafts them.
    assert [gate.should_probe(1) for _ in range(32)] == [False] * 31 + [True]
    with pytest.raises(ValueError, match="undrafted step"):
        gate.record(1, False, 10, 38.0, declined=True)


def test_close_rates_do_not_overrule_the_cost_model():
    gate = ThroughputGate(explore_every=4, window=8, min_steps=2)
    for tokens in (8, 16, 10, 14):  # drafted 1.2 tokens/ms with spread
        gate.record(1, True, tokens, 10.0)
        gate.record(1, False, 10, 10.0)  # undrafted 1.0
    # Only the probes' backed-off schedule: 4 declined steps, then 8.
    assert [gate.should_probe(1) for _ in range(12)] == [False] * 3 + [True] + [False] * 7 + [True]


def test_the_drafted_arms_unseen_spread_shrinks_with_the_batch():
    """Drafted 124 tokens in 18 ms (6.889 tokens/ms), undrafted 64 in 9 ms (7.111), every
    step alike. By hand: the drafted bound is 6.889 + 6.889 / 16 = 7.32 at one request
    (drafting is given the benefit of the doubt) and 6.889 + 6.889 / (16 x sqrt(64)) =
    6.943 at 64, under the undrafted 7.111 (no spread): not drafted but to explore."""
    choices = {}
    for num_reqs in (1, 64):
        gate = ThroughputGate(explore_every=32, window=16, min_steps=3, alone_window=16)
        for _ in range(16):
            gate.record(num_reqs, True, 124, 18.0)
            gate.record(num_reqs, False, 64, 9.0)
        choices[num_reqs] = [gate.should_draft(num_reqs) for _ in range(32)]
    assert choices[1] == [True] * 31 + [False]
    assert choices[64] == [False] * 31 + [True]


def test_a_batch_of_one_judges_drafting_over_several_requests():
    """At one request each arm keeps ``ALONE_WINDOW`` steps (128), so one poor request's
    drafts do not veto the next one's: 100 drafted steps of 12 tokens in 10 ms, then 16
    of 2 (a poor request), against undrafted steps of 1 token in 1.05 ms (0.952 a ms).
    Over 116 steps drafting made (1200 + 32) / 1160 = 1.062 a ms: still drafted. A
    window of 16 (any larger batch's) holds the poor request alone, 0.2 a ms: vetoed."""
    from dspark.scheduling.gate import ALONE_WINDOW

    assert ALONE_WINDOW == 128

    def decisions(num_reqs, **options):
        gate = ThroughputGate(explore_every=32, window=16, min_steps=3, **options)
        for tokens in [12 * num_reqs] * 100 + [2 * num_reqs] * 16:
            gate.record(num_reqs, True, tokens, 10.0)
            gate.record(num_reqs, False, num_reqs, 1.05)
        return [gate.should_draft(num_reqs) for _ in range(8)]

    assert decisions(1) == [True] * 8
    assert decisions(1, alone_window=16) == [False] * 7 + [True]  # explored every 8
    assert decisions(2) == [False] * 8


def test_declined_steps_that_measure_clearly_faster_overrule_a_cost_model_that_never_drafts():
    """The cost model declines every step, so only the gate's probes draft and the arm of
    chosen drafted steps stays empty: the probes' own figure must still be able to start
    the overruling (the case it exists for: a cost model pricing drafting out where
    drafted steps measure clearly faster)."""
    gate = ThroughputGate(explore_every=8, window=8, min_steps=2)
    for _ in range(8):
        gate.record(1, False, 10, 10.0)  # undrafted: 1 token/ms
    # Nothing drafted yet: only the probes' schedule (the first after 8 declined steps).
    assert [gate.should_probe(1) for _ in range(8)] == [False] * 7 + [True]
    for tokens in (30, 34):  # the probes, drafted: 3.2 tokens/ms
        gate.record(1, True, tokens, 10.0, declined=True)
    # By hand: rate 64 / 20 = 3.2, squares 4 + 4 plus the pseudo-step (3.2 x 20 / 2)^2 =
    # 1024 at one request: error sqrt(1032) / 20 = 1.61, lower bound 1.59 > 1.0.
    assert gate._get(1, False).lower_bound(2, 1.0) == pytest.approx(3.2 - 1032**0.5 / 20)
    assert [gate.should_probe(1) for _ in range(8)] == [True] * 7 + [False]


def test_a_batch_of_one_re_measures_drafting_behind_four_times_as_often():
    """One request's drafts decide a batch of one's drafted figure, and the next request
    may draft far better: there the arm behind is explored every 32 // 4 = 8 decisions,
    in larger batches every 32."""
    for num_reqs, every in ((1, 8), (4, 32)):
        gate = ThroughputGate(explore_every=32)
        drive(gate, num_reqs, drafted_rate=2.0, undrafted_rate=5.0, steps=96)  # 3 x 32
        # Nothing recorded from here on: the rates stay put and only exploration drafts.
        choices = [gate.should_draft(num_reqs) for _ in range(64)]
        explored = [97 + i for i, c in enumerate(choices) if c]
        assert explored == [d for d in range(97, 161) if d % every == 0]


def test_a_batch_of_one_recovers_from_a_poor_request_sooner():
    """After a poor stretch (drafting 2 tokens/ms against 5 undrafted, 200 decisions)
    drafting runs at 9: a batch of one explores drafting four times as often
    (``ALONE_SPEEDUP``), so with a window of 16 it has the drafted figure back above the
    undrafted one in under a third of the decisions a batch of four needs (72 against
    280). Its default window of 128 (``ALONE_WINDOW``) remembers the poor stretch longer
    and takes 232, still fewer than the batch of four."""

    def decisions_to_recover(num_reqs, **options):
        gate = ThroughputGate(explore_every=32, **options)
        drive(gate, num_reqs, drafted_rate=2.0, undrafted_rate=5.0, steps=200)
        for step in range(1, 2000):
            draft = gate.should_draft(num_reqs)
            gate.record(num_reqs, draft, 100, 100 / (9.0 if draft else 5.0))
            if draft and gate.rates(num_reqs)[0] > 5.0:
                return step
        return 2000

    short, alone, four = (
        decisions_to_recover(1, alone_window=16),
        decisions_to_recover(1),
        decisions_to_recover(4),
    )
    assert short * 3 < four, (short, four)
    assert (short, alone, four) == (72, 232, 280)


def test_a_stalled_step_counts_at_most_twice_the_median_unless_it_emitted_more():
    from dspark.scheduling.gate import DRAFTED, _Bucket

    bucket = _Bucket(window=16)
    for sample in [(100, 150.0), (100, 10.0)]:
        bucket.add(DRAFTED, *sample)
    assert bucket.rate(DRAFTED) == 200 / 160.0  # two steps: no median to judge by yet
    for sample in [(100, 12.0), (300, 25.0)]:
        bucket.add(DRAFTED, *sample)
    # Median wall of the four: 25 (the upper middle), median tokens 100: the stall counts
    # as 50 ms; the 300-token step may take up to 150 ms and keeps its 25.
    assert bucket.steps(DRAFTED) == [(100, 50.0), (100, 10.0), (100, 12.0), (300, 25.0)]
    assert bucket.rate(DRAFTED) == 600 / 97.0
    # Three steps are enough to judge: the median of (10, 10, 150) is 10.
    three = _Bucket(window=16)
    for sample in [(100, 10.0), (100, 150.0), (100, 10.0)]:
        three.add(DRAFTED, *sample)
    assert three.steps(DRAFTED) == [(100, 10.0), (100, 20.0), (100, 10.0)]
    # Steps with a prompt chunk keep their walls: they follow the chunk's size.
    mixed = _Bucket(window=16, mixed=True)
    for sample in [(100, 10.0), (100, 150.0), (100, 10.0)]:
        mixed.add(DRAFTED, *sample)
    assert mixed.rate(DRAFTED) == 300 / 170.0


def test_one_stalled_drafted_step_does_not_keep_drafting_off():
    # 64 requests where drafting leads: drafted steps ~113 tokens in ~10 ms, undrafted 64
    # in ~7.5 ms. Without the cap, a first drafted step of 150 ms leaves 350-430 of 600
    # steps undrafted (seeds 0-19); with it 5-43, against 5-15 without the stall.
    for seed in range(5):
        rng = np.random.default_rng(seed)
        gate = ThroughputGate()
        undrafted = 0
        for step in range(600):
            draft = gate.should_draft(64)
            undrafted += not draft
            if draft:
                tokens = 64 + rng.binomial(192, 0.26)
                wall = 150.0 if step == 0 else 10.0 * rng.lognormal(0.0, 0.1)
            else:
                tokens, wall = 64, 7.5 * rng.lognormal(0.0, 0.1)
            gate.record(64, draft, int(tokens), wall)
        assert undrafted <= 45, (seed, undrafted)


def test_explorations_keep_their_spacing_while_the_lead_moves():
    # Drafting's lead swings between about 1.1x and 1.4x every 24 decisions, so the
    # exploring period moves between 32 and about 100: explorations come no closer than
    # 32 decisions apart (were the period taken modulo the decision's number, some would
    # come 2 apart: it would fire whenever any period of the moment divided it).
    gate = ThroughputGate(explore_every=32)
    explored = []
    for decision in range(2048):
        rate = 5.6 if (decision // 24) % 2 else 7.0
        draft = gate.should_draft(4)
        if not draft:
            explored.append(decision)
        gate.record(4, draft, 100, 100 / (rate if draft else 5.0))
    gaps = np.diff(explored[3:])  # after the first three undrafted steps (measured first)
    assert len(gaps) >= 20 and gaps.min() >= 32


def test_wider_veto_bounds_at_one_request_are_a_setting():
    """``alone_confidence`` (1 by default, ``ALONE_CONFIDENCE``): by hand, drafted steps
    alternating 4 and 12 tokens in 10 ms are 0.8 tokens/ms with an error of sqrt(16 x 16 +
    8^2) / 160 = 0.112 (the pseudo-step: 0.8 x 10); undrafted steps of 1 token in 1.05 ms
    are 0.952. One error wide (0.912) drafting is vetoed, and explored again every 32 // 4
    = 8 decisions; three wide (1.135) it leads. Batches of two keep ``confidence``."""
    from dspark.scheduling.gate import ALONE_CONFIDENCE

    assert ALONE_CONFIDENCE == 1.0

    def decisions(num_reqs, **options):
        gate = ThroughputGate(explore_every=32, window=16, min_steps=3, **options)
        for i in range(16):
            gate.record(num_reqs, True, (4, 12)[i % 2] * num_reqs, 10.0)
            gate.record(num_reqs, False, num_reqs, 1.05)
        return [gate.should_draft(num_reqs) for _ in range(8)]

    assert decisions(1) == [False] * 7 + [True]
    assert decisions(1, alone_confidence=3.0) == [True] * 8
    assert decisions(2, alone_confidence=3.0) == [False] * 8


def _figures_by_definition(bucket, arm):
    """rate_and_error straight from its definition over the capped window (``steps``)."""
    from dspark.scheduling.gate import UNDRAFTED

    steps = bucket.steps(arm)
    total_wall = sum(wall for _, wall in steps)
    rate = sum(tokens for tokens, _ in steps) / total_wall
    squares = sum((tokens - rate * wall) ** 2 for tokens, wall in steps)
    if arm != UNDRAFTED:
        squares += (rate * total_wall / len(steps)) ** 2 / bucket.smallest
    return rate, squares**0.5 / total_wall


@pytest.mark.parametrize(
    ("window", "smallest", "mixed"), [(8, 1, False), (128, 1, False), (16, 4, False), (16, 1, True)]
)
def test_figures_kept_step_by_step_match_their_definition(window, smallest, mixed):
    # The figures come from running sums, sorted walls and tokens kept as steps come and
    # go (and from a cache between changes); after every add they must match a pass over
    # the capped window: full windows (steps dropping out), stalls the cap shortens, tied
    # walls, steps whose tokens lift their cap, each arm, long enough for several fresh
    # recomputations of the sums.
    from dspark.scheduling.gate import DECLINED, DRAFTED, UNDRAFTED, _Bucket

    rng = np.random.default_rng(window + smallest)
    bucket = _Bucket(window=window, smallest=smallest, mixed=mixed)
    for _ in range(6 * window + 50):
        arm = int(rng.integers(0, 3))
        wall = float(rng.choice([4.0, 5.0])) if rng.random() < 0.2 else float(rng.uniform(3, 6))
        if rng.random() < 0.1:
            wall *= 10.0  # a stall
        tokens = int(rng.integers(1, 6)) * (8 if rng.random() < 0.05 else 1)
        bucket.add(arm, tokens, wall)
        for other in (DRAFTED, UNDRAFTED, DECLINED):
            if bucket.samples[other]:
                rate, error = bucket.rate_and_error(other)
                want_rate, want_error = _figures_by_definition(bucket, other)
                assert rate == pytest.approx(want_rate, rel=1e-12)
                assert error == pytest.approx(want_error, rel=1e-9, abs=1e-9 * want_rate)
