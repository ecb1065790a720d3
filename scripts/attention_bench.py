"""Paged attention on the GPU: the eager gather + SDPA path against the Triton kernel.

    python scripts/attention_bench.py --out results/attention [--shapes smollm2 llama8b]

For each head shape, step kind (decode: 1 query a request; verify: K + 1), request count
and context length, one layer's attention (the step's key/value write included, as both
paths do it) is timed with CUDA events after warm-up: issued from Python, and replayed
from a CUDA graph (the kernels' own time, as the engine runs them). Blocks of the requests
interleave in the pool as they do after the engine has run a while. Prints a table and
writes ``attention_bench.json`` and ``attention_bench.png`` to ``--out``; each row also
holds the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}
"""(query heads, key/value heads, head size): SmolLM2-135M and Llama 3 8B."""


@dataclass(frozen=True, slots=True)
class Case:
    shape: str
    kind: str  # "decode" or "verify"
    num_requests: int
    context: int  # tokens cached per request before the step
    num_query: int  # tokens per request this step


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for JSON and PNG")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--requests", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--contexts", nargs="+", type=int, default=[512, 2048])
    parser.add_argument("--drafts", type=int, default=4, help="K: a verify step has K + 1")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per case")
    parser.add_argument("--calls", type=int, default=10, help="calls per timed run")
    parser.add_argument("--no-graphs", action="store_true", help="skip CUDA graph replay")
    parser.add_argument("--device", default="cuda")


def main(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        sys.exit("attention_bench needs torch (pip install torch==2.13.0)")
    if not torch.cuda.is_available() or not args.device.startswith("cuda"):
        sys.exit(
            "attention_bench times CUDA kernels and found no CUDA device "
            f"(torch {torch.__version__}, --device {args.device}); run it on the GPU machine"
        )
    try:
        import triton
    except ImportError:
        sys.exit("attention_bench needs triton (pip install triton)")
    from tqdm import tqdm

    if args.drafts < 1 or args.block_size < 1 or args.repeats < 1 or args.calls < 1:
        sys.exit("--drafts, --block-size, --repeats and --calls must be >= 1")
    cases = [
        Case(shape, kind, r, c, 1 if kind == "decode" else args.drafts + 1)
        for shape in args.shapes
        for kind in ("decode", "verify")
        for c in args.contexts
        for r in args.requests
    ]
    rows = []
    for case in tqdm(cases, desc="attention cases"):
        rows.append(run_case(case, args))
        torch.cuda.empty_cache()
    print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(args.device)
    report = {
        "device": device_name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "block_size": args.block_size,
        "drafts": args.drafts,
        "repeats": args.repeats,
        "calls": args.calls,
        "rows": rows,
    }
    (args.out / "attention_bench.json").write_text(json.dumps(report, indent=2))
    plot(rows, args.out / "attention_bench.png", device_name)
    print(f"wrote {args.out / 'attention_bench.json'} and {args.out / 'attention_bench.png'}")
    return 0


def run_case(case: Case, args: argparse.Namespace) -> dict:
    import torch

    from dspark.engine.kv_cache import BlockTable, PagedKVCache
    from dspark.models.config import ModelConfig
    from dspark.models.llama import paged_attention as eager_attention
    from dspark.ops import triton_attention as ops

    heads, kv_heads, head_dim = SHAPES[case.shape]
    config = ModelConfig(
        vocab_size=8,
        hidden_size=heads * head_dim,
        intermediate_size=8,
        num_layers=1,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
    )
    bs, device = args.block_size, torch.device(args.device)
    num_reqs, total = case.num_requests, case.context + case.num_query
    per_request = -(-total // bs)
    pool = PagedKVCache(config, num_reqs * per_request + 1, bs, torch.bfloat16, device)
    for cache in pool.layers[0]:
        cache.normal_()
    tables = [BlockTable() for _ in range(num_reqs)]
    for grown in range(1, per_request + 1):  # one block each in turn: blocks interleave
        for table in tables:
            pool.reserve(table, min(total, grown * bs))
    num_cached = np.full(num_reqs, case.context)
    num_query = np.full(num_reqs, case.num_query)
    batch = pool.attention_batch(tables, num_cached, num_query)
    layout = ops.paged_layout([t.blocks for t in tables], num_cached, num_query, bs, device=device)
    num_tokens = int(num_query.sum())
    q = torch.randn(num_tokens, heads, head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(num_tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    k_cache, v_cache = pool.layers[0]

    def eager() -> torch.Tensor:
        return eager_attention(q, k, v, batch, k_cache, v_cache)

    def kernel() -> torch.Tensor:
        return ops.paged_attention(q, k, v, batch.write_index, layout, k_cache, v_cache)

    max_diff = (eager().float() - kernel().float()).abs().max().item()
    row = {**asdict(case), "max_abs_diff": max_diff}
    row["num_splits"] = ops.splits_for(layout, heads, kv_heads, device)
    # Key and value bytes each path must read at least: every cached row once.
    row["kv_bytes"] = num_reqs * total * kv_heads * head_dim * 2 * k_cache.element_size()
    for name, fn in (("eager", eager), ("triton", kernel)):
        row[f"{name}_us"] = time_us(fn, args.repeats, args.calls)
        row[f"{name}_graph_us"] = None if args.no_graphs else graph_us(fn, args)
    return row


def time_us(fn: Callable[[], object], repeats: int, calls: int) -> float:
    """Median µs per call from CUDA events, after a warm-up."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(per_call)


def graph_us(fn: Callable[[], object], args: argparse.Namespace) -> float | None:
    """``time_us`` of a CUDA graph of ``args.calls`` calls, per call; None if capture
    fails (the failure is printed: the engine would have to run such a step eagerly)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(args.calls):
                fn()
    except RuntimeError as error:
        print(f"capture failed: {error}", file=sys.stderr)
        return None
    return time_us(graph.replay, args.repeats, 1) / args.calls


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'shape':8} {'kind':6} {'reqs':>5} {'ctx':>5} {'eager µs':>9} {'triton µs':>9} "
        f"{'graph e':>9} {'graph t':>9} {'speed-up':>8} {'t GB/s':>7} {'splits':>6} {'max diff':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        eager = r["eager_graph_us"] or r["eager_us"]
        kernel = r["triton_graph_us"] or r["triton_us"]
        print(
            f"{r['shape']:8} {r['kind']:6} {r['num_requests']:5d} {r['context']:5d} "
            f"{r['eager_us']:9.1f} {r['triton_us']:9.1f} {fmt(r['eager_graph_us'])} "
            f"{fmt(r['triton_graph_us'])} {eager / kernel:7.2f}x "
            f"{r['kv_bytes'] / kernel / 1e3:7.0f} {r['num_splits']:6d} {r['max_abs_diff']:9.2e}"
        )
    print("speed-up and GB/s from graph replay where captured (the kernels' own time)")


def fmt(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:9.1f}"


def plot(rows: list[dict], path: Path, device_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dspark.figures import save_figure

    panels = sorted({(r["shape"], r["kind"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (shape, kind) in zip(axes[0], panels, strict=True):
        for i, context in enumerate(sorted({r["context"] for r in rows})):
            style = ("-", "--", ":", "-.")[i % 4]
            sel = [
                r for r in rows if (r["shape"], r["kind"], r["context"]) == (shape, kind, context)
            ]
            reqs = [r["num_requests"] for r in sel]
            for name, color in (("eager", "tab:gray"), ("triton", "tab:blue")):
                times = [r[f"{name}_graph_us"] or r[f"{name}_us"] for r in sel]
                ax.plot(reqs, times, style, color=color, marker="o", label=f"{name}, ctx {context}")
        ax.set(xscale="log", yscale="log", xlabel="requests", title=f"{shape} {kind}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("µs per layer (graph replay)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"Paged attention, eager gather + SDPA vs Triton ({device_name})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
