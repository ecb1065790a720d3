"""``dspark bench`` accounting: every token counted once, the closed loop never exceeds
its concurrency, TPOT comes from each request's own timestamps."""

from __future__ import annotations

import numpy as np
import pytest

from dspark.bench.loops import closed_loop, measure
from dspark.bench.measurement import summarise
from dspark.bench.settings import Setting
from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams


def test_closed_loop_keeps_the_concurrency_and_counts_each_token_once(tiny):
    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=8))
    in_flight, peak = [], [0]
    add = engine.add_request

    def tracking_add(prompt, params, request_id=None):
        in_flight[:] = [r for r in in_flight if not r.is_finished]
        request = add(prompt, params, request_id)
        in_flight.append(request)
        peak[0] = max(peak[0], len(in_flight))
        return request

    engine.add_request = tracking_add
    prompts = [[i + 1, i + 2, i + 3] for i in range(10)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    finished, seconds = closed_loop(engine, prompts, params, 3)
    assert peak[0] == 3 and len(finished) == 10 and seconds > 0
    assert sorted(r.prompt_ids[0] for r in finished) == list(range(1, 11))
    assert not engine.requests  # finished requests are released


def test_measure_accounting(tiny):
    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=4, spec="fixed", num_drafts=2))
    prompts = [[5, 6, 7, 5, 6, 7, i] for i in range(7)]
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    result = measure(engine, Setting("fixed", 2), prompts, params, 2)
    assert result.tokens == 7 * 7 and result.requests == 7
    assert result.tok_s == pytest.approx(result.tokens / result.seconds, rel=1e-3)
    assert result.acceptance_length >= 1.0 and result.verified_per_round >= 1.0
    # TPOT p50 and per-user speed come from the same per-request timestamps: with an odd
    # number of requests both medians are the same request's.
    assert result.per_user_tok_s == pytest.approx(1e3 / result.tpot_p50_ms, rel=1e-9)
    assert result.tpot_p99_ms >= result.tpot_p50_ms
    # Eager CPU steps capture no graph; a fixed K drafts on every decoding step.
    assert result.graph_captures == 0 and result.undrafted_steps == 0
    # The host phases are the measured run's own (the stats restart after the warm-up),
    # and the host probe ran on both sides of it.
    stats = engine.stats
    assert result.phase_ms == {
        "drafter": float(np.median(stats.drafter_ms)),
        "apply": float(np.median(stats.apply_ms)),
        "forward": float(np.median(stats.forward_ms)),
    }
    assert len(stats.apply_ms) == stats.num_steps
    assert all(ms > 0 for ms in result.probe_ms) and len(result.probe_ms) == 2


def test_the_host_probe_times_its_fastest_try(monkeypatch):
    from dspark.bench import loops

    # Tries take 5, 2 and 9 ms on a fake clock: the probe reports the fastest.
    durations = iter([5e-3, 2e-3, 9e-3])
    now = [0.0]
    ticks = []

    def fake_clock():
        ticks.append(None)
        if len(ticks) % 2:  # a try's start
            return now[0]
        now[0] += next(durations)  # its end
        return now[0]

    monkeypatch.setattr(loops.time, "perf_counter", fake_clock)
    assert loops.host_probe_ms(tries=3) == pytest.approx(2.0)
    assert len(ticks) == 6


def test_graph_capture_time_is_left_out_of_tok_s(tiny, monkeypatch):
    """Host time spent capturing graphs mid-measurement is start-up work: tok/s excludes
    it, tok_s_wall keeps it; the steps that captured are counted."""
    import dspark.bench.loops as bench_loops

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    real_loop, real_forward = bench_loops.closed_loop, engine.runner.forward
    loops, forwards, captures = [0], [0], [0]

    def two_second_loop(*args):  # every loop "takes" 2 s of wall time
        loops[0] += 1
        finished, _ = real_loop(*args)
        return finished, 2.0

    def forward(*args, **kwargs):
        if loops[0] == 2:  # measuring: the 2nd and 3rd forwards capture a graph
            forwards[0] += 1
            captures[0] += forwards[0] in (2, 3)
        return real_forward(*args, **kwargs)

    captured = iter([3.0, 3.5])  # 0.5 s of captures while measuring
    monkeypatch.setattr(bench_loops, "closed_loop", two_second_loop)
    monkeypatch.setattr(engine, "capture_seconds", lambda: next(captured))
    monkeypatch.setattr(engine, "num_captures", lambda: captures[0])
    monkeypatch.setattr(engine.runner, "forward", forward)
    prompts = [[5, 6, 7, i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    result = measure(engine, Setting("none", 0), prompts, params, 2)
    assert result.tokens == 12 and result.capture_s == pytest.approx(0.5)
    assert result.tok_s == pytest.approx(12 / 1.5) and result.tok_s_wall == pytest.approx(6.0)
    assert result.graph_captures == 2 and result.capture_steps == 2


def test_covered_steps_and_their_padding_count_the_measured_run_only(tiny, monkeypatch):
    """Steps that replayed a larger graph, and the padding tokens that added, are counted
    while measuring, not in the warm-up; so are steps that filled padding with drafts."""
    import dspark.bench.loops as bench_loops

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2, cuda_graphs="on"))
    assert engine.graphs is not None
    real_loop, real_forward = bench_loops.closed_loop, engine.runner.forward
    loops, measured = [0], [0]

    def counted_loop(*args):
        loops[0] += 1
        return real_loop(*args)

    def forward(*args, **kwargs):  # every forward "is covered" by a graph 16 tokens larger
        engine.graphs.num_covered += 1
        engine.graphs.covered_tokens += 16
        engine.stats.filled_steps += 1  # and fills 3 drafts into padding (fill_padding)
        engine.stats.filled_drafts += 3
        measured[0] += loops[0] == 2
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(bench_loops, "closed_loop", counted_loop)
    monkeypatch.setattr(engine.runner, "forward", forward)
    prompts = [[5, 6, 7, i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    result = measure(engine, Setting("none", 0), prompts, params, 2)
    assert loops[0] == 2 and measured[0] > 0
    assert result.covered_steps == measured[0]
    assert result.covered_tokens == 16 * measured[0]
    assert (result.filled_steps, result.filled_drafts) == (measured[0], 3 * measured[0])
    summary = summarise([result])
    assert (summary["filled_steps"], summary["filled_drafts"]) == (measured[0], 3 * measured[0])


def test_a_full_warmup_runs_as_many_tokens_as_the_measured_run(tiny, monkeypatch):
    import dspark.bench.loops as bench_loops

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    real_loop, loops = bench_loops.closed_loop, []

    def logged_loop(engine, prompts, params, concurrency):
        loops.append((len(prompts), params.max_tokens, params.temperature, params.top_k))
        return real_loop(engine, prompts, params, concurrency)

    monkeypatch.setattr(bench_loops, "closed_loop", logged_loop)
    prompts = [[5, 6, 7, i] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    measure(engine, Setting("none", 0), prompts[3:], params, 2, prompts[:3], True)
    measure(engine, Setting("none", 0), prompts[3:], params, 2, prompts[:1])
    assert loops == [(3, 8, 0.0, 0), (3, 8, 0.0, 0), (1, 4, 0.0, 0), (3, 8, 0.0, 0)]
    # A sampled run warms up sampling the same way (what adaptive learns there carries).
    loops.clear()
    sampled = SamplingParams(temperature=0.7, top_k=5, max_tokens=8, ignore_eos=True, seed=1)
    measure(engine, Setting("none", 0), prompts[3:], sampled, 2, prompts[:1])
    assert loops == [(1, 4, 0.7, 5), (3, 8, 0.7, 5)]


@pytest.mark.parametrize("freeze", [True, False])
def test_the_measured_run_freezes_the_heap_and_counts_its_full_collections(tiny, freeze):
    import gc

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    step, frozen, calls = engine.step, [], [0]

    def step_that_collects():
        calls[0] += 1
        frozen.append(gc.get_freeze_count())
        if calls[0] == 6:  # in the measured run (the warm-up: one request, 4 tokens, 4 steps)
            gc.collect()
        return step()

    engine.step = step_that_collects
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    gc.disable()  # no automatic collection besides the one forced (explicit ones still run)
    try:
        result = measure(engine, Setting("none", 0), [[1, 2, 3]] * 3, params, 2, freeze_gc=freeze)
    finally:
        gc.enable()
    assert calls[0] > 6
    # The warm-up (steps 1-4) ran unfrozen; the measured steps frozen, or not.
    assert frozen[:4] == [0, 0, 0, 0]
    assert all((count > 0) == freeze for count in frozen[4:])
    assert gc.get_freeze_count() == 0  # unfrozen again: a dropped engine is freed
    assert result.heap_frozen == freeze and result.gc_full == 1 and result.gc_full_s > 0


def test_a_failing_run_leaves_the_heap_unfrozen_and_stops_counting(tiny):
    import gc

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    step, calls = engine.step, [0]
    callbacks = list(gc.callbacks)

    def step_that_fails():
        calls[0] += 1
        if calls[0] == 6:  # in the measured run
            raise RuntimeError("device lost")
        return step()

    engine.step = step_that_fails
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with pytest.raises(RuntimeError, match="device lost"):
        measure(engine, Setting("none", 0), [[1, 2, 3]] * 3, params, 2)
    assert gc.get_freeze_count() == 0 and gc.callbacks == callbacks


def _sliced(tiny, label_k, prompts, params, concurrency):
    from dspark.bench.loops import SlicedLoop

    spec, k = label_k
    config = EngineConfig(max_num_seqs=concurrency, spec=spec, num_drafts=max(k, 1))
    engine = LLMEngine(tiny, config)
    return SlicedLoop(engine, Setting(spec, k), prompts, params, concurrency)


def test_sliced_windows_count_each_token_once_and_give_every_loop_its_window(tiny):
    from dspark.bench.loops import sliced_windows

    prompts = [[5, 6, 7, i] for i in range(3)]  # fewer than a window needs: cycled
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    loops = [
        _sliced(tiny, ("none", 0), prompts, params, 2),
        _sliced(tiny, ("fixed", 2), prompts, params, 3),
    ]
    for _ in range(2):  # the second window: stats and counts restart
        # Tokens already emitted by the requests in flight as the window opens.
        before = {id(r): len(r.output_ids) for loop in loops for r in loop.running}
        results = sliced_windows(loops, window_s=0.25, slice_s=0.02)
        for loop, result in zip(loops, results, strict=True):
            seen = loop.finished + loop.running
            emitted = sum(len(r.output_ids) - before.get(id(r), 0) for r in seen)
            assert result.tokens == emitted > 0
            assert result.requests == len(loop.finished)
            # At most the concurrency in flight (refilled as each turn begins).
            assert len(loop.running) <= loop.concurrency
            # Its own time: the window, overrun by at most the step that crossed it.
            assert 0.25 <= result.seconds < 0.25 + 0.5
            assert result.tok_s == pytest.approx(result.tokens / result.seconds, rel=1e-3)
            assert loop.engine.stats.num_steps > 0
        # Both loops met the same stretch of the machine: one pair of host probes.
        assert results[0].probe_ms == results[1].probe_ms
    # Prompts are taken again from the start once used up, in order.
    assert loops[0].next_prompt > len(prompts)


def test_sliced_tpot_leaves_out_the_other_loops_turns(tiny):
    import time

    from dspark.bench.loops import sliced_windows

    prompts = [[5, 6, 7, i] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    fast = _sliced(tiny, ("none", 0), prompts, params, 1)
    slow = _sliced(tiny, ("none", 0), prompts, params, 1)
    step = slow.engine.step

    def sleepy_step():
        time.sleep(1.0)
        return step()

    slow.engine.step = sleepy_step
    (result, _) = sliced_windows([fast, slow], window_s=0.3, slice_s=0.005)
    # The fast loop's first turn was one short slice; then the slow one held the machine
    # for a second with a request of the fast one in flight. Counted, that gap would
    # make that request's first token to finish last over a second; its own steps fit in
    # the window's 0.3 s and one step past it (a second leaves room for a busy machine's
    # slow steps).
    assert fast.engine.idle_s >= 1.0
    assert result.requests == len(fast.finished) > 0
    assert max(r.finish_time - r.first_token_time for r in fast.finished) < 0.9


def test_sliced_loops_of_long_and_short_steps_end_the_window_together(tiny):
    import time

    from dspark.bench.loops import sliced_windows

    prompts = [[5, 6, 7, i] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    loops = [_sliced(tiny, ("none", 0), prompts, params, 2) for _ in range(2)]
    longest = [0.0, 0.0]  # each loop's longest step (s)

    def timed(i, step, pause):
        def stepped():
            start = time.perf_counter()
            time.sleep(pause)
            out = step()
            longest[i] = max(longest[i], time.perf_counter() - start)
            return out

        return stepped

    for i, loop in enumerate(loops):  # loop 1's steps take 30 ms longer
        loop.engine.step = timed(i, loop.engine.step, 0.03 * i)
    turns = []
    for i, loop in enumerate(loops):
        run_slice = loop.run_slice
        loop.run_slice = lambda until, i=i, run_slice=run_slice: (
            turns.append(i),
            run_slice(until),
        )
    sliced_windows(loops, window_s=0.6, slice_s=0.05)
    # Each turn runs to the round's target of own time: the long steps' overruns are
    # repaid, so both loops take their turn in the last round.
    # A loop whose step overran a round's target by more than a slice sits rounds out
    # (none unless the machine is busy): one turn apart, and as many more as the longest
    # step spans slices; and only when no step spanned a slice must both have taken the
    # last round (else one may have reached the window's end a round early).
    overruns = int(max(longest) / 0.05)
    assert abs(turns.count(0) - turns.count(1)) <= 1 + overruns
    if not overruns:
        assert set(turns[-2:]) == {0, 1}
    # A window ends at most one step past its target (and the turn's bookkeeping: a busy
    # machine stretches the steps, so the bound is the longest step measured).
    for loop, step_s in zip(loops, longest, strict=True):
        assert 0.6 <= loop.busy_s < 0.6 + step_s + 0.02
