"""The plan message rank 0 sends the other tensor-parallel ranks before each forward.

It carries everything a rank needs to run its shard of the step and nothing it could
decide for itself: the packed tokens (admitted drafts included), each request's cached
and query lengths and admitted drafts, and its KV block table. A header frames it with
its kind, a sequence number and a 64-bit digest of the payload, which the receiver
checks and records, so every rank can show the plan it ran on every step.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import struct
from dataclasses import dataclass

import numpy as np

from dspark.engine.kv_cache import BlockTable

HEADER = struct.Struct("<IIIQ")  # kind, sequence number, payload bytes, payload digest


class MessageKind(enum.IntEnum):
    FORWARD = 1  # run the step in the payload
    DIGESTS = 2  # send back every FORWARD digest received so far
    STOP = 3  # exit


@dataclass(slots=True)
class StepPlanMessage:
    """One packed step, as every rank runs it."""

    tokens: np.ndarray  # [T] token ids, admitted drafts after each request's own tokens
    num_cached: np.ndarray  # [R] tokens already in the cache per request
    num_query: np.ndarray  # [R] tokens computed this step per request, drafts included
    num_admitted: np.ndarray  # [R] drafts among them (verified this step)
    tables: list[BlockTable]  # [R] where each request's rows live

    def encode(self) -> bytes:
        """The payload: int32 counts, then the arrays in field order, then the blocks."""
        num_reqs = len(self.tables)
        regions = [-1 if t.region is None else t.region for t in self.tables]
        num_blocks = [len(t.blocks) for t in self.tables]
        blocks = [b for t in self.tables for b in t.blocks]
        parts = [
            np.array([num_reqs, len(self.tokens), len(blocks)]),
            self.tokens,
            self.num_cached,
            self.num_query,
            self.num_admitted,
            np.array(regions),
            np.array([t.spilled for t in self.tables]),
            np.array(num_blocks),
            np.array(blocks, dtype=np.int64),
        ]
        return np.concatenate([np.asarray(p, dtype=np.int32).ravel() for p in parts]).tobytes()

    @classmethod
    def decode(cls, payload: bytes) -> StepPlanMessage:
        values = np.frombuffer(payload, dtype=np.int32).astype(np.int64)
        num_reqs, num_tokens, num_blocks = (int(v) for v in values[:3])
        sizes = [num_tokens] + [num_reqs] * 6 + [num_blocks]
        ends = np.cumsum([3, *sizes])
        fields = [values[a:b] for a, b in itertools.pairwise(ends)]
        tokens, cached, query, admitted, regions, spilled, counts, blocks = fields
        starts = np.concatenate(([0], np.cumsum(counts)))
        tables = [
            BlockTable(
                blocks[starts[r] : starts[r + 1]].tolist(),
                None if regions[r] < 0 else int(regions[r]),
                bool(spilled[r]),
            )
            for r in range(num_reqs)
        ]
        return cls(tokens, cached, query, admitted, tables)


def digest(payload: bytes) -> int:
    """64 bits of BLAKE2b over the payload."""
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little")


def frame(kind: MessageKind, sequence: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, sequence, len(payload), digest(payload)) + payload
