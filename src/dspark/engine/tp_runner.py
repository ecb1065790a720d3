"""Rank 0's model runner under tensor parallelism.

The same packed forward as ``ModelRunner``, over rank 0's shard; before each forward it
sends the step's plan (``StepPlanMessage``) to the other ranks, which run their shards of
the same step, every layer's partial outputs meeting in an all-reduce. Everything the
engine decides (scheduling, drafting, the adaptive budget and allocation, sampling and
acceptance) stays in this process: the workers receive its results and compute nothing
they could decide differently. The final hidden states, complete after the last
all-reduce, are rank 0's own, and so are the logits: its LM head is whole.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from dspark.engine.config import EngineConfig
from dspark.engine.distributed import WorkerPool
from dspark.engine.kv_cache import BlockTable
from dspark.engine.runner import ModelRunner
from dspark.engine.step_message import StepPlanMessage
from dspark.models.loader import LoadedModel
from dspark.models.parallel import TensorShard


def rank_threads(size: int) -> int:
    """CPU threads per rank: the machine's cores shared out, at least one each."""
    return max(1, (os.cpu_count() or 1) // size)


def rank_device(device: torch.device, rank: int) -> str:
    """Rank ``rank``'s device: the next GPU on CUDA, the same CPU otherwise."""
    return f"cuda:{rank}" if device.type == "cuda" else str(device)


class ParallelModelRunner(ModelRunner):
    def __init__(self, loaded: LoadedModel, config: EngineConfig, max_model_len: int) -> None:
        size = config.tensor_parallel_size
        if loaded.shard != TensorShard(0, size):
            raise ValueError(
                f"tensor_parallel_size={size} needs rank 0's shard of the model: load it "
                f"with load_model(path, shard=TensorShard(0, {size})), or use "
                f"LLM(model, tensor_parallel_size={size})"
            )
        param = next(loaded.model.parameters())
        self.host_threads = torch.get_num_threads()
        threads = rank_threads(size)
        self.threads = threads if param.device.type == "cpu" else None
        if self.threads is not None:
            torch.set_num_threads(threads)  # rank 0 takes its share too (restored on close)
        spec = {
            "model": str(loaded.path),
            "dtype": str(param.dtype).removeprefix("torch."),
            "device": str(param.device),  # rank 0's: each worker takes its own from it
            "threads": threads,
            "engine": config.to_dict(),
            "max_model_len": max_model_len,
        }
        self.pool = WorkerPool(
            spec,
            size,
            param.device,
            config.tp_timeout_s,
            config.tp_start_timeout_s,
        )
        try:
            super().__init__(loaded, config, max_model_len)  # while the workers load
            self.pool.connect()
        except BaseException:
            self.close()
            raise
        self.all_reduce = self.pool.all_reduce
        self.plan_ms: list[float] = []  # host ms per forward to encode and send the plan
        self.plan_bytes: list[int] = []

    def forward(
        self,
        tables: list[BlockTable],
        num_cached: np.ndarray,
        num_query: np.ndarray,
        tokens: np.ndarray,
        num_admitted: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        start = time.perf_counter()
        admitted = np.zeros_like(num_query) if num_admitted is None else num_admitted
        payload = StepPlanMessage(tokens, num_cached, num_query, admitted, tables).encode()
        self.pool.send_plan(payload)
        self.plan_ms.append((time.perf_counter() - start) * 1e3)
        self.plan_bytes.append(len(payload))
        return super().forward(tables, num_cached, num_query, tokens)

    def plan_digests(self) -> dict[int, list[int]]:
        return self.pool.plan_digests()

    def check_workers(self) -> None:
        self.pool.check_alive()

    def close(self) -> None:
        self.pool.close()
        # Engines alive side by side close in any order: the last to set the count restores it.
        if torch.get_num_threads() == self.threads:
            torch.set_num_threads(self.host_threads)
