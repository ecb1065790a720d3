"""The paged KV cache's regions: where blocks come from, and attention read in place."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.models.config import ModelConfig
from dspark.models.llama import paged_attention
from tests.conftest import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config())  # 2 key/value heads of 16, 4 query heads


def cache(num_blocks, regions=0, block_size=4):
    return PagedKVCache(CONFIG, num_blocks, block_size, regions=regions)


def test_without_regions_blocks_come_from_one_pool_in_order():
    pool = cache(8)
    a, b = BlockTable(region=1), BlockTable()
    assert pool.reserve(a, 5) and pool.reserve(b, 4)
    assert a.blocks == [0, 1] and b.blocks == [2]  # the region is ignored
    pool.release(a)
    assert pool.reserve(b, 12) and b.blocks == [2, 0, 1]
    assert pool.num_free_blocks == 5


def test_a_table_fills_its_regions_run_in_order():
    # 11 blocks in 2 regions: runs 0-4 and 5-9, block 10 shared.
    pool = cache(11, regions=2)
    assert (pool.regions, pool.region_blocks, pool.region_rows) == (2, 5, 20)
    first, second, loose = BlockTable(region=1), BlockTable(region=0), BlockTable()
    assert pool.reserve(first, 9) and first.blocks == [5, 6, 7]
    assert pool.reserve(second, 1) and second.blocks == [0]
    assert first.rows(np.arange(9), 4).tolist() == list(range(20, 29))  # consecutive rows
    # No region: the shared block first, then free blocks from the end of the runs.
    assert pool.reserve(loose, 8) and loose.blocks == [10, 9]
    assert pool.is_in_region(first) and not pool.is_in_region(loose)
    # Region 1's next free block is 8; the one after (9) was taken: it spills there.
    assert pool.reserve(first, 16) and first.blocks == [5, 6, 7, 8]
    assert pool.reserve(first, 17) and first.blocks[-1] == 4 and first.spilled
    assert not pool.is_in_region(first)
    assert pool.num_free_blocks == 11 - 3 - 1 - 2 - 2
    pool.release(first)
    assert not first.spilled and pool.num_free_blocks == 11 - 1 - 2
    assert pool.reserve(first, 20) and first.blocks == [5, 6, 7, 8, 4]  # 9 is still taken


def test_a_table_longer_than_its_run_spills_and_a_lone_table_reads_a_view():
    pool = cache(8, regions=2)
    table = BlockTable(region=1)
    assert pool.reserve(table, 16) and table.blocks == [4, 5, 6, 7]
    group = pool.attention_batch([table], np.array([0]), np.array([16])).groups[0]
    assert group.read_index is None and group.read_start == 16 and group.read_stride == 0
    assert pool.reserve(table, 17) and table.spilled and table.blocks[-1] == 3


@settings(max_examples=60, deadline=None)
@given(
    regions=st.integers(1, 4),
    ops=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 40), st.booleans()), min_size=1, max_size=40
    ),
)
def test_regions_never_change_how_many_blocks_can_be_reserved(regions, ops):
    """Against a pool without regions, the same reserves and releases succeed and fail
    alike; no block is held twice; the free count is exact; a table in its region holds
    its run's first blocks in order."""
    plain, split = cache(13), cache(13, regions=regions)
    tables = {
        pool: [BlockTable(region=i % (regions + 1) if i < 4 else None) for i in range(6)]
        for pool in (plain, split)
    }
    for index, tokens, release in ops:
        outcomes = []
        for pool in (plain, split):
            table = tables[pool][index]
            if release:
                pool.release(table)
                outcomes.append(None)
            else:
                outcomes.append(pool.reserve(table, tokens))
        assert outcomes[0] == outcomes[1]
        for pool in (plain, split):
            held = [b for t in tables[pool] for b in t.blocks]
            assert len(held) == len(set(held))
            assert pool.num_free_blocks == 13 - len(held)
        for table in tables[split]:
            if split.is_in_region(table) and table.region < split.regions:
                base = table.region * split.region_blocks
                assert table.blocks == list(range(base, base + len(table.blocks)))


def reference_attention(k_cache, v_cache, q, table, cached, count, causal, block_size):
    """One request's attention, dense: its queries over its rows in the cache."""
    total = cached + count
    rows = torch.from_numpy(table.rows(np.arange(total), block_size))
    keys, values = k_cache[rows], v_cache[rows]  # [total, kv_heads, D]
    share = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(share, 1), values.repeat_interleave(share, 1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) / q.shape[-1] ** 0.5
    if causal:
        seen = torch.arange(total)[None, :] <= (cached + torch.arange(count))[:, None]
        scores = scores.masked_fill(~seen[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    num_reqs=st.integers(1, 5),
    causal=st.booleans(),
    borrow=st.booleans(),
)
def test_attention_read_in_regions_equals_dense_attention(data, num_reqs, causal, borrow):
    """Any mix of requests in their regions, in any slot order, with decodes, drafts and
    prompt chunks: paged attention equals each request's dense attention, whether the
    group read a view (asserted to happen) or gathered."""
    regions, block_size = 6, 4
    pool = cache(48, regions=regions, block_size=block_size)  # runs of 8 blocks, 32 rows
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    for k_cache, v_cache in pool.layers:
        k_cache.normal_(generator=generator)
        v_cache.normal_(generator=generator)
    k_cache, v_cache = pool.layers[0]
    slots = data.draw(st.permutations(range(regions)))[:num_reqs]
    cached = np.array(data.draw(st.lists(st.integers(0, 14), min_size=num_reqs, max_size=num_reqs)))
    query = np.array(data.draw(st.lists(st.integers(1, 20), min_size=num_reqs, max_size=num_reqs)))
    tables = [BlockTable(region=slot) for slot in slots]
    if borrow:  # a table without a region takes the shared blocks and then runs' last ones
        pool.reserve(BlockTable(), 2 * block_size)
    for table, c, q in zip(tables, cached, query, strict=True):
        assert pool.reserve(table, int(c + q))
    batch = pool.attention_batch(tables, cached, query, causal=causal)
    total = int(query.sum())
    q = torch.randn(total, 4, 16, generator=generator)
    k = torch.randn(total, 2, 16, generator=generator)
    v = torch.randn(total, 2, 16, generator=generator)
    out = paged_attention(q, k, v, batch, k_cache, v_cache)
    starts = np.concatenate(([0], np.cumsum(query)[:-1]))
    for table, c, n, s in zip(tables, cached, query, starts, strict=True):
        expected = reference_attention(
            k_cache, v_cache, q[s : s + n], table, int(c), int(n), causal, block_size
        )
        torch.testing.assert_close(out[s : s + n], expected, atol=1e-5, rtol=1e-5)
    # Decodes and short queries share a group: read in place when all are in their runs.
    short = [t for t, n in zip(tables, query, strict=True) if n <= 16]
    if len(short) >= 2 and all(pool.is_in_region(t) for t in short):
        span = max(t.region for t in short) - min(t.region for t in short) + 1
        if span <= 2 * len(short):
            assert batch.groups[0].read_index is None and batch.groups[0].read_stride == 32


def test_a_group_spread_over_distant_regions_is_gathered():
    pool = cache(40, regions=8)
    tables = [BlockTable(region=0), BlockTable(region=7)]  # a span of 8 for 2 requests
    for table in tables:
        assert pool.reserve(table, 5)
    group = pool.attention_batch(tables, np.array([4, 4]), np.array([1, 1])).groups[0]
    assert group.read_index is not None and group.read_stride == 0
    near = [BlockTable(region=2), BlockTable(region=5)]  # a span of 4: in place
    for table in near:
        assert pool.reserve(table, 5)
    group = pool.attention_batch(near, np.array([4, 4]), np.array([1, 1])).groups[0]
    assert group.read_index is None and (group.read_start, group.read_stride) == (40, 20)
    assert group.mask.shape[0] == 4 and group.in_order


def test_bad_region_count_is_refused():
    with pytest.raises(ValueError, match="regions must be >= 0"):
        cache(8, regions=-1)
    assert cache(3, regions=4).regions == 0  # fewer blocks than regions: none
