"""A Llama-family decoder in plain PyTorch, run over packed variable-length batches.

One forward takes every scheduled token of every request as one flat sequence (prompt
chunks, decode tokens and draft tokens alike): the dense layers see ``[num_tokens,
hidden]``, so their cost follows the total token count. Attention reads each request's
cached keys and values through ``AttentionBatch`` (see ``dspark.engine.kv_cache``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark.models.config import ModelConfig
from dspark.ops.linear import linear


@dataclass
class AttentionGroup:
    """Requests whose attention runs as one padded SDPA call.

    R is the group's requests, or, read in their cache regions (``read_stride``), the
    regions from the lowest to the highest, those of requests outside the group padding
    rows with no valid query. ``read_index`` is ``[R, max_len]`` cache rows each request
    attends over (padding masked out by ``mask``); ``query_index`` scatters the packed
    queries into ``[R, max_query]``, ``valid_rows`` lists the real ones as flat indices
    into ``[R · max_query]`` (integer indices, not a boolean mask: selecting by a mask on
    the GPU makes the host wait for the count), and ``out_index`` lists, in the same
    order, where their outputs go in the packed sequence.
    """

    read_index: torch.Tensor | None  # [R, max_len]; None: a view from read_start (below)
    mask: torch.Tensor  # [R, 1, max_query, max_len] bool, True = attend
    query_index: torch.Tensor  # [R, max_query]
    valid_rows: torch.Tensor  # [num valid queries] flat indices into [R · max_query]
    out_index: torch.Tensor  # [num valid queries]
    # Without read_index: request r's rows start at read_start + r · read_stride (a lone
    # request whose rows are consecutive; requests in their cache regions, kv_cache).
    read_start: int = 0
    read_stride: int = 0
    in_order: bool = True  # out_index is 0, 1, 2, ...: the valid rows are in packed order
    _shared: tuple[int, torch.Tensor] | None = None  # shared_mask's cache

    def shared_mask(self, share: int) -> torch.Tensor:
        """The mask for ``share`` query heads folded into the query rows of each key
        head: ``[R, 1, share · max_query, max_len]`` (built once per step, reused by every
        layer)."""
        if share == 1:
            return self.mask
        if self._shared is None or self._shared[0] != share:
            self._shared = (share, self.mask.repeat(1, 1, share, 1))
        return self._shared[1]

    def cached(self, cache: torch.Tensor) -> torch.Tensor:
        """``[R, max_len, kv_heads, D]`` keys or values of the group's requests (a view of
        the cache, or a gathered copy)."""
        if self.read_index is not None:
            return cache[self.read_index]
        max_len = self.mask.shape[-1]
        if not self.read_stride:
            return cache[self.read_start : self.read_start + max_len].unsqueeze(0)
        num_reqs, stride = self.mask.shape[0], self.read_stride
        runs = cache[self.read_start : self.read_start + num_reqs * stride]
        return runs.view(num_reqs, stride, *cache.shape[1:])[:, :max_len]


@dataclass
class AttentionBatch:
    """Where the packed tokens sit: filled by the engine once per step, shared by layers.

    ``write_index[t]`` is the cache row token t's key and value go to. Requests are split
    into groups (decodes together, each long prompt chunk alone) so that a prompt chunk
    never pads every decode's queries to its length.
    """

    write_index: torch.Tensor  # [T]
    groups: list[AttentionGroup]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalised in float32, scaled in the input's dtype (as Hugging Face's Llama);
        # one fused op instead of five small ones: an eager step is launch-bound.
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    """RoPE, Hugging Face layout (the two halves of each head rotate together)."""

    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self._tables(positions, x.dtype)
        return x * cos + rotate_half(x) * sin

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos and sin ``[..., T, 1, D]`` at ``positions``; every layer of a forward passes
        the same tensor, so they are gathered once (the held reference keeps the identity
        check exact)."""
        key = (dtype, torch.is_inference_mode_enabled(), self.cos.device)
        cached = self.__dict__.get("_last")
        if cached is not None and cached[0] is positions and cached[1] == key:
            return cached[2], cached[3]
        cos = self.cos[positions].unsqueeze(-2).to(dtype)
        sin = self.sin[positions].unsqueeze(-2).to(dtype)
        self.__dict__["_last"] = (positions, key, cos, sin)
        return cos, sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        kv_size = self.num_kv_heads * self.head_dim
        self.qkv_sizes = [self.num_heads * self.head_dim, kv_size, kv_size]
        self.qkv_weight: torch.Tensor | None = None
        self.qkv_bias: torch.Tensor | None = None

    def qkv_proj(self, hidden: torch.Tensor) -> torch.Tensor:
        """q, k and v in one matrix product (one larger GEMM reads the activations once)."""
        if self.qkv_weight is None:
            self.qkv_weight, self.qkv_bias = fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        return linear(hidden, self.qkv_weight, self.qkv_bias)

    def _apply(self, fn, recurse=True):  # .to() / .cuda(): re-fuse from the moved weights
        self.qkv_weight = self.qkv_bias = None
        return super()._apply(fn, recurse)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T]
        rotary: Rotary,
        batch: AttentionBatch,
        k_cache: torch.Tensor,  # [num_rows, kv_heads, D]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.qkv_sizes, dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(q, positions), rotary(k, positions)
        out = paged_attention(q, k, v, batch, k_cache, v_cache)
        return linear(out.reshape(num_tokens, self.num_heads * self.head_dim), self.o_proj.weight)


def paged_attention(
    q: torch.Tensor,  # [T, heads, D], rotated
    k: torch.Tensor,  # [T, kv_heads, D], rotated
    v: torch.Tensor,  # [T, kv_heads, D]
    batch: AttentionBatch,
    k_cache: torch.Tensor,  # [num_rows, kv_heads, D]
    v_cache: torch.Tensor,
) -> torch.Tensor:
    """Write the step's keys and values to their cache rows, then attend each group of
    requests over its rows; ``[T, heads, D]`` in packed order."""
    k_cache.index_copy_(0, batch.write_index, k.to(k_cache.dtype))
    v_cache.index_copy_(0, batch.write_index, v.to(v_cache.dtype))
    alone = len(batch.groups) == 1 and batch.groups[0].in_order  # no scatter needed
    out = q if alone else torch.empty_like(q)
    num_heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    share = num_heads // kv_heads  # query heads per key/value head
    for group in batch.groups:
        keys = group.cached(k_cache).transpose(1, 2)  # [R, kv_heads, max_len, D]
        values = group.cached(v_cache).transpose(1, 2)
        queries = q[group.query_index]  # [R, max_query, heads, D]
        num_reqs, max_query = queries.shape[:2]
        # Grouped-query attention without copying keys: the query heads that share a key
        # head become extra query rows of that head, [R, kv_heads, share · max_query, D].
        queries = queries.view(num_reqs, max_query, kv_heads, share, head_dim)
        queries = queries.permute(0, 2, 3, 1, 4).reshape(num_reqs, kv_heads, -1, head_dim)
        attended = F.scaled_dot_product_attention(
            queries, keys.to(q.dtype), values.to(q.dtype), attn_mask=group.shared_mask(share)
        )  # [R, kv_heads, share · max_query, D]
        attended = attended.view(num_reqs, kv_heads, share, max_query, head_dim)
        attended = attended.permute(0, 3, 1, 2, 4).reshape(-1, num_heads, head_dim)
        attended = attended.index_select(0, group.valid_rows)  # [valid, heads, D]
        if alone:
            out = attended  # one group covers every token, already in packed order
        else:
            out[group.out_index] = attended
    return out


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input. The separate
    weights become views of it, so the model holds each number once."""
    weight = torch.cat([part.weight.detach() for part in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([part.bias.detach() for part in linears]) if has_bias else None
    start = 0
    for part in linears:
        rows = part.weight.shape[0]
        part.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if has_bias:
            part.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

        self.gate_up_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is None:
            self.gate_up_weight, _ = fuse_linears(self.gate_proj, self.up_proj)
        gate, up = linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return linear(F.silu(gate) * up, self.down_proj.weight)

    def _apply(self, fn, recurse=True):
        self.gate_up_weight = None
        return super()._apply(fn, recurse)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    """Decoder weights named as in Hugging Face checkpoints (``model.*``, ``lm_head``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.max_position)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        batch: AttentionBatch,
        kv_cache: Sequence[tuple[torch.Tensor, torch.Tensor]],
        capture_layers: Sequence[int] = (),
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final hidden states ``[T, hidden]`` (before the LM head) and the outputs of
        the layers in ``capture_layers`` (for a drafter's context features).
        ``all_reduce``: a tensor-parallel shard's attention and MLP outputs are partial
        sums over its heads and columns, which this completes (None: the whole model).
        The caller passes it, not the model: engines may share one loaded shard."""

        def completed(partial: torch.Tensor) -> torch.Tensor:
            return partial if all_reduce is None else all_reduce(partial)

        hidden = self.embed_tokens(input_ids)
        captured = []
        for index, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache[index]
            hidden = hidden + completed(
                layer.self_attn(
                    layer.input_layernorm(hidden), positions, self.rotary, batch, k_cache, v_cache
                )
            )
            hidden = hidden + completed(layer.mlp(layer.post_attention_layernorm(hidden)))
            if index in capture_layers:
                captured.append(hidden)
        return self.norm(hidden), captured

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.lm_head.weight).float()

    def linear_weights(self) -> list[torch.Tensor]:
        """The weights ``linear`` multiplies in a forward and the LM head, in that order
        (q, k and v fused, gate and up fused, as the forward fuses them)."""
        weights = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv_weight is None:
                attn.qkv_weight, attn.qkv_bias = fuse_linears(attn.q_proj, attn.k_proj, attn.v_proj)
            if mlp.gate_up_weight is None:
                mlp.gate_up_weight, _ = fuse_linears(mlp.gate_proj, mlp.up_proj)
            weights += [attn.qkv_weight, attn.o_proj.weight]
            weights += [mlp.gate_up_weight, mlp.down_proj.weight]
        return [*weights, self.lm_head.weight]

    def forward_dense(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T] (or [T])
        mask: torch.Tensor | None,  # [B, 1, T, S] bool, True = attend; None: causal, S = T
        capture_layers: Sequence[int] = (),
        cache: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,  # [B, L, kv, D]
        cache_start: int = 0,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The same decoder over a padded ``[B, T]`` batch (training and bulk generation,
        where a paged cache only gets in the way). With ``cache``, keys and values go to
        columns ``cache_start ... cache_start + T`` and attention reads every column up
        to there."""
        batch, length = input_ids.shape
        hidden = self.embed_tokens(input_ids)
        captured = []
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(batch, length, attn.num_heads, attn.head_dim)
            k = attn.k_proj(x).view(batch, length, attn.num_kv_heads, attn.head_dim)
            v = attn.v_proj(x).view(batch, length, attn.num_kv_heads, attn.head_dim)
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
            if cache is not None:
                k_cache, v_cache = cache[index]
                k_cache[:, cache_start : cache_start + length] = k
                v_cache[:, cache_start : cache_start + length] = v
                k, v = k_cache[:, : cache_start + length], v_cache[:, : cache_start + length]
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=mask,
                is_causal=mask is None,
                enable_gqa=attn.num_heads != attn.num_kv_heads,
            ).transpose(1, 2)
            hidden = hidden + attn.o_proj(out.reshape(batch, length, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if index in capture_layers:
                captured.append(hidden)
        return self.norm(hidden), captured

    def load_weights(self, state: dict[str, torch.Tensor]) -> set[str]:
        """Copy Hugging Face-named weights in; returns the names left unfilled."""
        if self.config.tie_word_embeddings:  # moving off the meta device unties them
            self.lm_head.weight = self.embed_tokens.weight
        own = dict(self.named_parameters())
        unfilled = set(own)
        for name, tensor in state.items():
            key = name.removeprefix("model.")
            if key in own:
                with torch.no_grad():
                    own[key].copy_(tensor)
                unfilled.discard(key)
        if self.config.tie_word_embeddings:
            unfilled.discard("lm_head.weight")
        for layer in self.layers:  # fuse again from the new weights on first use
            layer.self_attn.qkv_weight = layer.self_attn.qkv_bias = None
            layer.mlp.gate_up_weight = None
        with torch.no_grad():  # meta-initialised buffers
            fresh = Rotary(self.config.head_dim, self.config.rope_theta, self.config.max_position)
            self.rotary.cos, self.rotary.sin = fresh.cos, fresh.sin
        return unfilled
