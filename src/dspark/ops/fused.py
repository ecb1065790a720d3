"""Fused Triton kernels for the small per-layer ops of a decode step, and their eager
references.

A decode step replayed as a CUDA graph is still bound by kernel launches when the model
is small: eagerly, a layer's norm is four kernels (casts, ``rms_norm``, the weight
multiply), its rotary ten, its cache write two, its MLP activation two, its residual adds
two. Here each of those groups is one kernel:

- ``add_rms_norm``: the residual add of the previous block's output and the next norm;
- ``rotary_write``: rotary of q and k out of the fused qkv product, and the K/V cache
  write;
- ``silu_mul``: ``silu(gate) * up`` out of the fused gate/up product.

Each rounds to the activations' dtype wherever the eager ops do (``*_reference`` are
those ops), so bf16 results match the eager ones except where a reduction's order or a
fast ``exp``/``rsqrt`` moves a value across a rounding boundary. Triton is imported on the
first call, so this module imports without it.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

EAGER_OPS_ENV = "DSPARK_EAGER_OPS"
"""Set to 1 to run the eager ops where the fused kernels would run (A/B timings, or
ruling a kernel out while debugging)."""

MAX_ROW_SIZE = 16384
"""Longest row ``add_rms_norm`` takes (it holds a whole row in one block)."""

SILU_BLOCK = 1024
"""Columns of ``silu_mul``'s output one program writes."""

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_ops_enabled(where: torch.Tensor | torch.device) -> bool:
    """Whether the fused kernels run for tensors on ``where``: Triton importable, the
    device a CUDA one (or any, with ``TRITON_INTERPRET=1``: the interpreter runs them on
    CPU tensors, for tests), and ``DSPARK_EAGER_OPS`` not 1."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    if os.environ.get(EAGER_OPS_ENV) == "1" or not triton_available():
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# ---- add + RMSNorm ----------------------------------------------------------------------


def add_rms_norm(
    delta: torch.Tensor | None,  # [T, N]; None: nothing to add
    residual: torch.Tensor,  # [T, N]
    weight: torch.Tensor,  # [N]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed, new_residual)``: ``new_residual = residual + delta`` (``residual``
    itself when ``delta`` is None) and ``normed`` its RMSNorm scaled by ``weight``, both
    in ``residual``'s dtype (``normed`` and an added residual new and contiguous)."""
    _check_rows("residual", residual)
    if delta is not None and (
        delta.shape != residual.shape
        or delta.dtype != residual.dtype
        or delta.device != residual.device
    ):
        raise ValueError(
            f"delta must match the residual's shape, dtype and device, got {tuple(delta.shape)} "
            f"{delta.dtype} on {delta.device} for {tuple(residual.shape)} {residual.dtype} "
            f"on {residual.device}"
        )
    num_rows, num_cols = residual.shape
    if weight.shape != (num_cols,) or weight.dtype != residual.dtype:
        raise ValueError(
            f"weight must be [{num_cols}] in {residual.dtype}, got {tuple(weight.shape)} "
            f"in {weight.dtype}"
        )
    _check_device("weight", weight, residual.device)
    if num_cols > MAX_ROW_SIZE:
        raise ValueError(f"rows of {num_cols} exceed the {MAX_ROW_SIZE} one block holds")
    weight = weight.contiguous()
    normed = torch.empty((num_rows, num_cols), dtype=residual.dtype, device=residual.device)
    new_residual = residual if delta is None else torch.empty_like(normed)
    if num_rows == 0:
        return normed, new_residual
    block = triton_next_pow2(num_cols)
    source = residual if delta is None else delta  # a placeholder pointer without delta
    kernel = _kernels().add_rms_norm_kernel
    kernel[(num_rows,)](
        source,
        residual,
        weight,
        normed,
        new_residual,
        *source.stride(),
        *residual.stride(),
        num_cols,
        eps,
        HAS_DELTA=delta is not None,
        BLOCK=block,
        INTERPRETED=_is_interpreted(kernel),
        num_warps=min(16, max(1, block // 256)),
        enable_fp_fusion=False,
    )
    return normed, new_residual


def add_rms_norm_reference(
    delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm`` as the eager model computes it (``llama.RMSNorm``)."""
    if delta is not None:
        residual = residual + delta
    normed = F.rms_norm(residual.float(), weight.shape, eps=eps)
    return weight * normed.to(residual.dtype), residual


# ---- rotary + cache write ---------------------------------------------------------------


def rotary_write(
    qkv: torch.Tensor,  # [T, (heads + 2 · kv_heads) · D]: q, k, v
    positions: torch.Tensor,  # [T]
    cos: torch.Tensor,  # [max_position, D] (``Rotary.cos``, fp32 unless cast)
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [num_rows, kv_heads, D]
    v_cache: torch.Tensor,
    write_index: torch.Tensor,  # [T] cache row of each token; < 0: not written
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Rotate q and k (Hugging Face layout, ``llama.Rotary``), write the rotated keys and
    the values to their cache rows (cast to the cache's dtype), and return the rotated
    queries ``[T, heads, D]`` (a new contiguous tensor). A token whose ``write_index`` is
    negative writes nothing (a padded step's padding tokens)."""
    _check_rows("qkv", qkv)
    num_tokens, width = qkv.shape
    device = qkv.device
    if width != (num_heads + 2 * num_kv_heads) * head_dim or head_dim % 2:
        raise ValueError(
            f"qkv rows of {width} are not (heads {num_heads} + 2 x kv_heads {num_kv_heads}) x "
            f"head_dim {head_dim} with an even head_dim"
        )
    for name, index in (("positions", positions), ("write_index", write_index)):
        if index.shape != (num_tokens,) or index.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"{name} must be [{num_tokens}] int32 or int64, got {tuple(index.shape)} "
                f"{index.dtype}"
            )
        _check_device(name, index, device)
    for name, table in (("cos", cos), ("sin", sin)):
        if table.dim() != 2 or table.shape[1] != head_dim or table.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{name} must be a [max_position, {head_dim}] float table, got "
                f"{tuple(table.shape)} {table.dtype}"
            )
        if table.stride(1) != 1:
            raise ValueError(f"{name}'s rows must be contiguous")
        _check_device(name, table, device)
    expected = (num_kv_heads, head_dim)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 3 or cache.shape[1:] != expected or cache.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{name} must be [rows, {num_kv_heads}, {head_dim}] of a float dtype, got "
                f"{tuple(cache.shape)} {cache.dtype}"
            )
        _check_device(name, cache, device)
    q = torch.empty((num_tokens, num_heads, head_dim), dtype=qkv.dtype, device=device)
    if num_tokens == 0:
        return q
    block_d = triton_next_pow2(head_dim)
    kernel = _kernels().rotary_write_kernel
    kernel[(num_tokens,)](
        qkv,
        positions,
        cos,
        sin,
        write_index,
        q,
        k_cache,
        v_cache,
        *qkv.stride(),
        cos.stride(0),
        sin.stride(0),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HQ=triton_next_pow2(num_heads),
        BLOCK_HK=triton_next_pow2(num_kv_heads),
        BLOCK_D=block_d,
        INTERPRETED=_is_interpreted(kernel),
        num_warps=4 if triton_next_pow2(num_heads) * block_d >= 1024 else 2,
        enable_fp_fusion=False,  # x · cos + y · sin rounds each product, as eagerly
    )
    return q


def rotary_write_reference(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    write_index: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """``rotary_write`` as the eager model computes it (``llama.Attention.forward`` and
    ``write_cache``); negative ``write_index`` entries are skipped."""
    from dspark.models.llama import rotate_half

    num_tokens = qkv.shape[0]
    kv_size = num_kv_heads * head_dim
    q, k, v = qkv.split([num_heads * head_dim, kv_size, kv_size], dim=-1)
    q = q.reshape(num_tokens, num_heads, head_dim)
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    v = v.reshape(num_tokens, num_kv_heads, head_dim)
    cos_t = cos[positions].unsqueeze(-2).to(qkv.dtype)
    sin_t = sin[positions].unsqueeze(-2).to(qkv.dtype)
    q = q * cos_t + rotate_half(q) * sin_t
    k = k * cos_t + rotate_half(k) * sin_t
    kept = write_index >= 0
    k_cache.index_copy_(0, write_index[kept], k[kept].to(k_cache.dtype))
    v_cache.index_copy_(0, write_index[kept], v[kept].to(v_cache.dtype))
    return q.contiguous()


# ---- silu · mul -------------------------------------------------------------------------


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` ``[T, I]`` from ``gate_up`` ``[T, 2I]`` (gate first, as
    ``MLP`` fuses them), a new contiguous tensor."""
    _check_rows("gate_up", gate_up)
    num_rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"gate_up's rows hold gate then up: need an even width, got {width}")
    size = width // 2
    out = torch.empty((num_rows, size), dtype=gate_up.dtype, device=gate_up.device)
    if num_rows == 0 or size == 0:
        return out
    block = min(SILU_BLOCK, triton_next_pow2(size))
    kernel = _kernels().silu_mul_kernel
    kernel[(num_rows, -(-size // block))](
        gate_up,
        out,
        *gate_up.stride(),
        size,
        BLOCK=block,
        INTERPRETED=_is_interpreted(kernel),
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu_mul`` as the eager model computes it (``llama.MLP``)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---- helpers ----------------------------------------------------------------------------


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check_rows(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{name} must be a 2-D float32, bfloat16 or float16 tensor, got "
            f"{tuple(x.shape)} {x.dtype}"
        )


def _check_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, the activations on {device}: move it there")


def _is_interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


@functools.cache
def _kernels():
    try:
        from dspark.ops import fused_kernels
    except ImportError as error:
        raise RuntimeError(
            "the fused kernels need triton (pip install triton; on a machine without a GPU "
            "set TRITON_INTERPRET=1 to run them interpreted), or set DSPARK_EAGER_OPS=1"
        ) from error
    return fused_kernels
