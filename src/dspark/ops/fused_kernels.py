"""The Triton kernels behind ``dspark.ops.fused`` (imported only when they run).

Every kernel computes in fp32 and rounds to the activations' dtype (``ACT``, the output's
element type) wherever the eager PyTorch code rounds, so that bf16 results come out as
the eager ones do. Values are cast to fp32 right after loading: the interpreter stores
bf16 as raw uint16 and would do integer arithmetic on it. Its fp32 -> bf16 cast also
truncates, so interpreted (``INTERPRETED``) bf16 roundings go through ``_rounded``'s bit
arithmetic, round to nearest even as a GPU's cast does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rounded(x, dtype, INTERPRETED: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` (nearest, ties to even), as fp32 again."""
    if INTERPRETED:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
    return x.to(dtype).to(tl.float32)


@triton.jit
def add_rms_norm_kernel(
    delta_ptr,  # [T, N], unused without HAS_DELTA
    residual_ptr,  # [T, N]
    weight_ptr,  # [N]
    normed_ptr,  # [T, N] contiguous
    new_residual_ptr,  # [T, N] contiguous, unused without HAS_DELTA
    stride_dt,
    stride_dn,
    stride_rt,
    stride_rn,
    num_cols,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < num_cols
    act = normed_ptr.dtype.element_ty
    x = tl.load(residual_ptr + row * stride_rt + cols * stride_rn, mask=valid, other=0.0)
    x = x.to(tl.float32)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * stride_dt + cols * stride_dn, mask=valid, other=0.0)
        x = _rounded(x + delta.to(tl.float32), act, INTERPRETED)  # rounds, as a torch add
        tl.store(new_residual_ptr + row * num_cols + cols, x.to(act), mask=valid)
    mean_square = tl.sum(x * x, 0) / num_cols
    normed = _rounded(x * tl.rsqrt(mean_square + eps), act, INTERPRETED)
    weight = tl.load(weight_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    out = _rounded(weight * normed, act, INTERPRETED)
    tl.store(normed_ptr + row * num_cols + cols, out.to(act), mask=valid)


@triton.jit
def _rotated(head_ptr, dims, stride, valid, cos, sin, act, HALF: tl.constexpr, INTERPRETED):
    """``x * cos + rotate_half(x) * sin`` of a ``[BLOCK_H, BLOCK_D]`` tile of heads
    (``head_ptr``: each head's first element), in fp32 with each product and the sum
    rounded to ``act`` (the eager ops, one rounding each)."""
    x = tl.load(head_ptr + dims * stride, mask=valid, other=0.0).to(tl.float32)
    partner = tl.where(dims < HALF, dims + HALF, dims - HALF)
    other = tl.load(head_ptr + partner * stride, mask=valid, other=0.0).to(tl.float32)
    other = tl.where(dims < HALF, -other, other)
    first = _rounded(x * cos, act, INTERPRETED)
    second = _rounded(other * sin, act, INTERPRETED)
    return _rounded(first + second, act, INTERPRETED)


@triton.jit
def rotary_write_kernel(
    qkv_ptr,  # [T, (heads + 2 · kv_heads) · D]
    positions_ptr,  # [T]
    cos_ptr,  # [max_position, D]
    sin_ptr,
    write_ptr,  # [T] cache row per token; < 0: write nothing
    q_ptr,  # [T, heads, D] contiguous, the output
    k_cache_ptr,  # [num_rows, kv_heads, D]
    v_cache_ptr,
    stride_xt,
    stride_xc,
    stride_cos,
    stride_sin,
    stride_kr,
    stride_kh,
    stride_kd,
    stride_vr,
    stride_vh,
    stride_vd,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    act = q_ptr.dtype.element_ty
    dims = tl.arange(0, BLOCK_D)[None, :]
    dim_valid = dims < HEAD_DIM
    position = tl.load(positions_ptr + token).to(tl.int64)
    # The tables round to the activations' dtype first, as ``Rotary._tables`` casts them.
    cos = tl.load(cos_ptr + position * stride_cos + dims, mask=dim_valid, other=0.0)
    sin = tl.load(sin_ptr + position * stride_sin + dims, mask=dim_valid, other=0.0)
    cos = _rounded(cos.to(tl.float32), act, INTERPRETED)
    sin = _rounded(sin.to(tl.float32), act, INTERPRETED)
    row_ptr = qkv_ptr + token * stride_xt
    half: tl.constexpr = HEAD_DIM // 2

    q_heads = tl.arange(0, BLOCK_HQ)[:, None]
    q_valid = (q_heads < NUM_HEADS) & dim_valid
    q_starts = row_ptr + q_heads * (HEAD_DIM * stride_xc)
    q = _rotated(q_starts, dims, stride_xc, q_valid, cos, sin, act, half, INTERPRETED)
    q_out = q_ptr + token * (NUM_HEADS * HEAD_DIM) + q_heads * HEAD_DIM + dims
    tl.store(q_out, q.to(act), mask=q_valid)

    cache_row = tl.load(write_ptr + token).to(tl.int64)
    kv_heads = tl.arange(0, BLOCK_HK)[:, None]
    num_written = tl.where(cache_row >= 0, NUM_KV_HEADS, 0)  # heads to write: all or none
    kv_valid = (kv_heads < num_written) & dim_valid
    k_starts = row_ptr + (NUM_HEADS + kv_heads) * (HEAD_DIM * stride_xc)
    k = _rotated(k_starts, dims, stride_xc, kv_valid, cos, sin, act, half, INTERPRETED)
    k_type = k_cache_ptr.dtype.element_ty
    k_out = k_cache_ptr + cache_row * stride_kr + kv_heads * stride_kh + dims * stride_kd
    tl.store(k_out, _rounded(k, k_type, INTERPRETED).to(k_type), mask=kv_valid)
    v_starts = row_ptr + (NUM_HEADS + NUM_KV_HEADS + kv_heads) * (HEAD_DIM * stride_xc)
    v = tl.load(v_starts + dims * stride_xc, mask=kv_valid, other=0.0).to(tl.float32)
    v_type = v_cache_ptr.dtype.element_ty
    v_out = v_cache_ptr + cache_row * stride_vr + kv_heads * stride_vh + dims * stride_vd
    tl.store(v_out, _rounded(v, v_type, INTERPRETED).to(v_type), mask=kv_valid)


@triton.jit
def silu_mul_kernel(
    gate_up_ptr,  # [T, 2 · I]: gate, then up
    out_ptr,  # [T, I] contiguous
    stride_t,
    stride_c,
    size,  # I
    BLOCK: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < size
    act = out_ptr.dtype.element_ty
    base = gate_up_ptr + row * stride_t
    gate = tl.load(base + cols * stride_c, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(base + (cols + size) * stride_c, mask=valid, other=0.0).to(tl.float32)
    silu = _rounded(gate / (1.0 + tl.exp(-gate)), act, INTERPRETED)  # F.silu rounds
    out = _rounded(silu * up, act, INTERPRETED)
    tl.store(out_ptr + row * size + cols, out.to(act), mask=valid)
