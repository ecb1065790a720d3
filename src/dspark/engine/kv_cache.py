"""Paged KV cache: fixed-size blocks of cache rows, a block table per request.

A request's token at position p lives in row ``table[p // block_size] * block_size +
p % block_size``. Rejected draft tokens are rolled back by lowering the request's computed
length (O(1)): their rows are simply overwritten later. Blocks return to the pool when a
request finishes or is preempted.
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

    def rows(self, positions: np.ndarray, block_size: int) -> np.ndarray:
        table = np.asarray(self.blocks, dtype=np.int64)
        return table[positions // block_size] * block_size + positions % block_size


SHORT_QUERY = 16
"""Requests computing at most this many tokens in a step share one padded attention call."""


class PagedKVCache:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one row, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        rows = num_blocks * block_size
        shape = (rows, config.num_kv_heads, config.head_dim)
        self.layers = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(config.num_layers)
        ]
        self._free = list(range(num_blocks - 1, -1, -1))
        self.device = torch.device(device)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, table: BlockTable, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(table.blocks))

    def reserve(self, table: BlockTable, num_tokens: int) -> bool:
        """Grow ``table`` to hold ``num_tokens`` tokens; False (and no change) if the
        pool cannot."""
        needed = self.blocks_needed(table, num_tokens)
        if needed > len(self._free):
            return False
        for _ in range(needed):
            table.blocks.append(self._free.pop())
        return True

    def reserve_scratch(self) -> int:
        """Take one block out of the pool for good and return its id: padded steps write
        their padding tokens' keys there (``dspark.engine.graphs``)."""
        if not self._free:
            raise ValueError("the KV cache has no free block for padding; raise kv_cache_tokens")
        return self._free.pop()

    def release(self, table: BlockTable) -> None:
        self._free.extend(reversed(table.blocks))
        table.blocks.clear()

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
        cached, query, begin = num_cached[members], num_query[members], starts[members]
        total = cached + query
        max_len, max_query = int(total.max()), int(query.max())
        read = np.zeros((members.shape[0], max_len), dtype=np.int64)
        for i, r in enumerate(members):
            read[i, : total[i]] = tables[r].rows(np.arange(total[i]), self.block_size)
        offsets = np.arange(max_query)
        query_valid = offsets[None, :] < query[:, None]
        query_index = np.where(query_valid, begin[:, None] + offsets[None, :], 0)
        if causal:  # a query sees keys up to its own absolute position
            last_seen = cached[:, None] + offsets[None, :]
        else:  # ... or every key of its request
            last_seen = np.broadcast_to((total - 1)[:, None], (len(members), max_query))
        mask = np.arange(max_len)[None, None, :] <= last_seen[:, :, None]
        mask &= query_valid[:, :, None]
        mask[:, :, 0] = True  # padded queries attend somewhere (their output is dropped)
        device = self.device
        # One request whose rows are consecutive (blocks are handed out in order) reads a
        # view of the cache instead of a gathered copy.
        is_contiguous = read.shape[0] == 1 and bool((np.diff(read[0]) == 1).all())
        return AttentionGroup(
            read_index=None if is_contiguous else torch.from_numpy(read).to(device),
            read_start=int(read[0, 0]) if is_contiguous else 0,
            mask=torch.from_numpy(mask[:, None]).to(device),
            query_index=torch.from_numpy(query_index).to(device),
            valid_rows=torch.from_numpy(np.flatnonzero(query_valid)).to(device),
            out_index=torch.from_numpy(query_index[query_valid]).to(device),
        )
