"""Kernels one decoder layer launches in a padded decode step, eager ops against fused.

    python scripts/layer_kernels.py [--device cuda] [--tokens 1 5] [--time]

A SmolLM2-135M-shaped decoder (hidden 576, 9 heads on 3 kv heads, head size 64) with
random bf16 weights runs one padded step (``PaddedStepRunner``, not captured) of one
request over 100 cached tokens, once with one layer and once with two: the difference is
one layer's count, the rest is the step's own (embedding, staging copy, final norm).

On CUDA the count is the profiler's kernels (and memcpy/memset) for the step. On the CPU
(the fused path needs TRITON_INTERPRET=1) it is the ATen ops that would launch a kernel
on CUDA (views, allocations and dtype no-ops left out; products as ``F.linear``, one
GEMM) plus the Triton launches. ``--time`` (CUDA) also replays the step of the 30-layer
model as a CUDA graph and prints its time per step.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMOLLM2 = {
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "intermediate_size": 1536,
}
CACHED = 100

NO_KERNEL = {
    *("view", "slice", "transpose", "permute", "unsqueeze", "squeeze", "split"),
    *("split_with_sizes", "chunk", "detach", "expand", "t", "alias", "_unsafe_view"),
    *("select", "as_strided", "empty", "empty_like", "new_empty", "lift_fresh"),
    *("resolve_conj", "resolve_neg"),
}


class AtenLaunches(TorchDispatchMode):
    """The ATen ops that launch a kernel on CUDA, by name (CPU counting)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.paused or name in NO_KERNEL:
            return out
        if name in ("reshape", "to", "_to_copy", "contiguous") and isinstance(out, torch.Tensor):
            if out.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr():
                return out  # a view or the tensor itself: no copy
        self.ops.append(name)
        return out


def count_triton_launches(log: AtenLaunches) -> None:
    """Counts each interpreted Triton launch once, not the ops the interpreter runs."""
    from triton.runtime import interpreter

    run = interpreter.InterpretedFunction.run

    def counted(self, *args, **kwargs):
        log.ops.append("triton:" + self.fn.__name__)
        log.paused += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            log.paused -= 1

    interpreter.InterpretedFunction.run = counted


def build(num_layers: int, device: str, paged: bool):
    from tests.conftest import make_tiny_model

    from dspark.engine.graphs import PaddedStepRunner
    from dspark.engine.kv_cache import BlockTable, PagedKVCache

    loaded = make_tiny_model(Path(tempfile.mkdtemp()), num_hidden_layers=num_layers, **SMOLLM2)
    model = loaded.model.to(device=device, dtype=torch.bfloat16)
    cache = PagedKVCache(loaded.config, 64, 16, torch.bfloat16, device)

    def body(ids, positions, batch):
        return model(ids, positions, batch, cache.layers)[0]

    runner = PaddedStepRunner(body, cache, 64, 64, 256, capture=False, paged=paged)
    table = BlockTable()
    assert cache.reserve(table, CACHED + 16)
    return runner, table


def step_ops(num_layers: int, device: str, eager: bool, tokens: int) -> list[str]:
    os.environ["DSPARK_EAGER_OPS"] = "1" if eager else "0"
    from dspark.ops.fused import fused_ops_enabled

    runner, table = build(num_layers, device, fused_ops_enabled(torch.device(device)))
    args = ([table], np.array([CACHED]), np.array([tokens]), np.arange(tokens))
    with torch.inference_mode():
        runner.run(*args)  # fuses the qkv and gate/up weights, compiles the kernels
        if device == "cuda":
            torch.cuda.synchronize()
            return cuda_kernels(lambda: runner.run(*args))
        log = AtenLaunches()
        if os.environ.get("TRITON_INTERPRET") == "1":
            count_triton_launches(log)
        with log:
            runner.run(*args)
        return log.ops


def cuda_kernels(step) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return [n.split("<")[0][:60] for n in names]


def graph_ms(eager: bool, tokens: int) -> float:
    """One padded step of the 30-layer model replayed as a CUDA graph, milliseconds."""
    os.environ["DSPARK_EAGER_OPS"] = "1" if eager else "0"
    from dspark.engine.graphs import capture_graph
    from dspark.ops.fused import fused_ops_enabled

    runner, table = build(30, "cuda", fused_ops_enabled(torch.device("cuda")))
    args = ([table], np.array([CACHED]), np.array([tokens]), np.arange(tokens))
    with torch.inference_mode():
        shape = runner.shape_for(args[1], args[2])
        runner.run(*args)
        runner.stage(shape, *args[:4], causal=True)
        runner.buffer.copy_(runner.staging)
        graph, _ = capture_graph(lambda: runner.body(*runner._inputs(shape)), None, True)
        for _ in range(10):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1])
    parser.add_argument("--time", action="store_true", help="CUDA: time the graph replay")
    args = parser.parse_args()
    import dspark.models.llama as llama

    if args.device != "cuda":  # the CPU's row plans would count as several ops
        llama.linear = F.linear
    for tokens in args.tokens:
        for eager in (True, False):
            one = collections.Counter(step_ops(1, args.device, eager, tokens))
            two = collections.Counter(step_ops(2, args.device, eager, tokens))
            layer = two - one
            label = "eager" if eager else "fused"
            print(f"{tokens} token(s), {label}: {layer.total()} kernels per layer, ", end="")
            print(f"{(one - layer).total()} outside the layers")
            for name, count in sorted(layer.items(), key=lambda kv: -kv[1]):
                print(f"    {count:3d}  {name}")
            if args.time and args.device == "cuda":
                print(f"    30 layers, graph replay: {graph_ms(eager, tokens):.3f} ms a step")


if __name__ == "__main__":
    main()
