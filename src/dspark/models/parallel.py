"""Tensor-parallel shards of a Llama-family decoder: which rows and columns each rank holds.

Each rank holds a contiguous run of key/value heads (with the query heads that share
them) and a contiguous run of the MLP's intermediate columns: q, k, v, gate and up are
split by output rows (column-parallel), o and down by input columns (row-parallel), so
each layer's attention and MLP outputs are partial sums that one all-reduce completes
(the ``all_reduce`` a runner passes ``LlamaModel.forward``). The embedding, the norms
and the LM head are whole on every rank. Heads that do not divide evenly go one extra
to the first ranks (SmolLM2's 3 key/value heads over 2 ranks: 2 and 1), so no model
needs a head count divisible by the rank count, only at least one key/value head per
rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from dspark.models.config import ModelConfig

_COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # rows split
_ROW_PARALLEL = ("o_proj", "down_proj")  # input columns split


@dataclass(frozen=True, slots=True)
class TensorShard:
    """Rank ``rank`` of ``size`` tensor-parallel ranks."""

    rank: int
    size: int

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not one of {self.size} tensor-parallel ranks")

    def span(self, units: int) -> tuple[int, int]:
        """This rank's run ``[start, stop)`` of ``units`` split as evenly as possible (the
        first ``units % size`` ranks take one more)."""
        base, extra = divmod(units, self.size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + int(self.rank < extra)

    def check(self, config: ModelConfig) -> None:
        if config.num_kv_heads < self.size:
            raise ValueError(
                f"tensor_parallel_size {self.size} exceeds the model's {config.num_kv_heads} "
                f"key/value heads; use at most {config.num_kv_heads} ranks"
            )

    def head_spans(self, config: ModelConfig) -> tuple[tuple[int, int], tuple[int, int]]:
        """This rank's query heads and key/value heads, as ``[start, stop)`` runs."""
        share = config.num_heads // config.num_kv_heads
        kv_start, kv_stop = self.span(config.num_kv_heads)
        return (kv_start * share, kv_stop * share), (kv_start, kv_stop)

    def slice_of(self, name: str, config: ModelConfig) -> tuple[int, int, int] | None:
        """``(dim, start, stop)`` of a checkpoint weight this rank holds part of, or None
        for a weight held whole."""
        parts = name.split(".")
        if len(parts) < 2 or parts[-2] not in _COLUMN_PARALLEL + _ROW_PARALLEL:
            return None
        module = parts[-2]
        (q_start, q_stop), (kv_start, kv_stop) = self.head_spans(config)
        head = config.head_dim
        if module in ("gate_proj", "up_proj", "down_proj"):
            start, stop = self.span(config.intermediate_size)
        elif module in ("q_proj", "o_proj"):
            start, stop = q_start * head, q_stop * head
        else:
            start, stop = kv_start * head, kv_stop * head
        if module in _ROW_PARALLEL:
            return (1, start, stop) if parts[-1] == "weight" else None
        return 0, start, stop


def local_config(config: ModelConfig, shard: TensorShard | None) -> ModelConfig:
    """The shapes one rank holds: its heads and intermediate columns (all of them without
    a shard). Its KV cache is built from this."""
    if shard is None or shard.size == 1:
        return config
    (q_start, q_stop), (kv_start, kv_stop) = shard.head_spans(config)
    start, stop = shard.span(config.intermediate_size)
    return replace(
        config,
        num_heads=q_stop - q_start,
        num_kv_heads=kv_stop - kv_start,
        intermediate_size=stop - start,
    )


def shard_layers(model: nn.Module, shard: TensorShard) -> None:
    """Resize a freshly built (meta) ``LlamaModel``'s projections to ``shard``'s part, so
    its shard's weights load into it. The model's ``config`` stays the whole model's."""
    config = model.config
    shard.check(config)
    part = local_config(config, shard)
    hidden, head = config.hidden_size, config.head_dim
    q_size, kv_size = part.num_heads * head, part.num_kv_heads * head
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        bias = config.attention_bias
        attn.num_heads, attn.num_kv_heads = part.num_heads, part.num_kv_heads
        attn.q_proj = nn.Linear(hidden, q_size, bias=bias)
        attn.k_proj = nn.Linear(hidden, kv_size, bias=bias)
        attn.v_proj = nn.Linear(hidden, kv_size, bias=bias)
        attn.o_proj = nn.Linear(q_size, hidden, bias=False)
        attn.qkv_sizes = [q_size, kv_size, kv_size]
        mlp.gate_proj = nn.Linear(hidden, part.intermediate_size, bias=False)
        mlp.up_proj = nn.Linear(hidden, part.intermediate_size, bias=False)
        mlp.down_proj = nn.Linear(part.intermediate_size, hidden, bias=False)
