"""The Triton paged-attention kernel against the eager gather + SDPA path and a per-request
brute force: decodes, verify steps and prompt chunks over scattered blocks, GQA shares 1
and 3, one span or several (split-KV). Run interpreted on a CPU (TRITON_INTERPRET=1)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.models.config import ModelConfig
from dspark.models.llama import paged_attention as eager_attention
from dspark.ops import triton_attention as ops

FP32_TOL = {"atol": 2e-5, "rtol": 2e-5}
BF16_TOL = {"atol": 1e-2, "rtol": 2e-2}  # bf16 outputs: a few units in their last place


@pytest.fixture
def needs_triton():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1")


def config(num_heads: int, num_kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=8,
        hidden_size=num_heads * head_dim,
        intermediate_size=8,
        num_layers=1,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )


class Step:
    """A paged cache filled at random, requests whose blocks are interleaved in the pool,
    and one step's packed queries, keys and values."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_cached: list[int],
        num_query: list[int],
        seed: int,
        block_size: int = 16,
        regions: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        self.num_cached, self.num_query = np.array(num_cached), np.array(num_query)
        self.block_size = block_size
        total = self.num_cached + self.num_query
        num_blocks = int((-(-total // block_size)).sum()) + 4
        if regions:
            num_blocks = regions * int(-(-total.max() // block_size)) + 4
        self.pool = PagedKVCache(cfg, num_blocks, block_size, dtype, device, regions=regions)
        gen = torch.Generator(device=device).manual_seed(seed)
        for cache in self.pool.layers[0]:
            cache.copy_(torch.randn(cache.shape, generator=gen, device=device).to(dtype))
        slots = np.random.default_rng(seed).permutation(len(total))
        self.tables = [BlockTable(region=int(s) if regions else None) for s in slots]
        # Grow the tables a block at a time in turn, so that their blocks interleave.
        for grown in range(1, int(-(-total.max() // block_size)) + 1):
            for table, need in zip(self.tables, total, strict=True):
                assert self.pool.reserve(table, min(int(need), grown * block_size))
        num_tokens = int(self.num_query.sum())
        self.q = torch.randn(
            num_tokens, cfg.num_heads, cfg.head_dim, generator=gen, device=device
        ).to(dtype)
        self.k, self.v = (
            torch.randn(
                num_tokens, cfg.num_kv_heads, cfg.head_dim, generator=gen, device=device
            ).to(dtype)
            for _ in range(2)
        )

    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        k_cache, v_cache = self.pool.layers[0]
        return k_cache.clone(), v_cache.clone()

    def eager(self, causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.pool.attention_batch(self.tables, self.num_cached, self.num_query, causal)
        k_cache, v_cache = self.caches()
        out = eager_attention(self.q, self.k, self.v, batch, k_cache, v_cache)
        return out, k_cache

    def triton(self, causal: bool = True, num_splits: int | None = None):
        layout = self.layout(causal)
        write = self.pool.attention_batch(self.tables, self.num_cached, self.num_query).write_index
        k_cache, v_cache = self.caches()
        out = ops.paged_attention(
            self.q, self.k, self.v, write, layout, k_cache, v_cache, num_splits=num_splits
        )
        return out, k_cache, v_cache

    def layout(self, causal: bool = True) -> ops.PagedLayout:
        blocks = [t.blocks for t in self.tables]
        return ops.paged_layout(
            blocks,
            self.num_cached,
            self.num_query,
            self.block_size,
            causal,
            device=self.q.device,
        )


def brute_force(step: Step, k_cache, v_cache, causal: bool = True) -> torch.Tensor:
    """Each request alone, each query head on its own key head, in float64."""
    out = torch.zeros(step.q.shape, dtype=torch.float64, device=step.q.device)
    share = step.q.shape[1] // k_cache.shape[1]
    start = 0
    for table, cached, count in zip(step.tables, step.num_cached, step.num_query, strict=True):
        total = int(cached + count)
        rows = torch.from_numpy(table.rows(np.arange(total), step.block_size)).to(k_cache.device)
        for head in range(step.q.shape[1]):
            keys = k_cache[rows, head // share].double()  # [total, D]
            values = v_cache[rows, head // share].double()
            queries = step.q[start : start + count, head].double()  # [count, D]
            scores = queries @ keys.T / queries.shape[-1] ** 0.5
            if causal:
                last = torch.arange(count, device=keys.device)[:, None] + int(cached)
                seen = torch.arange(total, device=keys.device)[None, :] <= last
                scores = scores.masked_fill(~seen, float("-inf"))
            out[start : start + count, head] = scores.softmax(-1) @ values
        start += int(count)
    return out


# (cached, query) per request: decodes, verify steps of K + 1 = 5, and a prompt chunk
# beside two decodes (its group runs alone in the eager path).
LAYOUTS = {
    "decode": ([0, 37, 150, 64], [1, 1, 1, 1]),
    "verify": ([3, 90, 128, 17], [5, 5, 5, 5]),
    "prefill": ([0, 70, 101], [40, 1, 1]),
}


@pytest.mark.parametrize("share", [1, 3])
@pytest.mark.parametrize("kind", sorted(LAYOUTS))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_equals_eager_and_brute_force(needs_triton, share, kind, num_splits):
    cached, query = LAYOUTS[kind]
    step = Step(config(2 * share, 2, 64), cached, query, seed=share * 10 + num_splits)
    expected, eager_cache = step.eager()
    out, k_cache, v_cache = step.triton(num_splits=num_splits)
    assert torch.equal(k_cache, eager_cache)  # the step's keys were written alike
    torch.testing.assert_close(out, expected, **FP32_TOL)
    reference = brute_force(step, k_cache, v_cache).float()
    torch.testing.assert_close(out, reference, **FP32_TOL)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_non_causal_queries_see_every_key_of_their_request(needs_triton, num_splits):
    step = Step(config(6, 2, 64), [20, 0, 75], [4, 9, 6], seed=7)
    expected, _ = step.eager(causal=False)
    out, k_cache, v_cache = step.triton(causal=False, num_splits=num_splits)
    torch.testing.assert_close(out, expected, **FP32_TOL)
    reference = brute_force(step, k_cache, v_cache, causal=False).float()
    torch.testing.assert_close(out, reference, **FP32_TOL)


def test_random_layouts_over_small_odd_blocks(needs_triton):
    """Random request counts, contexts and query lengths; blocks of 3 rows, so a key tile
    spans many blocks; regions on, so the eager path reads some groups in place."""
    rng = np.random.default_rng(0)
    for trial in range(3):
        num_reqs = int(rng.integers(1, 5))
        cached = rng.integers(0, 120, num_reqs).tolist()
        query = rng.choice([1, 4, 17, 30], num_reqs).tolist()
        step = Step(config(3, 1, 64), cached, query, seed=trial, block_size=3, regions=num_reqs + 1)
        expected, _ = step.eager()
        out, k_cache, v_cache = step.triton(num_splits=int(rng.integers(1, 4)))
        torch.testing.assert_close(out, expected, **FP32_TOL)
        torch.testing.assert_close(out, brute_force(step, k_cache, v_cache).float(), **FP32_TOL)


def test_bf16_cache_and_queries(needs_triton):
    step = Step(config(6, 2, 64), [30, 140, 5], [1, 5, 20], seed=3, dtype=torch.bfloat16)
    expected, _ = step.eager()
    out, k_cache, v_cache = step.triton(num_splits=2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, **BF16_TOL)
    reference = brute_force(step, k_cache, v_cache).to(torch.bfloat16)
    torch.testing.assert_close(out, reference, **BF16_TOL)


def test_head_size_below_a_power_of_two_and_padding_requests(needs_triton):
    """D = 48 pads its tiles to 64; a request with no query (a graph's padding piece)
    writes nothing."""
    step = Step(config(4, 2, 48), [12, 33, 50], [3, 0, 2], seed=5)
    layout = step.layout()
    k_cache, v_cache = step.caches()
    write = step.pool.attention_batch(step.tables, step.num_cached, step.num_query).write_index
    k_cache.index_copy_(0, write, step.k)
    v_cache.index_copy_(0, write, step.v)
    out = ops.attend(step.q, k_cache, v_cache, layout, num_splits=2)
    torch.testing.assert_close(out, brute_force(step, k_cache, v_cache).float(), **FP32_TOL)


def test_layout_offsets_and_last_seen():
    layout = ops.paged_layout([[4, 1], [0], [2, 3, 5]], [17, 0, 40], [3, 1, 0], block_size=16)
    assert layout.block_tables.tolist() == [[4, 1, 0], [0, 0, 0], [2, 3, 5]]
    assert layout.query_start.tolist() == [0, 3, 4]
    assert layout.query_len.tolist() == [3, 1, 0]
    assert layout.last_seen.tolist() == [17, 0, 40]
    assert (layout.max_query, layout.max_keys) == (3, 40)
    bidirectional = ops.paged_layout([[4, 1]], [17], [3], block_size=16, causal=False)
    assert bidirectional.last_seen.tolist() == [19] and bidirectional.causal.tolist() == [0]


def test_layout_refuses_tables_shorter_than_the_step():
    with pytest.raises(ValueError, match="holds 16 tokens but the step needs 17"):
        ops.paged_layout([[0]], [16], [1], block_size=16)
    with pytest.raises(ValueError, match="one cached and one query count"):
        ops.paged_layout([[0], [1]], [1], [1, 1], block_size=16)


def test_tile_rows_and_splits():
    assert ops.tile_rows(1, 3) == 16 and ops.tile_rows(5, 4) == 32
    assert ops.tile_rows(512, 3) == ops.MAX_ROWS_PER_TILE
    assert ops.choose_splits(4, 4096, torch.device("cpu")) == 1


# SmolLM2 (9 heads on 3 kv heads, D = 64) and Llama 3 8B (32 on 8, D = 128).
GPU_SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(GPU_SHAPES))
def test_compiled_kernel_on_cuda_matches_eager_in_bf16(shape):
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("runs the compiled kernel; unset TRITON_INTERPRET")
    heads, kv_heads, head_dim = GPU_SHAPES[shape]
    rng = np.random.default_rng(1)
    num_reqs = 24
    cached = rng.integers(0, 2048, num_reqs).tolist()
    query = rng.choice([1, 4, 8], num_reqs).tolist()
    query[0], cached[0] = 256, 700  # a prompt chunk among decodes and verify steps
    step = Step(
        config(heads, kv_heads, head_dim), cached, query, 2, dtype=torch.bfloat16, device="cuda"
    )
    expected, _ = step.eager()
    for num_splits in (None, 1, 4):
        out, _, _ = step.triton(num_splits=num_splits)
        torch.testing.assert_close(out, expected, **BF16_TOL)
