"""The engine on the fused kernels (``dspark.ops.fused``, the Triton paged attention
through the padded runner's ``PagedLayout``) gives the eager ops' greedy output. Padded
steps run eagerly on the CPU (``cuda_graphs="on"``), interpreted (TRITON_INTERPRET=1)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dspark.engine.graphs import PaddedStepRunner
from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.engine.sampling import SamplingParams
from dspark.ops.fused import EAGER_OPS_ENV
from tests.conftest import make_tiny_model
from tests.engine.test_engine import repetitive_prompts, run

# Padding tokens' rows are never written by the attention kernel: the interpreter then
# computes on whatever the memory held, and numpy warns when that overflows.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

SHORT = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture
def needs_triton():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1")


@pytest.mark.parametrize("spec", ["none", "fixed"])
def test_fused_padded_steps_give_the_eager_greedy_output(needs_triton, tmp_path, monkeypatch, spec):
    target = make_tiny_model(tmp_path / "t")
    # Three short prompts and one longer than a piece (its chunk is cut into pieces).
    prompts = [*repetitive_prompts(3), list(range(3, 30))]
    extra = {"spec": spec, "drafter": "ngram", "num_drafts": 3} if spec != "none" else {}
    config = {"cuda_graphs": "on", "max_num_batched_tokens": 32, **extra}
    monkeypatch.setenv(EAGER_OPS_ENV, "1")
    eager, eager_engine = run(target, prompts, SHORT, **config)
    assert not eager_engine.graphs.paged
    monkeypatch.setenv(EAGER_OPS_ENV, "0")
    got, engine = run(target, prompts, SHORT, **config)
    assert engine.graphs.paged  # the runner built PagedLayouts, no eager gathers
    assert engine.graphs.num_runs >= engine.stats.num_steps - 1
    if spec != "none":  # drafts were verified through the fused path
        assert engine.stats.num_verified > engine.stats.num_decode_rounds
    assert [o.token_ids for o in got] == [o.token_ids for o in eager]


def test_paged_runner_writes_no_cache_row_for_padding(needs_triton, tmp_path, monkeypatch):
    """Padding tokens write nothing (their outputs are never computed); the real tokens'
    rows are written as the eager padded step writes them."""
    monkeypatch.setenv(EAGER_OPS_ENV, "0")
    tiny = make_tiny_model(tmp_path / "t", num_hidden_layers=1)
    caches = [PagedKVCache(tiny.config, 16, 4, torch.float32) for _ in range(2)]
    runners = []
    for cache, paged in zip(caches, (False, True), strict=True):
        body = lambda ids, pos, batch, cache=cache: tiny.model(ids, pos, batch, cache.layers)[0]  # noqa: E731
        runners.append(PaddedStepRunner(body, cache, 32, 32, 32, capture=False, paged=paged))
    tables = [BlockTable() for _ in caches]
    for cache, table in zip(caches, tables, strict=True):
        assert cache.reserve(table, 6)
    assert tables[0].blocks == tables[1].blocks
    before = [cache.layers[0][0].clone() for cache in caches]
    outputs = []
    with torch.inference_mode():
        for runner, table, paged in zip(runners, tables, (False, True), strict=True):
            monkeypatch.setenv(EAGER_OPS_ENV, "0" if paged else "1")
            # 3 tokens pad to 4: one padding token.
            outputs.append(runner.run([table], np.array([3]), np.array([3]), np.array([1, 2, 3])))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    scratch = runners[1].scratch_block
    eager_k, paged_k = (cache.layers[0][0] for cache in caches)
    assert torch.equal(paged_k.view(16, 4, -1)[scratch], before[1].view(16, 4, -1)[scratch])
    assert not torch.equal(eager_k.view(16, 4, -1)[scratch], before[0].view(16, 4, -1)[scratch])
    rows = table.rows(np.arange(3, 6), 4)
    torch.testing.assert_close(paged_k[rows], eager_k[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["none", "fixed"])
def test_captured_fused_steps_give_the_eager_greedy_output(tmp_path, monkeypatch, spec):
    """On CUDA: steps captured as CUDA graphs on the fused kernels, against the eager ops
    captured alike (fp32, so greedy ties stay rare)."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA device and the compiled kernels")
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    target.model.cuda()
    prompts = [*repetitive_prompts(10), list(range(3, 90))]
    extra = {"spec": spec, "drafter": "ngram", "num_drafts": 4} if spec != "none" else {}
    config = {"cuda_graphs": "auto", "max_num_batched_tokens": 128, **extra}
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    monkeypatch.setenv(EAGER_OPS_ENV, "1")
    eager, _ = run(target, prompts, params, **config)
    monkeypatch.setenv(EAGER_OPS_ENV, "0")
    got, engine = run(target, prompts, params, **config)
    assert engine.graphs.paged and engine.graphs.num_captures > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in eager]
