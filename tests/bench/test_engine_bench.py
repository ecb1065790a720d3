"""``dspark bench-engine``: the engine and transformers' generate on the same prompts."""

import json

import numpy as np
import pytest

from dspark.bench.engine import EngineBenchRow, peer_ratios
from dspark.cli import main


def test_ratios_pair_each_setting_with_each_peer_at_its_level():
    rows = [
        EngineBenchRow("dspark:none", 1, 30.0, [30.0]),
        EngineBenchRow("transformers", 1, 10.0, [10.0]),
        EngineBenchRow("transformers:static", 1, 15.0, [15.0]),
        EngineBenchRow("dspark:none", 4, 80.0, [80.0]),
        EngineBenchRow("transformers", 4, 20.0, [20.0]),
    ]
    assert peer_ratios(rows) == {
        ("dspark:none", "transformers", 1): 3.0,
        ("dspark:none", "transformers:static", 1): 2.0,
        ("dspark:none", "transformers", 4): 4.0,
    }


def run_bench(tmp_path, *hf, prompts=None):
    argv = ["bench-engine", "--concurrency", "2", "--max-tokens", "4", "--repeats", "2"]
    argv += ["--max-prompt-tokens", "64", "--out-dir", str(tmp_path), "--hf", *hf]
    if prompts is not None:
        argv += ["--prompts", str(prompts)]
    assert main(argv) == 0
    return json.loads((tmp_path / "bench_engine_sharegpt_cpu.json").read_text())


def test_bench_engine_times_dspark_and_transformers_side_by_side(smollm2, tmp_path):
    # Prompts from a tokenised file, as on a machine without the data packages.
    flat = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    np.savez(tmp_path / "prompts.npz", eval_flat=np.array(flat), eval_lengths=np.array([4, 5]))
    payload = run_bench(tmp_path, "eager", "static", prompts=tmp_path / "prompts.npz")
    systems = {(r["system"], r["concurrency"]) for r in payload["rows"]}
    names = ("dspark:none", "transformers", "transformers:static")
    assert systems == {(s, 2) for s in names}
    for row in payload["rows"]:
        assert len(row["tok_s_runs"]) == 2 and row["tok_s"] > 0
    assert len(payload["ratios"]) == 2
    assert (tmp_path / "bench_engine_sharegpt_cpu.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_engine_compiles_transformers_on_the_cpu(smollm2, tmp_path, monkeypatch):
    import torch

    compiled, compile_ = [], torch.compile

    def counted(*args, **kwargs):
        compiled.append(kwargs.get("mode"))
        return compile_(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", counted)
    payload = run_bench(tmp_path, "compiled")
    assert {r["system"] for r in payload["rows"]} == {"dspark:none", "transformers:compiled"}
    assert compiled and set(compiled) == {"default"}  # generate compiled its forward
