"""``dspark bench`` accounting: every token counted once, the closed loop never exceeds
its concurrency, TPOT comes from each request's own timestamps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dspark.bench.sweep import (
    Setting,
    closed_loop,
    compare,
    job_order,
    measure,
    parse_variant,
)
from dspark.engine.engine import EngineConfig, LLMEngine
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


def test_an_adaptive_run_reports_what_its_cost_model_learnt(tiny):
    from dspark.bench.sweep import learnt_state
    from dspark.scheduling import build_cost_tables, build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    # A learning cost model over fixed tables (no start-up profile on this tiny model):
    # verify T tokens 1 + T/100 ms, drafting d deep d/10 ms; K = 3.
    tables = build_cost_tables([(1, 0.3), (2, 0.3)], [(1, 1.01), (64, 1.64)], 2, 64, 1)
    depth = build_depth_costs({1: [(1, 0.1), (2, 0.1)], 3: [(1, 0.3), (2, 0.3)]}, 3, 2)
    model = ObservedDraftCost(tables, depth_ms=depth, num_positions=3)
    engine = LLMEngine(
        tiny,
        EngineConfig(max_num_seqs=2, spec="adaptive", num_drafts=3, throughput_gate=False),
        cost_model=model,
    )
    prompts = [[5, 6, 7, 5, 6, 7, i] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    result = measure(engine, Setting("adaptive", 3), prompts, params, 2)
    learnt = result.learnt
    assert model.overhead_lines()  # it measured steps, so it has lines to report
    # The drafter's price at every depth 0..K for the run's concurrency, as the model
    # gives it at the end of the run, and the lines it reads them from.
    assert learnt["draft_ms_by_depth"] == pytest.approx(
        model.draft_costs_by_depth(2, 3).tolist(), abs=1e-4
    )
    assert learnt["overhead_lines"] == {
        kind: pytest.approx(list(line), abs=1e-4) for kind, line in model.overhead_lines().items()
    }
    assert len(learnt["population_survival"]) == 3
    assert 0.0 <= learnt["predictiveness"] <= 1.0
    # Fixed K and no speculation have no cost model: nothing to report.
    fixed = LLMEngine(tiny, EngineConfig(max_num_seqs=2, spec="fixed", num_drafts=2))
    assert learnt_state(fixed, 2) == {}


def test_the_host_probe_times_its_fastest_try(monkeypatch):
    from dspark.bench import sweep

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

    monkeypatch.setattr(sweep.time, "perf_counter", fake_clock)
    assert sweep.host_probe_ms(tries=3) == pytest.approx(2.0)
    assert len(ticks) == 6


def test_compare_reports_ratios_against_best_fixed_and_no_spec():
    rows = [
        {"concurrency": 1, "spec": "none", "label": "no spec", "tok_s": 10.0},
        {"concurrency": 1, "spec": "fixed", "label": "K=1", "tok_s": 12.0},
        {"concurrency": 1, "spec": "fixed", "label": "K=3", "tok_s": 15.0},
        {"concurrency": 1, "spec": "adaptive", "label": "adaptive≤7", "tok_s": 14.7},
    ]
    [line] = compare(rows)
    assert "0.980x best fixed (K=3)" in line and "1.470x no spec" in line
    assert np.isclose(14.7 / 15.0, 0.98)
    assert "paired" not in line  # one repeat: nothing to pair


def test_jobs_alternate_the_settings_order_between_repeats():
    settings = [Setting("none", 0), Setting("fixed", 2), Setting("adaptive", 7)]
    jobs = job_order(3, [1, 4], settings)
    assert jobs[:3] == [(0, 1, s) for s in settings]
    assert jobs[6:9] == [(1, 1, s) for s in reversed(settings)]
    assert jobs[15:] == [(2, 4, s) for s in settings]
    assert len(jobs) == 3 * 2 * 3


def test_compare_pairs_repeats_that_shared_the_machine_speed():
    # The machine ran twice as fast in repeat 2: adaptive beats K=2 within two of the three
    # repeats (paired median 1.05) while the ratio of medians says it loses.
    rows = [
        {
            "concurrency": 4,
            "spec": "none",
            "label": "no spec",
            "tok_s": 20.0,
            "tok_s_runs": [10.0, 40.0, 20.0],
        },
        {
            "concurrency": 4,
            "spec": "fixed",
            "label": "K=2",
            "tok_s": 30.0,
            "tok_s_runs": [20.0, 40.0, 30.0],
        },
        {
            "concurrency": 4,
            "spec": "adaptive",
            "label": "adaptive≤7",
            "tok_s": 24.0,
            "tok_s_runs": [22.0, 42.0, 24.0],
        },
    ]
    [line] = compare(rows)
    assert "0.800x best fixed (K=2) [paired over 3 repeats: median 1.050, 0.800-1.100]" in line
    assert "1.200x no spec [paired over 3 repeats: median 1.200, 1.050-2.200]" in line


def test_compare_also_pairs_the_repeats_with_the_host_at_full_speed():
    # Four repeats; the host probe (ms) says the host ran slow in repeat 1 for K=3 and in
    # repeat 3 for adaptive (either end of a run counts), full speed otherwise (at most
    # 1.25 x the fastest reading, 0.40): the full-speed pairs are repeats 0 and 2.
    fast, slow, half = (0.40, 0.42), (0.70, 0.66), (0.41, 0.52)
    rows = [
        {
            "concurrency": 16,
            "spec": "fixed",
            "label": "K=3",
            "tok_s": 100.0,
            "tok_s_runs": [100.0, 80.0, 100.0, 100.0],
            "probe_ms_runs": [fast, slow, fast, fast],
        },
        {
            "concurrency": 16,
            "spec": "adaptive",
            "label": "adaptive≤7",
            "tok_s": 95.0,
            "tok_s_runs": [102.0, 60.0, 104.0, 80.0],
            "probe_ms_runs": [fast, fast, fast, half],
        },
    ]
    [line] = compare(rows)
    assert (
        "[paired over 4 repeats: median 0.910, 0.750-1.040; "
        "host at full speed in both: median 1.030 over 2]" in line
    )
    # Every repeat at full speed (or no probes): the paired median alone.
    rows[0]["probe_ms_runs"] = rows[1]["probe_ms_runs"] = [fast] * 4
    [line] = compare(rows)
    assert "0.750-1.040]" in line and "full speed" not in line


def test_graph_capture_time_is_left_out_of_tok_s(tiny, monkeypatch):
    """Host time spent capturing graphs mid-measurement is start-up work: tok/s excludes
    it, tok_s_wall keeps it; the steps that captured are counted."""
    import dspark.bench.sweep as sweep

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    real_loop, real_forward = sweep.closed_loop, engine.forward
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
    monkeypatch.setattr(sweep, "closed_loop", two_second_loop)
    monkeypatch.setattr(engine, "capture_seconds", lambda: next(captured))
    monkeypatch.setattr(engine, "num_captures", lambda: captures[0])
    monkeypatch.setattr(engine, "forward", forward)
    prompts = [[5, 6, 7, i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    result = measure(engine, Setting("none", 0), prompts, params, 2)
    assert result.tokens == 12 and result.capture_s == pytest.approx(0.5)
    assert result.tok_s == pytest.approx(12 / 1.5) and result.tok_s_wall == pytest.approx(6.0)
    assert result.graph_captures == 2 and result.capture_steps == 2


def test_covered_steps_and_their_padding_count_the_measured_run_only(tiny, monkeypatch):
    """Steps that replayed a larger graph, and the padding tokens that added, are counted
    while measuring, not in the warm-up; so are steps that filled padding with drafts."""
    import dspark.bench.sweep as sweep

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2, cuda_graphs="on"))
    assert engine.graphs is not None
    real_loop, real_forward = sweep.closed_loop, engine.forward
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

    monkeypatch.setattr(sweep, "closed_loop", counted_loop)
    monkeypatch.setattr(engine, "forward", forward)
    prompts = [[5, 6, 7, i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    result = measure(engine, Setting("none", 0), prompts, params, 2)
    assert loops[0] == 2 and measured[0] > 0
    assert result.covered_steps == measured[0]
    assert result.covered_tokens == 16 * measured[0]
    assert (result.filled_steps, result.filled_drafts) == (measured[0], 3 * measured[0])
    summary = sweep.summarise([result])
    assert (summary["filled_steps"], summary["filled_drafts"]) == (measured[0], 3 * measured[0])


def test_a_full_warmup_runs_as_many_tokens_as_the_measured_run(tiny, monkeypatch):
    import dspark.bench.sweep as sweep

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    real_loop, loops = sweep.closed_loop, []

    def logged_loop(engine, prompts, params, concurrency):
        loops.append((len(prompts), params.max_tokens, params.temperature, params.top_k))
        return real_loop(engine, prompts, params, concurrency)

    monkeypatch.setattr(sweep, "closed_loop", logged_loop)
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


def test_summary_takes_medians_over_repeats_per_depth():
    from dspark.bench.sweep import Measurement, summarise

    def run(tok_s, depths, undrafted):
        return Measurement(
            "adaptive≤3",
            "adaptive",
            3,
            4,
            8,
            100,
            1.0,
            tok_s,
            1.0,
            1.0,
            1.0,
            1.5,
            2.0,
            0.01,
            undrafted_steps=undrafted,
            depth_steps=depths,
        )

    row = summarise(
        [run(10.0, [41, 7, 29, 5], 41), run(30.0, [1, 9, 31, 2], 1), run(20.0, [3, 8, 60, 9], 3)]
    )
    assert row["depth_steps"] == [3.0, 8.0, 31.0, 5.0]  # not the first repeat's [41, 7, 29, 5]
    assert row["undrafted_steps"] == 3.0 == row["depth_steps"][0]
    assert row["tok_s"] == 20.0 and row["tok_s_runs"] == [10.0, 30.0, 20.0]
    assert row["probe_ms_runs"] == [[0.0, 0.0]] * 3 and "probe_ms" not in row
    assert row["learnt_runs"] == [{}] * 3 and "learnt" not in row
    # Fresh runs ran the same prompts: the first's counts. Windows: their sums.
    assert (row["requests"], row["tokens"], row["seconds"]) == (8, 100, 1.0)
    windows = [replace(run(t, [1, 1, 1, 1], 1), window=True) for t in (10.0, 30.0)]
    windows[1] = replace(windows[1], requests=3, tokens=50, seconds=2.5)
    summed = summarise(windows)
    assert (summed["requests"], summed["tokens"], summed["seconds"]) == (11, 150, 3.5)


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


def test_a_variant_is_compared_with_the_plain_adaptive_of_its_repeats():
    plain = Setting("adaptive", 7)
    calibrated = parse_variant("cal:calibrate_survival=on", 7)
    assert (plain.label, calibrated.label) == ("adaptive≤7", "adaptive≤7 cal")
    rows = [
        {
            "concurrency": 16,
            "spec": "fixed",
            "label": "K=3",
            "tok_s": 100.0,
            "tok_s_runs": [100.0, 90.0, 110.0],
        },
        {
            "concurrency": 16,
            "spec": "adaptive",
            "label": plain.label,
            "tok_s": 95.0,
            "tok_s_runs": [95.0, 99.0, 100.0],
        },
        {
            "concurrency": 16,
            "spec": "adaptive",
            "label": calibrated.label,
            "tok_s": 104.5,
            "tok_s_runs": [104.5, 90.0, 120.0],
        },
    ]
    first, second = compare(rows)
    assert first.startswith("concurrency 16: adaptive 95.0 tok/s, 0.950x best fixed (K=3)")
    assert "adaptive≤7 [" not in first  # the plain variant is not compared with itself
    # paired variant / plain: 1.1, 0.909, 1.2 -> median 1.100
    assert second.startswith("concurrency 16: adaptive cal 104.5 tok/s, 1.045x best fixed")
    assert second.endswith("1.100x adaptive≤7 [paired over 3 repeats: median 1.100, 0.909-1.200]")


def test_variants_parse_into_engine_config_fields_of_their_types():
    setting = parse_variant("m2:depth_margin=0.02, calibrate_survival=off", 5)
    assert setting == Setting(
        "adaptive", 5, "m2", (("depth_margin", 0.02), ("calibrate_survival", False))
    )
    assert parse_variant("r:lookahead_reuse=none", 7).overrides == (("lookahead_reuse", None),)
    assert parse_variant("g:graph_padding_budget=0", 7).overrides == (
        ("graph_padding_budget", 0.0),
    )
    assert parse_variant("g:graph_padding_budget=auto", 7).overrides == (
        ("graph_padding_budget", "auto"),
    )
    assert parse_variant("a:allocation=device", 7).overrides == (("allocation", "device"),)
    for bad, named in [
        ("nocolon", "TAG:FIELD=VALUE"),
        ("x=y:depth_margin=0.1", "letters, digits and underscores"),
        (":depth_margin=0.1", "TAG:FIELD=VALUE"),
        ("x:depth_margn=0.1", "'depth_margn=0.1'"),
        ("x:num_drafts=3", "other than spec"),
        ("x:calibrate_survival=maybe", "takes on or off"),
        ("x:depth_margin=big", "takes a number"),
    ]:
        with pytest.raises(ValueError, match=named):
            parse_variant(bad, 7)


def _bench_args(*argv: str):
    """``dspark bench``'s arguments (its own parser and defaults) on the CPU."""
    import argparse

    from dspark.bench.sweep import add_cli_args

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(["--device", "cpu", *argv])


def test_a_variant_reaches_the_engine(tiny, tmp_path):
    from dspark.bench.sweep import engine_for

    args = _bench_args("--drafter", "ngram", "--out", str(tmp_path))
    assert args.variant == []
    variant = parse_variant("v:calibrate_survival=on,depth_margin=0.05", 3)
    on = engine_for(tiny, variant, 2, args)
    off = engine_for(tiny, Setting("adaptive", 3), 2, args)
    assert on.config.calibrate_survival and not off.config.calibrate_survival
    assert on.verifier.depth_margin == 0.05 and off.verifier.depth_margin == 0.0
    # A variant profiles apart, and may change a field the bench sets itself.
    assert on.config.profile_path != off.config.profile_path
    assert on.config.profile_path.endswith("-v.json")
    padded = engine_for(tiny, parse_variant("p:graph_padding_budget=0", 3), 2, args)
    assert padded.config.graph_padding_budget == 0.0
    assert off.config.graph_padding_budget == args.graph_padding_budget != 0.0


def test_bad_variants_fail_before_any_run():
    from dspark.bench.sweep import checked_variants

    for argv, named in [
        (["--variant", "m:depth_margin=1.5"], "--variant m: depth_margin must be in"),
        (["--variant", "d:draft_margin=-0.1"], "--variant d: draft_margin must be in"),
        (["--variant", "a:depth_margin=0.1", "--variant", "a:depth_margin=0.2"], "must differ"),
        (["--variant", "a:depth_margin=0.1", "--no-adaptive"], "--no-adaptive"),
        # Since session 27 a word, not a switch: "on" names no mode.
        (["--variant", "s:lookahead_shares=on"], "lookahead_shares must be 'decode', 'all'"),
    ]:
        with pytest.raises(ValueError, match=named):
            checked_variants(_bench_args(*argv))
    good = checked_variants(_bench_args("--variant", "m:depth_margin=0.1"))
    assert [v.label for v in good] == ["adaptive≤7 m"]
    shares = checked_variants(_bench_args("--variant", "s:lookahead_shares=all"))
    assert shares[0].overrides == (("lookahead_shares", "all"),)


def test_variants_are_compared_with_plain_adaptive_whatever_the_row_order():
    rows = [
        {"concurrency": 4, "spec": "adaptive", "label": "adaptive≤7 m", "tok_s": 12.0},
        {"concurrency": 4, "spec": "adaptive", "label": "adaptive≤7", "tok_s": 10.0},
    ]
    plain, variant = compare(rows)
    assert plain == "concurrency 4: adaptive 10.0 tok/s"
    assert variant == "concurrency 4: adaptive m 12.0 tok/s, 1.200x adaptive≤7"


def test_the_padding_budget_option_takes_auto_or_a_number_of_steps():
    import argparse

    from dspark.bench.sweep import _padding_budget

    assert _padding_budget("auto") == _padding_budget(" AUTO ") == "auto"
    assert _padding_budget("0") == 0.0 and _padding_budget("2.5") == 2.5
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(argparse.ArgumentTypeError, match="auto"):
            _padding_budget(bad)


def _sliced(tiny, label_k, prompts, params, concurrency):
    from dspark.bench.sweep import SlicedLoop

    spec, k = label_k
    config = EngineConfig(max_num_seqs=concurrency, spec=spec, num_drafts=max(k, 1))
    engine = LLMEngine(tiny, config)
    return SlicedLoop(engine, Setting(spec, k), prompts, params, concurrency)


def test_sliced_windows_count_each_token_once_and_give_every_loop_its_window(tiny):
    from dspark.bench.sweep import sliced_windows

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

    from dspark.bench.sweep import sliced_windows

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
    # slow steps: session 42 saw the half second this test slept before fall short).
    assert fast.engine.idle_s >= 1.0
    assert result.requests == len(fast.finished) > 0
    assert max(r.finish_time - r.first_token_time for r in fast.finished) < 0.9


def test_sliced_loops_of_long_and_short_steps_end_the_window_together(tiny):
    import time

    from dspark.bench.sweep import sliced_windows

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
    # repaid, so both loops take their turn in the last round (with slices of fixed
    # length the short-step loop ran its last turns alone).
    # A loop whose step overran a round's target by more than a slice sits rounds out
    # (none unless the machine is busy: session 42's run beside other tests had a
    # short-step loop two turns behind): one turn apart, and as many more as the longest
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


def test_time_slices_are_the_cpu_default_and_bring_two_repeats():
    from dspark.bench.sweep import CPU_SLICE_MS, SLICED_REPEATS, resolve_defaults

    cpu = resolve_defaults(_bench_args())
    assert (cpu.slice_ms, cpu.repeats) == (CPU_SLICE_MS, SLICED_REPEATS) == (250.0, 2)
    cuda = resolve_defaults(_bench_args("--device", "cuda"))
    assert (cuda.slice_ms, cuda.repeats) == (0.0, 1)
    # Given values stand.
    given = resolve_defaults(_bench_args("--slice-ms", "0", "--repeats", "3"))
    assert (given.slice_ms, given.repeats) == (0.0, 3)
    assert resolve_defaults(_bench_args("--slice-ms", "100")).repeats == SLICED_REPEATS


def test_sliced_engines_that_do_not_fit_side_by_side_say_how_to_run(tiny, monkeypatch, tmp_path):
    import torch

    from dspark.bench import sweep

    built = []

    def engine_for(loaded, setting, concurrency, args, replay=None):
        if built:
            raise torch.OutOfMemoryError("CUDA out of memory")
        built.append(LLMEngine(tiny, EngineConfig(max_num_seqs=concurrency)))
        return built[-1]

    monkeypatch.setattr(sweep, "engine_for", engine_for)
    monkeypatch.setattr(sweep, "bench_prompts", lambda tok, args, n: [[5, 6, i] for i in range(n)])
    args = sweep.resolve_defaults(
        _bench_args("--out", str(tmp_path), "--concurrency", "2", "--max-tokens", "3")
    )
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    settings = [Setting("none", 0), Setting("fixed", 2)]
    with pytest.raises(RuntimeError, match=r"K=2 at concurrency 2 .* 1 built .* --slice-ms 0"):
        sweep._run_sliced(args, tiny, None, settings, params, None, {})


def test_a_small_rows_variant_is_refused_time_sliced_before_the_model_loads(monkeypatch):
    from dspark.bench import sweep

    monkeypatch.setattr(sweep, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    args = _bench_args("--variant", "t:small_rows=transposed")
    with pytest.raises(ValueError, match=r"small_rows cannot run time-sliced.*--slice-ms 0"):
        sweep.main(args)


def _plain_engines_on_short_prompts(monkeypatch, sweep, tiny) -> None:
    """Every setting's engine a plain one on ``tiny``, and three-token prompts: a bench
    run in a few milliseconds, for tests of its bookkeeping."""
    monkeypatch.setattr(
        sweep,
        "engine_for",
        lambda loaded, setting, concurrency, args, replay=None: LLMEngine(
            tiny, EngineConfig(max_num_seqs=concurrency)
        ),
    )
    monkeypatch.setattr(sweep, "bench_prompts", lambda tok, args, n: [[5, 6, i] for i in range(n)])


def test_the_step_log_holds_every_measured_step_of_every_window(tiny, monkeypatch, tmp_path):
    """``--step-log``: steps.json has one entry per setting and window, and its steps'
    emitted tokens are the tokens that window measured (warm-up and priming left out)."""
    import json

    from dspark.bench import sweep

    _plain_engines_on_short_prompts(monkeypatch, sweep, tiny)
    args = sweep.resolve_defaults(
        _bench_args(
            "--out",
            str(tmp_path),
            "--concurrency",
            "2",
            "--max-tokens",
            "3",
            "--window-s",
            "0.2",
            "--slice-ms",
            "50",
            "--step-log",
        )
    )
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    settings = [Setting("none", 0), Setting("fixed", 2)]
    runs = {}
    steps = sweep.StepLog(tmp_path / "steps.json")
    sweep._run_sliced(args, tiny, None, settings, params, None, runs, steps)
    logged = json.loads((tmp_path / "steps.json").read_text())
    assert [(r["label"], r["repeat"]) for r in logged] == [
        (label, repeat) for repeat in range(args.repeats) for label in ("no spec", "K=2")
    ]
    for entry in logged:
        measured = runs[entry["label"], 2][entry["repeat"]]
        emitted = entry["fields"].index("emitted")
        assert sum(step[emitted] for step in entry["steps"]) == measured.tokens > 0


def test_a_stopped_bench_keeps_the_repeats_every_setting_of_a_level_finished():
    from dspark.bench.sweep import finished_repeats

    labels = ["no spec", "K=1", "adaptive≤7"]
    runs = {
        ("no spec", 1): ["n1a", "n1b"],
        ("K=1", 1): ["k1a", "k1b"],
        ("adaptive≤7", 1): ["a1a", "a1b"],
        ("no spec", 4): ["n4a", "n4b"],
        ("K=1", 4): ["k4a", "k4b"],
        ("adaptive≤7", 4): ["a4a"],  # stopped in its second repeat
        ("no spec", 16): ["n16a"],  # K=1 and adaptive never finished one here
    }
    kept, left_out = finished_repeats(runs, labels)
    assert kept == {
        ("no spec", 1): ["n1a", "n1b"],
        ("K=1", 1): ["k1a", "k1b"],
        ("adaptive≤7", 1): ["a1a", "a1b"],
        ("no spec", 4): ["n4a"],
        ("K=1", 4): ["k4a"],
        ("adaptive≤7", 4): ["a4a"],
    }
    assert left_out == 3  # n4b, k4b and n16a
    assert finished_repeats({}, labels) == ({}, 0)


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_a_bench_stopped_by_a_signal_reports_what_it_finished(tiny, monkeypatch, tmp_path, how):
    """Ctrl-C or SIGTERM (``timeout``) in the middle of a run: ``dspark bench`` still writes
    its table and ``bench.json`` from the repeats every setting finished, says it was
    stopped, and exits as the signal would have."""
    import json
    import os
    import signal

    from dspark.bench import sweep

    monkeypatch.setattr(sweep, "load_model", lambda *a, **k: tiny)
    _plain_engines_on_short_prompts(monkeypatch, sweep, tiny)
    handler = signal.getsignal(signal.SIGTERM)
    measured = []
    real_measure = sweep.measure

    def measure(*args, **kwargs):
        if len(measured) == 3:  # three runs done: stopped inside the second repeat's second
            if how == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
            raise KeyboardInterrupt
        measured.append(real_measure(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(sweep, "measure", measure)
    args = _bench_args(
        "--out",
        str(tmp_path),
        "--concurrency",
        "2",
        "--max-tokens",
        "3",
        "--fixed",
        "1",
        "--no-adaptive",
        "--repeats",
        "3",
        "--slice-ms",
        "0",
        "--min-requests",
        "2",
    )
    with pytest.raises(SystemExit) as stop:
        sweep.main(args)
    assert stop.value.code == {"SIGINT": 130, "SIGTERM": 143}[how]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["stopped"]["by"] == how
    # Two settings (no spec, K = 1) ran in the first repeat and one in the second: the
    # table keeps the first repeat, and the second's lone run is left out.
    assert report["stopped"]["runs_left_out"] == 1
    assert sorted(r["label"] for r in report["rows"]) == ["K=1", "no spec"]
    assert [len(r["tok_s_runs"]) for r in report["rows"]] == [1, 1]
    partial = json.loads((tmp_path / "bench.partial.json").read_text())
    assert len(partial) == 3  # every finished run stays in the partial file
    assert signal.getsignal(signal.SIGTERM) is handler  # put back as it was


@pytest.mark.parametrize("flag", ["--fixed", "--concurrency"])
def test_repeated_fixed_ks_or_levels_are_refused_before_the_model_loads(monkeypatch, flag):
    """Two settings of one K (or two levels of one concurrency) would share one row's runs,
    and a repeat would no longer pair one run of each setting."""
    from dspark.bench import sweep

    monkeypatch.setattr(sweep, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ValueError, match=f"{flag} values must differ"):
        sweep.main(_bench_args(flag, "1", "1"))
