"""Paged KV cache: fixed-size blocks of cache rows, a block table per request.

A request's token at position p lives in row ``table[p // block_size] * block_size +
p % block_size``. Rejected draft tokens are rolled back by lowering the request's computed
length (O(1)): their rows are simply overwritten later. Blocks return to the pool when a
request finishes or is preempted.

**Regions** (``regions=S``, the engine's sequence slots; on by default on the CPU,
``EngineConfig.kv_regions``). Attention reads each request's cached rows as
``[R, max_len]``; gathered from scattered blocks, that is a copy of every key and value
the step attends over, in every layer (SmolLM2 at 16 requests of about 600 tokens on the
2-core CPU: a quarter of a decoding step). With regions the first blocks of the pool are
cut into S equal runs, and a table whose ``region`` is set (its request's slot) takes the
next block of its own run while it can, so its rows stay consecutive. A group of requests
whose tables all hold their runs' first blocks in order reads a strided view of the cache
(requests ``region_rows`` apart) instead of a copy. A table that cannot take its next
block (its run is full, or another table borrowed that block) takes any free block from
then on and is read by a gather, as is every group it joins: regions change where blocks
come from, never how many there are. Blocks outside the runs are handed out first to
tables without a region (or spilled ones), then free blocks from the end of the runs. So
a request longer than its run (``kv_cache_tokens / max_num_seqs`` tokens) is gathered,
even alone, and, with the shared blocks out, the blocks it borrows from the end of the
last runs make their own requests spill when they grow that far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dspark.models.config import ModelConfig
from dspark.models.llama import AttentionBatch, AttentionGroup


@dataclass
class BlockTable:
    blocks: list[int] = field(default_factory=list)
    region: int | None = None  # the run of blocks to take first (its request's slot)
    spilled: bool = False  # took a block outside its region's order: read by a gather

    def rows(self, positions: np.ndarray, block_size: int) -> np.ndarray:
        table = np.asarray(self.blocks, dtype=np.int64)
        return table[positions // block_size] * block_size + positions % block_size


SHORT_QUERY = 16
"""Requests computing at most this many tokens in a step share one padded attention call."""

REGION_SPAN = 2
"""A group of requests read in their regions spans the runs from its lowest to its highest
(the runs between, of requests not in the group, ride along as padding rows whose
outputs are dropped): read so while that span is at most ``REGION_SPAN`` times the
group's size, else gathered. Attention computes a padding row over every key of the
span, as it does a real one; the gather would copy every real row and read it again."""


class PagedKVCache:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        regions: int = 0,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one row, got {num_blocks} x {block_size}")
        if regions < 0:
            raise ValueError(f"regions must be >= 0, got {regions}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Regions only where each holds a block; blocks past the runs are shared.
        self.region_blocks = num_blocks // regions if regions else 0
        self.regions = regions if self.region_blocks else 0
        self.region_rows = self.region_blocks * block_size
        rows = num_blocks * block_size
        shape = (rows, config.num_kv_heads, config.head_dim)
        self.layers = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(config.num_layers)
        ]
        # The free blocks outside the regions' runs, taken from the end (all of them
        # without regions); ``_is_free`` marks every free block.
        first_shared = self.regions * self.region_blocks
        self._free = list(range(num_blocks - 1, first_shared - 1, -1))
        self._is_free = np.ones(num_blocks, dtype=bool)
        self._num_free = num_blocks
        self.device = torch.device(device)

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    def _take(self, table: BlockTable | None) -> int:
        """A free block for ``table`` (None: any): its region's next while it can."""
        if table is not None and table.region is not None and not table.spilled and self.regions:
            used = len(table.blocks)
            block = table.region * self.region_blocks + used
            if table.region < self.regions and used < self.region_blocks and self._is_free[block]:
                self._is_free[block] = False
                self._num_free -= 1
                return block
            table.spilled = True
        if self._free:
            block = self._free.pop()
        else:  # the shared blocks are out: a free one from the end of the runs
            block = int(np.flatnonzero(self._is_free)[-1])
        self._is_free[block] = False
        self._num_free -= 1
        return block

    def is_in_region(self, table: BlockTable) -> bool:
        """Whether the table's rows are its region's first rows, in order."""
        region = table.region
        return region is not None and region < self.regions and not table.spilled

    def blocks_needed(self, table: BlockTable, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(table.blocks))

    def reserve(self, table: BlockTable, num_tokens: int) -> bool:
        """Grow ``table`` to hold ``num_tokens`` tokens; False (and no change) if the
        pool cannot."""
        needed = self.blocks_needed(table, num_tokens)
        if needed > self._num_free:
            return False
        for _ in range(needed):
            table.blocks.append(self._take(table))
        return True

    def reserve_scratch(self) -> int:
        """Take one block out of the pool for good and return its id: padded steps write
        their padding tokens' keys there (``dspark.engine.graphs``)."""
        if not self._num_free:
            raise ValueError("the KV cache has no free block for padding; raise kv_cache_tokens")
        return self._take(None)

    def release(self, table: BlockTable) -> None:
        first_shared = self.regions * self.region_blocks
        for block in reversed(table.blocks):
            self._is_free[block] = True
            if block >= first_shared:  # a run's blocks wait for their region's table
                self._free.append(block)
        self._num_free += len(table.blocks)
        table.blocks.clear()
        table.spilled = False

    def attention_batch(
        self,
        tables: list[BlockTable],
        num_cached: np.ndarray,  # [R] tokens already in the cache per request
        num_query: np.ndarray,  # [R] tokens computed this step per request
        causal: bool = True,
    ) -> AttentionBatch:
        """Cache rows to write and read, and the masks, for one packed step. With
        ``causal=False`` each request's new tokens see one another both ways (a drafter's
        parallel block) as well as everything cached before them."""
        total = num_cached + num_query
        starts = np.concatenate(([0], np.cumsum(num_query)[:-1]))
        write = [
            table.rows(np.arange(num_cached[r], total[r]), self.block_size)
            for r, table in enumerate(tables)
        ]
        # Decodes (and their drafts) share one padded group; each longer chunk runs alone.
        short = np.flatnonzero(num_query <= SHORT_QUERY)
        groups = [short] if short.size else []
        groups += [np.array([r]) for r in np.flatnonzero(num_query > SHORT_QUERY)]
        return AttentionBatch(
            write_index=torch.from_numpy(np.concatenate(write)).to(self.device),
            groups=[
                self._group(tables, members, num_cached, num_query, starts, causal)
                for members in groups
            ],
        )

    def _group(self, tables, members, num_cached, num_query, starts, causal) -> AttentionGroup:
        stride, first = 0, 0
        regions = self._regions_of(tables, members)
        if regions is not None:
            # Rows in region order, every run from the lowest to the highest; the runs of
            # requests outside the group are padding rows (no valid query: attention
            # computes them over every key, and their outputs are dropped).
            first = int(regions.min())
            span = int(regions.max()) - first + 1
            order = regions - first
            rows = np.zeros((4, span), dtype=np.int64)
            rows[0, order] = num_cached[members]
            rows[1, order] = num_query[members]
            rows[2, order] = starts[members]
            rows[3, order] = 1
            cached, query, begin, real = rows
            stride = self.region_rows
        else:
            cached, query, begin = num_cached[members], num_query[members], starts[members]
            real = np.ones(len(members), dtype=np.int64)
        total = cached + query
        max_len, max_query = int(total.max()), int(query.max())
        offsets = np.arange(max_query)
        query_valid = offsets[None, :] < query[:, None]
        query_index = np.where(query_valid, begin[:, None] + offsets[None, :], 0)
        if causal:  # a query sees keys up to its own absolute position
            last_seen = cached[:, None] + offsets[None, :]
        else:  # ... or every key of its request
            last_seen = np.broadcast_to((total - 1)[:, None], (len(real), max_query))
        mask = np.arange(max_len)[None, None, :] <= last_seen[:, :, None]
        mask &= query_valid[:, :, None]
        mask[:, :, 0] = True  # padded queries attend somewhere (their output is dropped)
        out_index = query_index[query_valid]
        device = self.device
        read_index = None
        if stride == 0:
            read = np.zeros((members.shape[0], max_len), dtype=np.int64)
            for i, r in enumerate(members):
                read[i, : total[i]] = tables[r].rows(np.arange(total[i]), self.block_size)
            # One request whose rows are consecutive (blocks are handed out in order) reads
            # a view of the cache instead of a gathered copy.
            if read.shape[0] == 1 and bool((np.diff(read[0]) == 1).all()):
                first = int(read[0, 0])
            else:
                read_index = torch.from_numpy(read).to(device)
        return AttentionGroup(
            read_index=read_index,
            read_start=first * self.region_rows if stride else first,
            read_stride=stride,
            mask=torch.from_numpy(mask[:, None]).to(device),
            query_index=torch.from_numpy(query_index).to(device),
            valid_rows=torch.from_numpy(np.flatnonzero(query_valid)).to(device),
            out_index=torch.from_numpy(out_index).to(device),
            in_order=bool((out_index == np.arange(out_index.shape[0])).all()),
        )

    def _regions_of(self, tables, members) -> np.ndarray | None:
        """The members' regions when the group reads them in place (several requests, all
        in their regions, spanning at most ``REGION_SPAN`` times their number), else None."""
        if members.shape[0] < 2 or not all(self.is_in_region(tables[r]) for r in members):
            return None
        regions = np.array([tables[r].region for r in members], dtype=np.int64)
        if len(set(regions.tolist())) != regions.shape[0]:  # never expected: one run each
            return None
        span = int(regions.max()) - int(regions.min()) + 1
        return regions if span <= REGION_SPAN * members.shape[0] else None
