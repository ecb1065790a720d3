"""The fused Triton ops (add + RMSNorm, rotary + cache write, silu · mul) against their
eager references, and a whole ``LlamaModel.forward`` fused against eager. Run
interpreted on a CPU (TRITON_INTERPRET=1); the ``gpu`` tests run the compiled kernels."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.models.llama import Rotary
from dspark.ops import fused
from dspark.ops import triton_attention as attention_ops
from tests.conftest import make_tiny_model

FP32_TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture
def needs_triton():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1")


@pytest.fixture
def needs_cuda():
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("runs the compiled kernels; unset TRITON_INTERPRET")


def assert_within_one_ulp(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal, or neighbours in the dtype (bf16 / fp16: adjacent bit patterns)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16}[got.dtype]
    steps = (got.view(bits).int() - expected.view(bits).int()).abs()
    same = got.float() == expected.float()  # +0 and -0
    bad = ~((steps <= 1) | same)
    assert not bad.any(), f"{int(bad.sum())} values more than one ulp off, e.g. " + str(
        (got[bad][:4].tolist(), expected[bad][:4].tolist())
    )


def column_major(x: torch.Tensor) -> torch.Tensor:
    """The same values with rows strided, as the CPU's transposed products leave them."""
    return x.t().contiguous().t()


def random(shape, dtype, device, seed, scale=1.0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


# ---- add + RMSNorm ----------------------------------------------------------------------


def check_add_rms_norm(dtype, device, num_rows, size, seed, strided=False):
    residual = random((num_rows, size), dtype, device, seed, scale=3.0)
    delta = random((num_rows, size), dtype, device, seed + 1)
    weight = (random((size,), torch.float32, device, seed + 2).abs() + 0.5).to(dtype)
    if strided:
        delta = column_major(delta)
    for given in (delta, None):
        normed, new_residual = fused.add_rms_norm(given, residual, weight, 1e-6)
        want_normed, want_residual = fused.add_rms_norm_reference(given, residual, weight, 1e-6)
        assert torch.equal(new_residual, want_residual)  # the add rounds once, alike
        if dtype == torch.float32:
            torch.testing.assert_close(normed, want_normed, **FP32_TOL)
        else:
            assert_within_one_ulp(normed, want_normed)
    assert fused.add_rms_norm(None, residual, weight, 1e-6)[1] is residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_rows", "size"), [(1, 64), (7, 200), (3, 576)])
def test_add_rms_norm_matches_eager(needs_triton, dtype, num_rows, size):
    check_add_rms_norm(dtype, "cpu", num_rows, size, seed=num_rows, strided=size == 200)


def test_add_rms_norm_refuses_mismatched_inputs(needs_triton):
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="delta must match"):
        fused.add_rms_norm(torch.zeros(2, 4), x, torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="weight must be"):
        fused.add_rms_norm(None, x, torch.ones(8, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match="2-D float"):
        fused.add_rms_norm(None, x.long(), torch.ones(8), 1e-6)
    assert fused.add_rms_norm(None, torch.zeros(0, 8), torch.ones(8), 1e-6)[0].shape == (0, 8)


# ---- rotary + cache write ---------------------------------------------------------------


def check_rotary_write(
    dtype, cache_dtype, device, heads, kv_heads, head_dim, seed, strided, tables=torch.float32
):
    num_tokens, num_rows = 6, 20
    rotary = Rotary(head_dim, 10000.0, 300).to(device, tables)  # bf16: a model cast whole
    qkv = random((num_tokens, (heads + 2 * kv_heads) * head_dim), dtype, device, seed)
    if strided:
        qkv = column_major(qkv)
    positions = torch.tensor([0, 17, 5, 299, 1, 64], device=device)
    write = torch.tensor([3, 0, -1, 19, 7, -1], device=device)  # -1: padding, not written
    caches = [
        random((num_rows, kv_heads, head_dim), cache_dtype, device, seed + i) for i in range(4)
    ]
    k_cache, v_cache, k_want, v_want = caches[0], caches[1], caches[0].clone(), caches[1].clone()
    args = (positions, rotary.cos, rotary.sin)
    shape = (heads, kv_heads, head_dim)
    q = fused.rotary_write(qkv, *args, k_cache, v_cache, write, *shape)
    want = fused.rotary_write_reference(qkv, *args, k_want, v_want, write, *shape)
    # Every product and sum rounds as eagerly: bit for bit, in fp32 as in bf16.
    assert q.is_contiguous() and q.dtype == dtype
    assert torch.equal(q, want)
    assert torch.equal(k_cache, k_want)
    assert torch.equal(v_cache, v_want)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "shape", "strided", "tables"),
    [
        (torch.float32, torch.float32, (3, 1, 16), False, torch.float32),
        (torch.float32, torch.float32, (9, 3, 64), True, torch.float32),
        (torch.bfloat16, torch.bfloat16, (9, 3, 64), False, torch.float32),
        (torch.bfloat16, torch.float32, (4, 2, 48), True, torch.float32),  # D under a power of 2
        (torch.float32, torch.bfloat16, (2, 2, 16), False, torch.float32),
        (torch.bfloat16, torch.bfloat16, (2, 1, 16), False, torch.bfloat16),
    ],
)
def test_rotary_write_matches_eager(needs_triton, dtype, cache_dtype, shape, strided, tables):
    check_rotary_write(dtype, cache_dtype, "cpu", *shape, sum(shape), strided, tables)


def test_rotary_write_refuses_mismatched_inputs(needs_triton):
    rotary = Rotary(16, 10000.0, 32)
    qkv, cache = torch.zeros(2, 4 * 16), torch.zeros(8, 1, 16)
    positions, write = torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    tables = (rotary.cos, rotary.sin)
    with pytest.raises(ValueError, match="not \\(heads 3"):
        fused.rotary_write(qkv, positions, *tables, cache, cache, write, 3, 1, 16)
    with pytest.raises(ValueError, match="positions must be"):
        fused.rotary_write(qkv, positions[:1], *tables, cache, cache, write, 2, 1, 16)
    with pytest.raises(ValueError, match="cos must be"):
        fused.rotary_write(
            qkv, positions, rotary.cos[:, :8], rotary.sin, cache, cache, write, 2, 1, 16
        )
    with pytest.raises(ValueError, match="k_cache must be"):
        fused.rotary_write(qkv, positions, *tables, cache[:, :, :8], cache, write, 2, 1, 16)


# ---- silu · mul -------------------------------------------------------------------------


def check_silu_mul(dtype, device, num_rows, size, seed, strided=False):
    gate_up = random((num_rows, 2 * size), dtype, device, seed, scale=4.0)
    if strided:
        gate_up = column_major(gate_up)
    got, want = fused.silu_mul(gate_up), fused.silu_mul_reference(gate_up)
    assert got.is_contiguous() and got.shape == (num_rows, size)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, **FP32_TOL)
    else:
        assert_within_one_ulp(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_rows", "size", "strided"), [(1, 128, False), (5, 1500, True)])
def test_silu_mul_matches_eager(needs_triton, dtype, num_rows, size, strided):
    check_silu_mul(dtype, "cpu", num_rows, size, seed=size, strided=strided)


def test_silu_mul_refuses_an_odd_width(needs_triton):
    with pytest.raises(ValueError, match="even width"):
        fused.silu_mul(torch.zeros(2, 7))


# ---- switch -----------------------------------------------------------------------------


def test_fused_ops_follow_the_device_and_the_escape_hatch(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv(fused.EAGER_OPS_ENV, raising=False)
    assert not fused.fused_ops_enabled(torch.device("cpu"))
    assert fused.fused_ops_enabled(torch.device("cuda")) == fused.triton_available()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused.fused_ops_enabled(torch.zeros(1)) == fused.triton_available()
    monkeypatch.setenv(fused.EAGER_OPS_ENV, "1")
    assert not fused.fused_ops_enabled(torch.device("cuda"))


# ---- the whole model --------------------------------------------------------------------


def model_step(loaded, monkeypatch, fused_on: bool, paged: bool, device="cpu"):
    """One mixed step (a prompt chunk longer than a decode group's queries, decodes, a
    verify step) over random cached rows: final hidden states, every layer's captured
    output, and the caches after."""
    monkeypatch.setenv(fused.EAGER_OPS_ENV, "0" if fused_on else "1")
    model, config = loaded.model, loaded.config
    dtype = next(model.parameters()).dtype
    cache = PagedKVCache(config, 32, 4, dtype, device)
    for k_cache, v_cache in cache.layers:
        k_cache.copy_(random(k_cache.shape, dtype, device, 1))
        v_cache.copy_(random(v_cache.shape, dtype, device, 2))
    num_cached, num_query = np.array([5, 0, 13, 2]), np.array([1, 21, 1, 5])
    tables = []
    for cached, query in zip(num_cached, num_query, strict=True):
        tables.append(BlockTable())
        assert cache.reserve(tables[-1], int(cached + query))
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 256, int(num_query.sum())))
    positions = np.concatenate(
        [np.arange(c, c + q) for c, q in zip(num_cached, num_query, strict=True)]
    )
    batch = cache.attention_batch(tables, num_cached, num_query)
    if paged:
        blocks = [t.blocks for t in tables]
        batch.paged = attention_ops.paged_layout(blocks, num_cached, num_query, 4, device=device)
    layers = tuple(range(config.num_layers))
    with torch.inference_mode():
        hidden, captured = model(
            ids.to(device),
            torch.from_numpy(positions).to(device),
            batch,
            cache.layers,
            capture_layers=layers,
        )
    return hidden, captured, cache.layers


@pytest.mark.parametrize("paged", [False, True])
def test_model_forward_fused_matches_eager(needs_triton, tmp_path, monkeypatch, paged):
    """The fused forward (eager group attention, or the Triton kernel through
    ``batch.paged``) gives the eager hidden states, layer outputs and cache rows."""
    loaded = make_tiny_model(tmp_path / "tiny", num_hidden_layers=3)
    expected = model_step(loaded, monkeypatch, fused_on=False, paged=paged)
    got = model_step(loaded, monkeypatch, fused_on=True, paged=paged)
    torch.testing.assert_close(got[0], expected[0], **FP32_TOL)
    assert len(got[1]) == len(expected[1]) == 3
    for layer_out, want in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(layer_out, want, **FP32_TOL)
    for (k, v), (k_want, v_want) in zip(got[2], expected[2], strict=True):
        torch.testing.assert_close(k, k_want, **FP32_TOL)
        torch.testing.assert_close(v, v_want, **FP32_TOL)


def test_models_with_qk_norm_stay_eager(tmp_path):
    loaded = make_tiny_model(tmp_path / "tiny", model_type="qwen3")
    assert loaded.config.qk_norm
    assert not loaded.model.uses_fused_ops(torch.device("cuda"))


def test_a_paged_only_batch_refuses_the_eager_ops(tmp_path, monkeypatch):
    loaded = make_tiny_model(tmp_path / "tiny", num_hidden_layers=1)
    monkeypatch.setenv(fused.EAGER_OPS_ENV, "1")
    cache = PagedKVCache(loaded.config, 4, 4, torch.float32)
    table = BlockTable()
    assert cache.reserve(table, 1)
    batch = cache.attention_batch([table], np.array([0]), np.array([1]))
    batch.groups = []
    batch.paged = attention_ops.paged_layout([table.blocks], [0], [1], 4)
    with pytest.raises(ValueError, match="only a paged layout"):
        loaded.model(torch.tensor([1]), torch.tensor([0]), batch, cache.layers)


# ---- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_compiled_ops_on_cuda_match_eager_in_bf16(needs_cuda):
    for num_rows, size in ((1, 576), (37, 576), (5, 4096), (3, 8192)):
        check_add_rms_norm(torch.bfloat16, "cuda", num_rows, size, seed=size)
    check_add_rms_norm(torch.float32, "cuda", 9, 576, seed=3)
    for heads, kv_heads, head_dim in ((9, 3, 64), (32, 8, 128)):
        for cache_dtype in (torch.bfloat16, torch.float32):
            check_rotary_write(
                torch.bfloat16, cache_dtype, "cuda", heads, kv_heads, head_dim, 1, False
            )
    check_rotary_write(torch.float32, torch.float32, "cuda", 9, 3, 64, 2, False)
    for num_rows, size in ((1, 1536), (40, 1536), (3, 14336)):
        check_silu_mul(torch.bfloat16, "cuda", num_rows, size, seed=num_rows)
    check_silu_mul(torch.float32, "cuda", 4, 1536, seed=0)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_model_forward_on_cuda_fused_matches_eager(needs_cuda, tmp_path, monkeypatch, paged):
    loaded = make_tiny_model(tmp_path / "tiny", num_hidden_layers=3)
    loaded.model.cuda()
    expected = model_step(loaded, monkeypatch, fused_on=False, paged=paged, device="cuda")
    got = model_step(loaded, monkeypatch, fused_on=True, paged=paged, device="cuda")
    torch.testing.assert_close(got[0], expected[0], atol=1e-4, rtol=1e-4)
    for layer_out, want in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(layer_out, want, atol=1e-4, rtol=1e-4)
