"""``dspark bench``'s records: what adaptive verification learnt in a run, and the
rows of medians over repeats."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dspark.bench.loops import measure
from dspark.bench.settings import Setting
from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams
from tests.conftest import engine_config


def test_an_adaptive_run_reports_what_its_cost_model_learnt(tiny):
    from dspark.bench.measurement import learnt_state
    from dspark.scheduling import build_cost_tables, build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    # A learning cost model over fixed tables (no start-up profile on this tiny model):
    # verify T tokens 1 + T/100 ms, drafting d deep d/10 ms; K = 3.
    tables = build_cost_tables([(1, 0.3), (2, 0.3)], [(1, 1.01), (64, 1.64)], 2, 64, 1)
    depth = build_depth_costs({1: [(1, 0.1), (2, 0.1)], 3: [(1, 0.3), (2, 0.3)]}, 3, 2)
    model = ObservedDraftCost(tables, depth_ms=depth, num_positions=3)
    engine = LLMEngine(
        tiny,
        engine_config(max_num_seqs=2, spec="adaptive", num_drafts=3, throughput_gate=False),
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


def test_summary_takes_medians_over_repeats_per_depth():
    from dspark.bench.measurement import Measurement, summarise

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
