"""``dspark bench`` accounting: every token counted once, the closed loop never exceeds
its concurrency, TPOT comes from each request's own timestamps."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dspark.bench.sweep import Setting, closed_loop, compare, measure
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


def test_steps_that_capture_graphs_are_left_out_of_tok_s(tiny, monkeypatch):
    """A step that captures a graph (a one-time cost per shape) is left out of the steady
    tok/s, its wall time and its tokens; tok_s_wall keeps everything."""
    import dspark.bench.sweep as sweep

    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=2))
    captures, loops, measured_steps, marked = [0], [0], [0], []
    real_loop, real_step, real_forward = sweep.closed_loop, engine.step, engine.forward

    def counting_loop(*args):
        loops[0] += 1
        return real_loop(*args)

    def capturing_forward(*args, **kwargs):
        if marked and marked[-1] is None:  # this step "captures": slow, once
            captures[0] += 1
            time.sleep(0.05)
        return real_forward(*args, **kwargs)

    def step():
        if loops[0] == 2:  # the measured loop
            measured_steps[0] += 1
            if measured_steps[0] in (2, 4):
                marked.append(None)
                tokens, start = engine.stats.num_generated, time.perf_counter()
                out = real_step()
                marked[-1] = (engine.stats.num_generated - tokens, time.perf_counter() - start)
                return out
        return real_step()

    monkeypatch.setattr(sweep, "closed_loop", counting_loop)
    monkeypatch.setattr(engine, "num_captures", lambda: captures[0])
    monkeypatch.setattr(engine, "forward", capturing_forward)
    monkeypatch.setattr(engine, "step", step)
    prompts = [[5, 6, 7, i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    result = measure(engine, Setting("none", 0), prompts, params, 2)
    assert result.tokens == 12 and result.capture_steps == 2 and result.graph_captures == 2
    marked_tokens = sum(tokens for tokens, _ in marked)
    marked_s = sum(wall for _, wall in marked)
    assert marked_tokens >= 2
    # The time left out is those steps' wall (as the step sees it: within the wrapper's).
    left_out = result.seconds - (12 - marked_tokens) / result.tok_s
    assert marked_s - 5e-4 < left_out <= marked_s
    assert result.tok_s_wall == pytest.approx(12 / result.seconds)
    assert result.tok_s > result.tok_s_wall  # the slow steps are out
