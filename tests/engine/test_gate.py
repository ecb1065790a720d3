"""The throughput gate, the drafter's deferred upkeep, and what the cost model learns
from the steps that ran."""

import time

import numpy as np
import pytest

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.scheduling.gate import DECLINED, DRAFTED
from tests.conftest import engine_config, make_tiny_model
from tests.engine.test_engine import (
    GREEDY,
    CheapCost,
    repetitive_prompts,
    run,
)


def test_throughput_gate_measures_both_arms_and_stays_lossless(tiny):
    prompts = repetitive_prompts(12)
    plain, _ = run(tiny, prompts)
    out, engine = run(
        tiny, prompts, spec="adaptive", num_drafts=3, cost_model=CheapCost(1), throughput_gate=True
    )
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    gate = engine.policy.gate
    drafted, undrafted = gate.rates(12)
    assert drafted is not None and undrafted is not None  # both arms were timed
    assert engine.stats.undrafted_steps >= gate.min_steps
    assert len(engine.stats.drafter_ms) >= gate.min_steps


class ScriptedGate:
    """A throughput gate that drafts on a fixed pattern of steps."""

    min_steps = 0

    def __init__(self, pattern):
        self.pattern, self.calls = pattern, 0

    def should_draft(self, num_reqs, mixed=False):
        self.calls += 1
        return self.pattern[self.calls % len(self.pattern)]

    def should_probe(self, num_reqs, mixed=False):
        return False  # the pattern alone decides

    def record(self, num_reqs, drafted, tokens, wall_ms, mixed=False, declined=False):
        pass


@pytest.mark.parametrize("pattern", [[True, False, False], [False] * 34 + [True] * 6])
def test_deferred_drafter_upkeep_drafts_exactly_as_eager_upkeep(tmp_path, pattern):
    """Context updates held back on undrafted steps and run batched before the next
    drafting step leave the drafter in the same state: same drafts, same acceptance."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=4)
    prompts = repetitive_prompts(8)
    # Long enough that the second pattern holds back more than DEFER_LIMIT steps.
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    results = []
    for defer in (False, True):
        engine = LLMEngine(
            target,
            engine_config(spec="adaptive", num_drafts=3, defer_upkeep=defer),
            drafter=DSparkDrafter(drafter, 16384, 16),
            cost_model=CheapCost(2),
        )
        engine.policy.gate = ScriptedGate(pattern)
        engine.round_log = []  # the drafter's confidences of every drafted round
        requests = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        confidences = [c for c, _, _ in engine.round_log if c is not None]
        results.append(([r.output_ids for r in requests], confidences))
        assert engine.stats.undrafted_steps > 0 and engine.stats.num_verified > 0
        assert engine.upkeep is None or not len(engine.upkeep)
    assert results[0][0] == results[1][0]
    # The confidences are computed from the drafter's context: equal only if the held-back
    # updates reproduced it (up to rounding: batched products round differently).
    assert len(results[1][1]) > 10
    np.testing.assert_allclose(np.array(results[0][1]), np.array(results[1][1]), atol=1e-5)


class LedgerGate(ScriptedGate):
    """A scripted gate that keeps every step it times, in order."""

    def __init__(self, pattern):
        super().__init__(pattern)
        self.log = []

    def record(self, num_reqs, drafted, tokens, wall_ms, mixed=False, declined=False):
        self.log.append((drafted, wall_ms))


@pytest.mark.parametrize("lookahead", ["off", "on"])
def test_held_back_upkeep_leaves_the_step_that_runs_it_and_prices_the_undrafted_ones(
    tmp_path, lookahead
):
    """The drafted step that catches the drafter up runs the undrafted steps' upkeep: the
    gate and the cost model see that time spread over the undrafted steps, not in the
    drafted step (with the look-ahead, as on a GPU, the cost model learns each step during
    the next one's forward)."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    pause = 0.5  # far longer than a step of the tiny model, even in a slow phase of a VM
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    engine = LLMEngine(
        target,
        engine_config(spec="adaptive", num_drafts=3, lookahead=lookahead),
        drafter=DSparkDrafter(random_drafter(target, block_size=4), 16384, 16),
        cost_model=CheapCost(2),
    )
    engine.policy.gate = gate = LedgerGate([False, False, True])  # two undrafted, one drafted
    upkeep = engine.upkeep
    flush, flushed = upkeep.flush, []

    def slow_flush():
        if len(upkeep):
            flushed.append(len(upkeep))
            time.sleep(pause)
        flush()

    upkeep.flush = slow_flush
    # Each timed step's host time up to the gate's record, flushes included, and whether
    # it flushed: the gate's figure is checked against the step's own time, so a stall
    # of the machine (a VM's) moves both alike.
    started, spent = [0.0, False], []
    step, record = engine.step, gate.record

    def timed_step():
        started[:] = [time.perf_counter(), len(flushed)]
        return step()

    def timed_record(*args, **kwargs):
        spent.append(((time.perf_counter() - started[0]) * 1e3, len(flushed) > started[1]))
        record(*args, **kwargs)

    engine.step, gate.record = timed_step, timed_record
    priced = []  # the cost model's steps: (depth, ms)

    def record_step(num_reqs, num_tokens, num_drafts, depth, wall_ms, *rest, **extra):
        priced.append((depth, wall_ms))

    engine.verifier.cost_model.record_step = record_step
    plain, _ = run(target, repetitive_prompts(2))
    requests = [engine.add_request(p, GREEDY) for p in repetitive_prompts(2)]
    while engine.has_unfinished():
        engine.step()
    assert [r.output_ids for r in requests] == [o.token_ids for o in plain]
    assert len(flushed) >= 3 and max(flushed) <= 3
    pause_ms = pause * 1e3
    # Each flush caught up two or three steps: an undrafted step's share is a third of
    # the pause or more, and never more than the pause.
    assert pause_ms / 3 <= upkeep.ms_per_step <= pause_ms * 1.5
    first_drafted = next(i for i, (drafted, _) in enumerate(gate.log) if drafted)
    last = len(gate.log) - 1  # the step both requests finished in holds nothing back
    assert len(spent) == len(gate.log)
    assert sum(ran for _, ran in spent) == len(flushed)
    for i, ((drafted, wall), (own_ms, ran_flush)) in enumerate(zip(gate.log, spent, strict=True)):
        if drafted:
            # The flush it ran is not its own time.
            assert wall <= own_ms - (pause_ms if ran_flush else 0.0)
        elif first_drafted < i < last:
            assert not ran_flush
            assert wall >= pause_ms / 3  # priced with its share of a catch-up
        else:
            assert wall <= own_ms  # nothing caught up yet, or nothing held back: no share
    # The cost model (decoding steps only: no prompt chunk) prices the undrafted steps
    # caught up by then with their share, and the drafted ones without the catch-up
    # they ran (a step of the tiny model takes milliseconds, the pause half a second).
    assert any(depth == 0 for depth, _ in priced) and any(depth for depth, _ in priced)
    assert any(wall >= pause_ms / 3 for depth, wall in priced if depth == 0)
    assert all(wall <= pause_ms * 1.5 for depth, wall in priced if depth == 0)
    assert all(wall < pause_ms / 3 for depth, wall in priced if depth)


def test_online_acceptance_learns_from_drafted_steps_only(tiny):
    """Undrafted steps try no position: they neither update nor decay the learnt rates."""
    engine = LLMEngine(tiny, EngineConfig(spec="adaptive", num_drafts=3), cost_model=CheapCost(2))
    engine.policy.gate = ScriptedGate([True, False, False])
    updates = []
    update = engine.acceptance.update
    engine.acceptance.update = lambda admitted, accepted: (
        updates.append(admitted.copy()),
        update(admitted, accepted),
    )
    for prompt in repetitive_prompts(3):
        engine.add_request(prompt, GREEDY)
    while engine.has_unfinished():
        engine.step()
    drafted = sum(n for depth, n in engine.stats.depth_steps.items() if depth)
    assert engine.stats.undrafted_steps > 0 and drafted > 0
    # One update per step that verified a draft (a drafted step whose requests were all
    # at their length limit verifies none), none from the undrafted ones.
    assert 0 < len(updates) <= drafted and all(a.sum() > 0 for a in updates)


class RecordingCost(CheapCost):
    """Cheap drafts, a free drafter, and a log of the steps the engine reports."""

    def __init__(self, seed):
        super().__init__(seed)
        self.steps = []

    def draft_cost_ms(self, num_reqs, depth=None):
        return 0.0

    def record_step(self, num_reqs, num_tokens, num_drafts, depth, wall_ms, context_tokens=0):
        self.steps.append((num_reqs, num_tokens, num_drafts, depth, wall_ms))


def test_decoding_steps_report_their_price_inputs_to_a_learning_cost_model(tiny):
    prompts = repetitive_prompts(6)
    plain, _ = run(tiny, prompts)
    cost = RecordingCost(2)
    out, engine = run(tiny, prompts, spec="adaptive", num_drafts=3, cost_model=cost)
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    assert len(cost.steps) > 10
    for num_reqs, num_tokens, num_drafts, depth, wall_ms in cost.steps:
        assert num_tokens == num_reqs  # decoding steps only: prompt chunks are not priced
        assert 0 <= depth <= 3 and 0 <= num_drafts <= num_reqs * depth and wall_ms > 0
    # Every admitted draft of a reported step was verified: no more than the engine's.
    admitted = engine.stats.num_verified - engine.stats.num_decode_rounds
    assert 0 < sum(step[2] for step in cost.steps) <= admitted


class PricedOut(RecordingCost):
    """Drafting never pays by the model: only the gate's probes draft."""

    def draft_cost_ms(self, num_reqs, depth=None):
        return 1e6


def test_probes_draft_where_the_model_declines_and_stay_lossless(tiny):
    prompts = repetitive_prompts(12)
    plain, _ = run(tiny, prompts)
    cost = PricedOut(3)
    out, engine = run(
        tiny, prompts, spec="adaptive", num_drafts=3, cost_model=cost, throughput_gate=True
    )
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    stats = engine.stats
    # Every 32nd declined step of a batch-size bucket drafts, at the model's best depth.
    assert stats.probes >= 1 and stats.gate_vetoes == 0
    assert sum(n for depth, n in stats.depth_steps.items() if depth) == stats.probes
    assert stats.undrafted_steps == stats.depth_steps[0]
    # The gate measures the probes apart from drafted steps the cost model chose (none).
    buckets = engine.policy.gate._buckets.values()
    assert all(not bucket.samples[DRAFTED] for bucket in buckets)
    assert 1 <= sum(len(bucket.samples[DECLINED]) for bucket in buckets) <= stats.probes


class CountingGate(ScriptedGate):
    def __init__(self):
        super().__init__([True])
        self.records = []

    def record(self, num_reqs, drafted, tokens, wall_ms, mixed=False, declined=False):
        self.records.append((num_reqs, drafted, tokens, mixed))


def test_the_gate_times_mixed_steps_apart_and_the_prices_learn_from_decoding_steps(tiny):
    prompts = repetitive_prompts(10)
    plain, _ = run(tiny, prompts)
    cost = RecordingCost(4)
    engine = LLMEngine(
        tiny, EngineConfig(spec="adaptive", num_drafts=3, max_num_seqs=4), cost_model=cost
    )
    engine.policy.gate = gate = CountingGate()
    schedule = engine.scheduler.schedule
    decoding_steps = []

    def tracking(room):
        chunks = schedule(room)
        if chunks and any(c.is_decode for c in chunks):
            decoding_steps.append(all(c.is_decode for c in chunks))
        return chunks

    engine.scheduler.schedule = tracking
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    assert [r.output_ids for r in requests] == [o.token_ids for o in plain]
    # Four running at a time over ten requests: prompt chunks share steps with decodes.
    assert not all(decoding_steps)
    # The gate times every step with decodes (none captured a graph on this CPU), each
    # marked mixed exactly when a prompt chunk shared it; the cost model only the others.
    assert [mixed for *_, mixed in gate.records] == [not pure for pure in decoding_steps]
    assert len(cost.steps) == sum(decoding_steps)


@pytest.mark.parametrize("lookahead", ["off", "on"])
def test_steps_that_replayed_a_larger_graph_are_learnt_with_their_padding(
    tiny, lookahead, tmp_path, monkeypatch
):
    """The tokens a step's target forward ran beyond its own captured size (a cover,
    ``CaptureLedger``) reach ``record_step`` as ``padded_tokens``, with the look-ahead
    deferring the record or not; here every padded forward is made to report 16."""
    from dspark.engine.graphs import PaddedStepRunner
    from dspark.scheduling.cost import ObservedDraftCost

    original_run = PaddedStepRunner.run

    def covered_run(self, *args, **kwargs):
        out = original_run(self, *args, **kwargs)
        self.covered_tokens += 16
        return out

    seen = []
    original = ObservedDraftCost.record_step

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("padded_tokens", 0))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PaddedStepRunner, "run", covered_run)
    monkeypatch.setattr(ObservedDraftCost, "record_step", spy)
    run(
        tiny,
        repetitive_prompts(4),
        spec="adaptive",
        num_drafts=3,
        cuda_graphs="on",
        lookahead=lookahead,
        profile_path=str(tmp_path / "profile.json"),
    )
    assert seen and set(seen) == {16}
