import numpy as np

import dspark.scheduling.verifier as verifier_module
from dspark.bench.scheduler import BenchConfig, bench_size, format_table, h200_seed_tables


def test_every_verifier_plan_in_the_bench_is_a_real_search(monkeypatch):
    searches = []
    real_search = verifier_module.best_budget

    def counting(*args):
        searches.append(args[1])
        return real_search(*args)

    monkeypatch.setattr(verifier_module, "best_budget", counting)
    config = BenchConfig(sizes=(8,), num_inputs=3, repeats=2, torch_device=None)
    result = bench_size(config, 8, h200_seed_tables(8))
    # verifier_plan and verifier_step each search once per input in the warm-up and in
    # every repeat (2 * 3 * 3 plans); drafting_depth prices depths without best_budget.
    assert len(searches) == 2 * 3 * (1 + 2)
    assert result.budget_mismatches == 0
    cases = {
        "budget",
        "seed_budget",
        "allocate",
        "verifier_plan",
        "drafting_depth",
        "verifier_step",
        "gate_step",
    }
    assert cases <= set(result.us)
    assert np.isfinite(list(result.us.values())).all()
    assert "mismatch" in format_table([result])


def test_the_saved_results_name_the_code_that_ran(tmp_path):
    import json

    from dspark.bench.provenance import source_digest
    from dspark.bench.scheduler import run, save

    config = BenchConfig(sizes=(4,), num_inputs=1, repeats=1, torch_device=None, out_dir=tmp_path)
    json_path, _ = save(run(config), config)
    saved = json.loads(json_path.read_text())
    assert saved["source_digest"] == source_digest()
    assert [r["num_reqs"] for r in saved["results"]] == [4]


def test_the_gate_step_is_timed_on_full_windows_that_the_cap_reads():
    from dspark.bench.scheduler import _gate_step
    from dspark.scheduling.gate import ALONE_WINDOW, DRAFTED, UNDRAFTED

    for num_reqs, window in [(1, ALONE_WINDOW), (64, 16)]:
        step = _gate_step(num_reqs, 0)
        bucket = step.gate._get(num_reqs, False)
        assert [len(bucket.samples[arm]) for arm in (DRAFTED, UNDRAFTED)] == [window, window]
        walls = [wall for _, wall in bucket.samples[DRAFTED]]
        assert max(walls) > 2 * min(walls)  # some above twice the shortest: the cap applies
        # Drafted steps lead (2.5x the undrafted tokens a ms): the undrafted arm is only
        # explored, so the timed decisions are mostly the drafting ones.
        assert sum(step(None) for _ in range(64)) >= 60
