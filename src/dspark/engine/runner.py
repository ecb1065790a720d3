"""The model runner: the target model on its device, its paged KV cache and one packed
forward per step (replayed as a CUDA graph where its shape is captured)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dspark.engine.config import EngineConfig, switched_on
from dspark.engine.graphs import PaddedStepRunner
from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.models.loader import LoadedModel, row_plan_store
from dspark.ops.linear import tune_small_rows


class ModelRunner:
    """Runs the target over packed variable-length steps: every scheduled token of every
    request (prompt chunks, decode tokens, drafts to verify) in one forward."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, max_model_len: int) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.config = config
        self.max_model_len = max_model_len
        param = next(self.model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if self.device.type == "cuda":
            # cuDNN's attention plans every new shape on the host, milliseconds a call,
            # and every step brings new key lengths. Process-wide.
            torch.backends.cuda.enable_cudnn_sdp(False)
        weights_of = getattr(self.model, "linear_weights", None)
        if self.device.type == "cpu" and weights_of is not None:
            tune_small_rows(weights_of(), store=row_plan_store())
        # Padded steps are whole-model graphs: not under tensor parallelism.
        self.padded_steps = config.tensor_parallel_size == 1 and switched_on(
            config.cuda_graphs, self.device.type == "cuda"
        )
        self.kv_regions = config.max_num_seqs if config.uses_kv_regions(self.device.type) else 0
        self.cache = PagedKVCache(
            loaded.local_config,  # a tensor-parallel shard caches its own heads
            # Padded steps take one block for padding tokens: on top of the pool asked for.
            config.kv_cache_tokens // config.block_size + int(self.padded_steps),
            config.block_size,
            self.dtype,
            self.device,
            regions=self.kv_regions,
        )
        self.graphs: PaddedStepRunner | None = None
        if self.padded_steps:
            self.graphs = PaddedStepRunner(
                self._graph_body,
                self.cache,
                max_tokens=config.max_num_batched_tokens,
                max_pieces=config.max_num_batched_tokens,
                max_len=max_model_len,
                capture=self.device.type == "cuda",
            )
            self.graphs.ledger.budget = config.graph_padding_budget
        self.capture_layers: tuple[int, ...] = ()  # target layers a drafter reads
        # Completes a tensor-parallel shard's partial sums (None: the whole model).
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.graph_tokens = 0  # tokens of the shape the latest forward replayed (0: eager)

    def forward(
        self,
        tables: list[BlockTable],
        num_cached: np.ndarray,
        num_query: np.ndarray,
        tokens: np.ndarray,
        num_admitted: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final hidden states ``[T, hidden]`` and the captured layers of one packed step.
        A graph's outputs are its own buffers, valid until the next forward.
        ``num_admitted``: drafts among each request's query tokens (a tensor-parallel
        plan carries them; one process needs no more than the tokens)."""
        self.graph_tokens = 0
        shape = None if self.graphs is None else self.graphs.shape_for(num_cached, num_query)
        if shape is not None:
            covered = self.graphs.covered_tokens
            outputs = self.graphs.run(tables, num_cached, num_query, tokens, shape=shape)
            # The shape replayed: its own, or the larger one the ledger covered it with.
            self.graph_tokens = shape.num_tokens + self.graphs.covered_tokens - covered
            return outputs[0], outputs[1:]
        batch = self.cache.attention_batch(tables, num_cached, num_query)
        positions = np.concatenate(
            [np.arange(c, c + q) for c, q in zip(num_cached, num_query, strict=True)]
        )
        return self.model(
            torch.from_numpy(tokens).to(self.device),
            torch.from_numpy(positions).to(self.device),
            batch,
            self.cache.layers,
            capture_layers=self.capture_layers,
            all_reduce=self.all_reduce,
        )

    def plan_digests(self) -> dict[int, list[int]]:
        """Per tensor-parallel rank, the digests of the plans it ran (none: one process)."""
        return {}

    def check_workers(self) -> None:
        """Raise ``TensorParallelError`` if a tensor-parallel worker has exited (one
        process has none)."""

    def close(self) -> None:
        """Free what outlives the runner's objects (a tensor-parallel runner's workers)."""

    def _graph_body(self, ids: torch.Tensor, positions: torch.Tensor, batch) -> list:
        hidden, captured = self.model(
            ids, positions, batch, self.cache.layers, capture_layers=self.capture_layers
        )
        return [hidden, *captured]

    def to_device(self, values: list[int]) -> torch.Tensor:
        """An int64 index on the device without waiting for the device's queue: a copy out
        of pinned memory does not wait for the stream to drain."""
        if self.device.type != "cuda":
            return torch.tensor(values, dtype=torch.int64)
        host = torch.tensor(values, dtype=torch.int64, pin_memory=True)
        return host.to(self.device, non_blocking=True)  # the host allocator keeps it alive

    def clock(self) -> float:
        """Milliseconds, after the device has finished what was queued."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() * 1e3
