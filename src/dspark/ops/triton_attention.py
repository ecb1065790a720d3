"""Paged attention in Triton: variable-length queries read the paged KV cache in place.

The eager path (``dspark.models.llama.paged_attention``) gathers every request's cached
keys and values into a padded ``[R, kv_heads, max_len, D]`` copy and runs SDPA with a
mask. Here one kernel reads each key straight from its cache row through the request's
block table (``dspark.engine.kv_cache``: position p is row ``table[p // block_size] ·
block_size + p % block_size``), so nothing is copied and no padding is computed. It runs
decodes (one query a request), verify steps (K + 1) and prompt chunks alike: query i of
a request sees key positions ``0 ... last_seen + i`` (causal) or ``0 ... last_seen``.

``PagedLayout`` holds the per-step tensors (built once per step, read by every layer);
``paged_layout`` builds one from block tables and counts on the host. Triton is imported
on the first call, so this module imports without it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

KEYS_PER_TILE = 64
"""Key positions a program reads per loop step (``BLOCK_N``)."""

MAX_ROWS_PER_TILE = 64
"""Most (query, head) rows one program attends (``BLOCK_M``); at least 16, tl.dot's
smallest side."""

MIN_KEYS_PER_SPLIT = 256
"""A split-KV span shorter than this costs more in its combine than it gains."""

MAX_SPLITS = 16


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """Where each request's queries and keys are for one step.

    Request r's queries are packed tokens ``query_start[r] : query_start[r] +
    query_len[r]``; its query i attends key positions ``0 ... last_seen[r] + causal[r] ·
    i``. A request with ``query_len`` 0 is padding (a captured graph's empty piece).
    ``max_query`` and ``max_keys`` are host-side: the first sizes the grid and must be at
    least every ``query_len``; the second only balances split-KV spans.
    """

    block_tables: torch.Tensor  # [R, max_blocks] int32
    query_start: torch.Tensor  # [R] int32, cu_ offsets into the packed tokens
    query_len: torch.Tensor  # [R] int32
    last_seen: torch.Tensor  # [R] int32, the last key position the first query sees
    causal: torch.Tensor  # [R] int32, 1: each later query sees one key more
    block_size: int
    max_query: int
    max_keys: int

    @property
    def num_requests(self) -> int:
        return self.query_len.shape[0]


def paged_layout(
    blocks: Sequence[Sequence[int]],
    num_cached: np.ndarray,  # [R] tokens already in the cache per request
    num_query: np.ndarray,  # [R] tokens computed this step per request
    block_size: int,
    causal: bool = True,
    device: str | torch.device = "cpu",
) -> PagedLayout:
    """The layout of one packed step (requests' tokens consecutive, in order) from each
    request's block ids (``BlockTable.blocks``); one host-to-device copy."""
    num_cached = np.asarray(num_cached, dtype=np.int64)
    num_query = np.asarray(num_query, dtype=np.int64)
    num_reqs = len(blocks)
    if num_cached.shape != (num_reqs,) or num_query.shape != (num_reqs,):
        raise ValueError(
            f"need one cached and one query count per block table ({num_reqs}), got "
            f"{num_cached.shape} and {num_query.shape}"
        )
    if num_reqs == 0:
        raise ValueError("a step needs at least one request")
    if (num_cached < 0).any() or (num_query < 0).any():
        raise ValueError("cached and query counts must be >= 0")
    total = num_cached + num_query
    lengths = np.array([len(b) for b in blocks], dtype=np.int64)
    short = np.flatnonzero(lengths * block_size < total)
    if short.size:
        r = int(short[0])
        raise ValueError(
            f"request {r}'s block table holds {lengths[r] * block_size} tokens but the step "
            f"needs {total[r]}; reserve its blocks first"
        )
    max_blocks = max(1, int(lengths.max()))
    # One int32 array: [tables | query_start | query_len | last_seen | causal].
    staged = np.zeros(num_reqs * (max_blocks + 4), dtype=np.int32)
    tables = staged[: num_reqs * max_blocks].reshape(num_reqs, max_blocks)
    for r, table in enumerate(blocks):
        tables[r, : len(table)] = table
    fields = staged[num_reqs * max_blocks :].reshape(4, num_reqs)
    fields[0] = np.cumsum(num_query) - num_query
    fields[1] = num_query
    fields[2] = num_cached if causal else total - 1
    fields[3] = int(causal)
    on_device = torch.from_numpy(staged).to(device)
    tables_gpu = on_device[: num_reqs * max_blocks].view(num_reqs, max_blocks)
    start, length, seen, is_causal = on_device[num_reqs * max_blocks :].view(4, num_reqs)
    return PagedLayout(
        block_tables=tables_gpu,
        query_start=start,
        query_len=length,
        last_seen=seen,
        causal=is_causal,
        block_size=block_size,
        max_query=int(num_query.max()),
        max_keys=int(total.max()),
    )


def paged_attention(
    q: torch.Tensor,  # [T, heads, D], rotated
    k: torch.Tensor,  # [T, kv_heads, D], rotated
    v: torch.Tensor,  # [T, kv_heads, D]
    write_index: torch.Tensor,  # [T] cache row of each token's key and value
    layout: PagedLayout,
    k_cache: torch.Tensor,  # [num_rows, kv_heads, D]
    v_cache: torch.Tensor,
    num_splits: int | None = None,
) -> torch.Tensor:
    """As ``dspark.models.llama.paged_attention``: write the step's keys and values to
    their cache rows, then attend every request over its cached rows; ``[T, heads, D]``
    in packed order."""
    k_cache.index_copy_(0, write_index, k.to(k_cache.dtype))
    v_cache.index_copy_(0, write_index, v.to(v_cache.dtype))
    return attend(q, k_cache, v_cache, layout, num_splits=num_splits)


def attend(
    q: torch.Tensor,  # [T, heads, D]
    k_cache: torch.Tensor,  # [num_rows, kv_heads, D]
    v_cache: torch.Tensor,
    layout: PagedLayout,
    num_splits: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Each request's queries over its cached keys and values, ``[T, heads, D]`` in
    ``q``'s dtype (keys and values are cast to it, as the eager path does). Rows of tokens
    in no request are left unwritten. ``num_splits`` cuts each request's keys into that
    many spans run in parallel (None: enough to fill the GPU)."""
    kernels = _kernels()
    _check(q, k_cache, v_cache, layout)
    if q.stride(-1) != 1:
        q = q.contiguous()
    num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    share = num_heads // kv_heads
    block_m = tile_rows(layout.max_query, share)
    num_tiles = -(-layout.max_query * share // block_m)
    if num_splits is None:
        num_splits = splits_for(layout, num_heads, kv_heads, q.device)
    if not 1 <= num_splits <= 1 << 10:
        raise ValueError(f"num_splits must be between 1 and 1024, got {num_splits}")
    keys_per_split = -(-layout.max_keys // num_splits)
    keys_per_split = -(-keys_per_split // KEYS_PER_TILE) * KEYS_PER_TILE
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    if num_splits == 1:
        target, lse = out, out  # lse is unused with one split
        target_strides = (0, out.stride(0), out.stride(1))
    else:
        target = torch.empty(
            (num_splits, num_tokens, num_heads, head_dim), dtype=torch.float32, device=q.device
        )
        lse = torch.empty((num_splits, num_tokens, num_heads), dtype=torch.float32, device=q.device)
        target_strides = target.stride()[:3]
    lse_strides = (0, 0) if num_splits == 1 else lse.stride()[:2]
    block_d = triton_next_pow2(head_dim)
    is_fp32 = q.dtype == torch.float32
    grid = (layout.num_requests, num_tiles, kv_heads * num_splits)
    kernels.attend_kernel[grid](
        q,
        k_cache,
        v_cache,
        target,
        lse,
        layout.block_tables,
        layout.query_start,
        layout.query_len,
        layout.last_seen,
        layout.causal,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        *target_strides,
        *lse_strides,
        layout.block_tables.stride(0),
        keys_per_split,
        SHARE=share,
        BLOCK_SIZE=layout.block_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=KEYS_PER_TILE,
        NUM_SPLITS=num_splits,
        UPCAST=_is_interpreted(kernels.attend_kernel) and not is_fp32,
        PRECISION="ieee" if is_fp32 else "tf32",
        num_warps=4,
    )
    if num_splits > 1:
        kernels.combine_splits[(num_tokens, num_heads)](
            target,
            lse,
            out,
            *target.stride()[:3],
            *lse.stride()[:2],
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
            BLOCK_S=triton_next_pow2(num_splits),
            num_warps=1 if head_dim <= 64 else 2,
        )
    return out


def tile_rows(max_query: int, share: int) -> int:
    """``BLOCK_M``: the step's (query, head) rows of one request, as a power of two
    between 16 and ``MAX_ROWS_PER_TILE``."""
    return min(MAX_ROWS_PER_TILE, max(16, triton_next_pow2(max_query * share)))


def splits_for(layout: PagedLayout, num_heads: int, kv_heads: int, device: torch.device) -> int:
    """The split-KV spans ``attend`` runs this layout with by default."""
    share = num_heads // kv_heads
    num_tiles = -(-layout.max_query * share // tile_rows(layout.max_query, share))
    num_programs = layout.num_requests * num_tiles * kv_heads
    return choose_splits(num_programs, layout.max_keys, device)


def choose_splits(num_programs: int, max_keys: int, device: torch.device) -> int:
    """Split-KV spans so that a step of few requests over long contexts still fills the
    GPU (about two programs per SM), never spans under ``MIN_KEYS_PER_SPLIT`` keys."""
    if device.type != "cuda":
        return 1
    num_sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    if num_programs >= num_sms:
        return 1
    wanted = -(-2 * num_sms // num_programs)
    return max(1, min(wanted, max_keys // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _kernels():
    try:
        from dspark.ops import triton_attention_kernels
    except ImportError as error:
        raise RuntimeError(
            "the Triton attention kernel needs triton (pip install triton; on a machine "
            "without a GPU set TRITON_INTERPRET=1 to run it interpreted)"
        ) from error
    return triton_attention_kernels


def _is_interpreted(kernel) -> bool:
    # The interpreter multiplies bf16 tiles as their raw uint16 bits (its create_dot),
    # so interpreted low-precision dots run on tiles cast to fp32 (exact products).
    return type(kernel).__name__ == "InterpretedFunction"


def _check(q, k_cache, v_cache, layout: PagedLayout) -> None:
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"need q [T, heads, D] and caches [rows, kv_heads, D] of one shape, got "
            f"{tuple(q.shape)}, {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if q.shape[2] != k_cache.shape[2] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(
            f"queries {tuple(q.shape[1:])} do not fit the cache's {tuple(k_cache.shape[1:])}: "
            "the head sizes must match and the query heads be a multiple of the kv heads"
        )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the caches' head dimension must be contiguous")
    tensors = (k_cache, v_cache, layout.block_tables, layout.query_len)
    if any(t.device != q.device for t in tensors):
        raise ValueError(
            f"queries, caches and layout must be on one device, got q on {q.device}, "
            f"caches on {k_cache.device}, layout on {layout.query_len.device}"
        )
    if layout.max_query < 1:
        raise ValueError("the layout has no query (max_query < 1)")
