"""The Triton kernels behind ``dspark.ops.triton_attention`` (imported only when it runs).

One program attends ``BLOCK_M`` query rows of one request against one key/value head:
the rows are (query, query head) pairs, the ``SHARE`` query heads of that key head
side by side, so grouped-query attention reads each key once for all the heads sharing
it. Keys are read straight from their cache rows through the block table, a tile of
``BLOCK_N`` positions at a time, with an online softmax in fp32 (exp2, the scale folded
with log2(e)). With ``NUM_SPLITS`` > 1 the key positions are cut into that many spans
(flash-decoding): each program writes its span's normalised output and log-sum-exp, and
``combine_splits`` merges them. ``UPCAST`` (interpreter only, see ``_is_interpreted``)
casts the dot operands to fp32 after their rounding to the queries' dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_kernel(
    q_ptr,  # [T, heads, D]
    k_ptr,  # [num_rows, kv_heads, D]
    v_ptr,
    out_ptr,  # NUM_SPLITS == 1: [T, heads, D] output; else [NUM_SPLITS, T, heads, D] fp32
    lse_ptr,  # [NUM_SPLITS, T, heads] fp32, log2 domain (unused when NUM_SPLITS == 1)
    tables_ptr,  # [R, max_blocks] int32
    query_start_ptr,  # [R] int32
    query_len_ptr,  # [R] int32
    last_seen_ptr,  # [R] int32
    causal_ptr,  # [R] int32
    scale_log2,  # softmax scale · log2(e)
    stride_qt,
    stride_qh,
    stride_kr,
    stride_kh,
    stride_vr,
    stride_vh,
    stride_os,
    stride_ot,
    stride_oh,
    stride_ls,
    stride_lt,
    stride_table,
    keys_per_split,
    SHARE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS
    query_len = tl.load(query_len_ptr + req)
    if tile * BLOCK_M >= query_len * SHARE:  # the grid is sized for the longest query
        return
    query_start = tl.load(query_start_ptr + req)
    last_seen = tl.load(last_seen_ptr + req)
    causal = tl.load(causal_ptr + req)

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    query = rows // SHARE  # [BLOCK_M] query within the request
    head = kv_head * SHARE + rows % SHARE  # [BLOCK_M] query head
    row_valid = query < query_len
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    token = (query_start + query).to(tl.int64)
    q_mask = row_valid[:, None] & dim_valid[None, :]
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=q_mask,
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if UPCAST:
        q_dot = q.to(tl.float32)
    else:
        q_dot = q
    last = last_seen + causal * query  # [BLOCK_M] the last key position each row sees
    tile_last = last_seen + causal * tl.minimum(
        query_len - 1, (tile * BLOCK_M + BLOCK_M - 1) // SHARE
    )
    begin = split * keys_per_split
    # The last split runs to the tile's last key, so a short keys_per_split loses none.
    is_last_split = (split == NUM_SPLITS - 1).to(tl.int32)
    end = tl.minimum(tile_last + 1, begin + keys_per_split + is_last_split * (tile_last + 1))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = tables_ptr + req.to(tl.int64) * stride_table
    for start in range(begin, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        key_valid = pos < end
        block = tl.load(table + pos // BLOCK_SIZE, mask=key_valid, other=0)
        cache_row = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        k = tl.load(
            k_ptr + cache_row[:, None] * stride_kr + kv_head * stride_kh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(q.dtype)  # [BLOCK_N, BLOCK_D], in the queries' dtype as the eager path
        v = tl.load(
            v_ptr + cache_row[:, None] * stride_vr + kv_head * stride_vh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(q.dtype)
        if UPCAST:
            k = k.to(tl.float32)
        scores = tl.dot(q_dot, tl.trans(k), input_precision=PRECISION) * scale_log2
        seen = (pos[None, :] <= last[:, None]) & key_valid[None, :]
        scores = tl.where(seen, scores, float("-inf"))  # [BLOCK_M, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row that has seen no key yet keeps m = -inf; shift it by 0 so exp2 gives 0.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(scores - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(v.dtype)  # the probabilities in the values' dtype, as SDPA multiplies
        if UPCAST:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]  # every real query sees at least its own key
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=q_mask,
        )
    else:
        # A span past a row's last key leaves l = 0: output 0, weight exp2(-inf) = 0.
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        part = out_ptr + split * stride_os
        tl.store(
            part + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
            acc / l_safe[:, None],
            mask=q_mask,
        )
        tl.store(lse_ptr + split * stride_ls + token * stride_lt + head, lse, mask=row_valid)


@triton.jit
def combine_splits(
    part_ptr,  # [NUM_SPLITS, T, heads, D] fp32
    lse_ptr,  # [NUM_SPLITS, T, heads] fp32, log2 domain
    out_ptr,  # [T, heads, D]
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_valid = splits < NUM_SPLITS
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    lse = tl.load(
        lse_ptr + splits * stride_ls + token * stride_lt + head,
        mask=split_valid,
        other=float("-inf"),
    )  # [BLOCK_S]
    weight = tl.exp2(lse - tl.max(lse, 0))
    weight = weight / tl.sum(weight, 0)
    parts = tl.load(
        part_ptr
        + splits[:, None] * stride_ps
        + token * stride_pt
        + head * stride_ph
        + dims[None, :],
        mask=split_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(weight[:, None] * parts, 0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_valid,
    )
