"""``dspark bench``'s command line and drivers: its options and their defaults, the
time-sliced driver, the step log, and a bench stopped by a signal."""

from __future__ import annotations

import pytest

from dspark.bench.settings import Setting
from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams


def bench_args(*argv: str):
    """``dspark bench``'s arguments (its own parser and defaults) on the CPU."""
    import argparse

    from dspark.bench.sweep import add_cli_args

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(["--device", "cpu", *argv])


def test_the_padding_budget_option_takes_a_number_of_steps():
    import argparse

    from dspark.bench.sweep import _padding_budget

    assert _padding_budget("0") == 0.0 and _padding_budget("2.5") == 2.5
    for bad in ("-1", "nan", "soon", "auto"):
        with pytest.raises(argparse.ArgumentTypeError, match="a number"):
            _padding_budget(bad)


def test_time_slices_are_the_cpu_default_and_bring_two_repeats():
    from dspark.bench.sweep import CPU_SLICE_MS, SLICED_REPEATS, resolve_defaults

    cpu = resolve_defaults(bench_args())
    assert (cpu.slice_ms, cpu.repeats) == (CPU_SLICE_MS, SLICED_REPEATS) == (250.0, 2)
    cuda = resolve_defaults(bench_args("--device", "cuda"))
    assert (cuda.slice_ms, cuda.repeats) == (0.0, 1)
    # Given values stand.
    given = resolve_defaults(bench_args("--slice-ms", "0", "--repeats", "3"))
    assert (given.slice_ms, given.repeats) == (0.0, 3)
    assert resolve_defaults(bench_args("--slice-ms", "100")).repeats == SLICED_REPEATS


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
        bench_args("--out", str(tmp_path), "--concurrency", "2", "--max-tokens", "3")
    )
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    settings = [Setting("none", 0), Setting("fixed", 2)]
    with pytest.raises(RuntimeError, match=r"K=2 at concurrency 2 .* 1 built .* --slice-ms 0"):
        sweep._run_sliced(args, tiny, None, settings, params, None, {})


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
        bench_args(
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
    args = bench_args(
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
        sweep.main(bench_args(flag, "1", "1"))
