"""``dspark roofline``: where a step's time goes, next to what the hardware allows.

For a decode step (one token per request) and a verify step (K + 1 tokens per request)
at each concurrency, every request holding ``--context`` cached tokens:

- the step: the target's forward and its LM head over every row, timed as the engine's
  start-up profile times a step (CUDA graphs where the engine would replay them), each
  shape as itself;
- the engine's whole decode step (``LLMEngine.step``: scheduling, sampling and the
  bookkeeping around the forward) over real requests of the same shape;
- with ``--drafter``, the drafter's proposal of K tokens for the verify step's requests
  (what a speculative step adds to its verify forward);
- the bound: the bytes a step must move (every weight once, every cached key and value of
  the batch read, the new ones written) over the bandwidth of a device-to-device copy, and
  its FLOPs over the throughput of a large GEMM, both measured on this device in this run.
  No step beats the larger of the two; the fraction reported is bound / measured;
- with ``--trace``, the step's device time by kernel class (torch.profiler; on a CPU
  each op's own time), and the rest of the step: host work and gaps between kernels.

Prints a table, writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.bench.provenance import source_digest
from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.graphs import exact_shapes
from dspark.engine.profiling import dummy_step
from dspark.engine.sampling import SamplingParams
from dspark.models.config import ModelConfig
from dspark.ops.linear import cpu_name

KERNEL_CLASSES = (
    ("attention", ("attention", "attn", "flash", "fmha", "sdpa")),
    # cuBLAS names its products gemm, gemv, nvjet (bf16 on Hopper) or dot; a split-K
    # product ends in a reduction kernel of its own.
    ("gemm", ("gemm", "gemv", "nvjet", "dot_kernel", "splitk", "reduce_1block", "matmul")),
    ("gemm", ("cutlass", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "linear", "xmma")),
    ("gemm", ("sm90_", "sm80_", "ampere_")),
    ("sampling", ("argmax", "topk", "multinomial", "sort")),
    ("copies", ("memcpy", "memset", "copy", "index", "gather", "scatter", "aten::cat")),
    ("copies", ("catarray", "reorder", "fill")),
    ("norm, rotary, activations", ("norm", "elementwise", "silu", "aten::mul", "aten::add")),
    ("norm, rotary, activations", ("aten::neg", "reduce", "aten::cos", "aten::sin")),
)
"""Kernel (or CPU op) names by class: the first class one of whose words a name contains,
case aside; anything else is "other"."""


def kernel_class(name: str) -> str:
    lowered = name.lower()
    for cls, words in KERNEL_CLASSES:
        if any(word in lowered for word in words):
            return cls
    return "other"


@dataclass(frozen=True)
class StepWork:
    """What one step must do whatever the engine: bytes moved and FLOPs."""

    weight_bytes: int  # every weight a forward multiplies, and the LM head, read once
    kv_read_bytes: int  # the cached keys and values of every request
    kv_write_bytes: int  # the keys and values of the step's own tokens
    flops: float  # products (2 per multiply-add) of the weights and of attention

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    def bound_ms(self, bandwidth: float, peak: float) -> float:
        """The step's lower bound (ms) at ``bandwidth`` bytes/s and ``peak`` FLOP/s."""
        return 1e3 * max(self.bytes / bandwidth, self.flops / peak)


def step_work(
    config: ModelConfig,
    weight_params: int,
    element_bytes: int,
    num_reqs: int,
    query: int,
    context: int,
) -> StepWork:
    """The work of a step of ``num_reqs`` requests of ``query`` new tokens each over
    ``context`` cached ones, for a model of ``weight_params`` multiplied weights. Query
    token ``i`` (from 0) attends to ``context + i + 1`` keys."""
    tokens = num_reqs * query
    per_token_kv = config.num_layers * 2 * config.num_kv_heads * config.head_dim * element_bytes
    keys_attended = num_reqs * (query * context + query * (query + 1) // 2)
    attention = 4 * config.num_layers * config.num_heads * config.head_dim * keys_attended
    return StepWork(
        weight_bytes=weight_params * element_bytes,
        kv_read_bytes=num_reqs * context * per_token_kv,
        kv_write_bytes=tokens * per_token_kv,
        flops=2.0 * weight_params * tokens + attention,
    )


def _clock(device: torch.device) -> float:
    """Seconds, once the device has finished what was queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int) -> float:
    """Bytes read plus bytes written per second by the fastest of ``repeats`` copies of
    ``nbytes`` from one buffer of the device into another."""
    source = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(repeats):
        start = _clock(device)
        target.copy_(source)
        best = min(best, _clock(device) - start)
    return 2 * source.numel() * 4 / best


def gemm_peak(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """FLOP/s of the fastest of ``repeats`` ``n x n @ n x n`` products in ``dtype``."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = _clock(device)
        a @ b
        best = min(best, _clock(device) - start)
    return 2.0 * n**3 / best


@dataclass
class RooflineRow:
    kind: str  # "decode" or "verify"
    num_reqs: int
    tokens: int
    context: int
    step_ms: float  # median of the step (forward, LM head over every row)
    step_ms_runs: list[float]
    bound_ms: float
    bytes_ms: float  # the bytes over the measured bandwidth
    flops_ms: float  # the FLOPs over the measured GEMM peak
    fraction: float  # bound_ms / step_ms
    engine_ms: float | None = None  # median of LLMEngine.step over such requests (decode)
    engine_fraction: float | None = None
    drafter_ms: float | None = None  # --drafter: median of its K-deep proposal (verify)
    # --trace: ms per step by kernel class, and the rest of step_ms (host work, gaps).
    device_ms: dict[str, float] = field(default_factory=dict)
    host_ms: float | None = None


class StepTimer:
    """Dummy steps of a given shape through an engine's model runner, as the start-up
    profile runs them (``dummy_step``: the forward and the LM head over every row), each
    shape replayed as itself where the engine replays CUDA graphs."""

    def __init__(self, engine: LLMEngine, seed: int = 0) -> None:
        self.runner = engine.runner
        self.runners = engine.padded_runners()
        self.rng = np.random.default_rng(seed)

    def step(self, num_reqs: int, query: int, context: int, drafter=None, depths=()):
        """(forward ms, drafter ms by depth) of one dummy step."""
        queries = np.full(num_reqs, query)
        return dummy_step(self.runner, drafter, queries, context, self.rng, list(depths))

    def time(self, num_reqs: int, query: int, context: int, repeats: int) -> list[float]:
        with exact_shapes(self.runners):
            for _ in range(2):  # captures the shape's graph, then a replay untimed
                self.step(num_reqs, query, context)
            return [self.step(num_reqs, query, context)[0] for _ in range(repeats)]

    def drafter_ms(
        self, drafter, num_reqs: int, num_drafts: int, context: int, repeats: int
    ) -> list[float]:
        """The drafter's ``num_drafts``-deep proposal (ms) for ``num_reqs`` requests of
        ``context`` tokens, after a verify step of theirs."""
        depths, query = [num_drafts], num_drafts + 1
        with exact_shapes(self.runners):
            self.step(num_reqs, query, context, drafter, depths)  # warm
            return [
                self.step(num_reqs, query, context, drafter, depths)[1][num_drafts]
                for _ in range(repeats)
            ]

    def trace(self, num_reqs: int, query: int, context: int, steps: int) -> dict[str, float]:
        """Ms per step by kernel class from the profiler over ``steps`` steps (on a CPU,
        each op's own time)."""
        from torch.profiler import ProfilerActivity, profile

        device = self.runner.device
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with exact_shapes(self.runners):
            self.step(num_reqs, query, context)
            with profile(activities=activities) as prof:
                for _ in range(steps):
                    self.step(num_reqs, query, context)
        by_class: dict[str, float] = {}
        for event in prof.key_averages():
            if device.type == "cuda":
                us = event.self_device_time_total if event.device_type.name == "CUDA" else 0
            else:
                us = event.self_cpu_time_total
            if us > 0:
                cls = kernel_class(event.key)
                by_class[cls] = by_class.get(cls, 0.0) + us / 1e3 / steps
        return dict(sorted(by_class.items()))


def engine_decode_ms(
    engine: LLMEngine, num_reqs: int, context: int, repeats: int, max_tokens: int
) -> list[float]:
    """``LLMEngine.step`` (ms) while ``num_reqs`` requests with about ``context`` tokens
    each decode (random prompts of ``context`` tokens, greedy, no end of sequence).
    ``max_tokens`` must outlast the prefill's steps (the first requests admitted decode
    while the others prefill) and the timed ones: every timed step decodes all of them."""
    rng = np.random.default_rng(1)
    vocab = engine.runner.loaded.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompts = rng.integers(0, vocab, (num_reqs, context)).tolist()
    requests = []
    clock = engine.runner.clock  # ms, once the device has finished
    try:
        requests += [engine.add_request(p, params) for p in prompts]
        with exact_shapes(engine.padded_runners()):  # every timed shape captured as itself
            while any(r.num_computed < context for r in requests):  # prefill (chunked)
                engine.step()
            for _ in range(2):  # the decode shape captured, then replayed once
                engine.step()
            times = []
            for _ in range(repeats):
                start = clock()
                engine.step()
                times.append(clock() - start)
        if any(r.is_finished for r in requests):
            raise RuntimeError(
                f"a request finished before the timed steps ended: max_tokens {max_tokens} "
                "does not cover the prefill and the repeats"
            )
        return times
    finally:
        for request in requests:
            engine.abort(request.request_id)
            engine.requests.pop(request.request_id, None)


def decode_room(num_reqs: int, context: int, repeats: int, step_tokens: int) -> int:
    """Tokens to generate so that ``num_reqs`` requests of ``context`` prompt tokens are
    all still decoding after their chunked prefill (``step_tokens`` a step, the requests
    admitted first decoding a token a step meanwhile), two untimed steps and ``repeats``."""
    prefill_steps = math.ceil(num_reqs * (context + 1) / max(step_tokens - num_reqs, 1))
    return prefill_steps + repeats + 8


def measure(
    engine: LLMEngine,
    concurrency: list[int],
    context: int,
    num_drafts: int,
    repeats: int,
    bandwidth: float,
    peak: float,
    trace: bool = False,
    progress: bool = True,
    drafter_engine: LLMEngine | None = None,
) -> list[RooflineRow]:
    """The rows of ``dspark roofline`` for ``engine`` (no speculation); ``drafter_engine``:
    an engine whose drafter's proposals are timed for the verify steps."""
    loaded = engine.runner.loaded
    weights = loaded.model.linear_weights()
    params = sum(w.numel() for w in weights)
    element = weights[0].element_size()
    timer = StepTimer(engine)
    shapes = [
        (kind, n, q) for n in concurrency for kind, q in (("decode", 1), ("verify", num_drafts + 1))
    ]
    rows = []
    for kind, num_reqs, query in tqdm(shapes, desc="roofline", unit="step", disable=not progress):
        work = step_work(loaded.config, params, element, num_reqs, query, context)
        runs = timer.time(num_reqs, query, context, repeats)
        step_ms = statistics.median(runs)
        bound = work.bound_ms(bandwidth, peak)
        row = RooflineRow(
            kind,
            num_reqs,
            num_reqs * query,
            context,
            step_ms,
            runs,
            bound,
            1e3 * work.bytes / bandwidth,
            1e3 * work.flops / peak,
            bound / step_ms,
        )
        if kind == "verify" and drafter_engine is not None:
            drafts = StepTimer(drafter_engine).drafter_ms(
                drafter_engine.drafter, num_reqs, num_drafts, context, repeats
            )
            row.drafter_ms = statistics.median(drafts)
        if kind == "decode":
            step_tokens = engine.config.max_num_batched_tokens
            room = decode_room(num_reqs, context, repeats, step_tokens)
            runs = engine_decode_ms(engine, num_reqs, context, repeats, room)
            row.engine_ms = statistics.median(runs)
            row.engine_fraction = bound / row.engine_ms
        if trace:  # the rest against the untraced step: the profiler slows the host
            row.device_ms = timer.trace(num_reqs, query, context, repeats)
            row.host_ms = max(step_ms - sum(row.device_ms.values()), 0.0)
        rows.append(row)
    return rows


def print_table(rows: list[RooflineRow]) -> None:
    def cell(value: float | None, width: int) -> str:
        return f"{value:{width}.3f}" if value is not None else f"{'-':>{width}}"

    print(
        f"{'step':7} {'reqs':>5} {'tokens':>6} {'step ms':>8} {'engine ms':>9} "
        f"{'bound ms':>8} {'bytes ms':>8} {'flops ms':>8} {'of bound':>8} {'host ms':>7} "
        f"{'drafter ms':>10}"
    )
    for r in rows:
        print(
            f"{r.kind:7} {r.num_reqs:5d} {r.tokens:6d} {r.step_ms:8.3f} {cell(r.engine_ms, 9)} "
            f"{r.bound_ms:8.3f} {r.bytes_ms:8.3f} {r.flops_ms:8.3f} {r.fraction:8.1%} "
            f"{cell(r.host_ms, 7)} {cell(r.drafter_ms, 10)}"
        )
    classes = sorted({c for r in rows for c in r.device_ms})
    if classes:
        print("\ndevice ms per step by kernel class")
        print(f"{'step':7} {'reqs':>5} " + " ".join(f"{c[:12]:>12}" for c in classes))
        for r in rows:
            cells = " ".join(f"{r.device_ms.get(c, 0.0):12.3f}" for c in classes)
            print(f"{r.kind:7} {r.num_reqs:5d} {cells}")


def plot(rows: list[RooflineRow], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dspark.figures import save_figure

    traced = any(r.device_ms for r in rows)
    fig, axes = plt.subplots(1, 3 if traced else 2, figsize=(15 if traced else 10, 4.2))
    for kind, color in (("decode", "tab:blue"), ("verify", "tab:orange")):
        series = [r for r in rows if r.kind == kind]
        x = [r.num_reqs for r in series]
        axes[0].plot(x, [r.step_ms for r in series], "o-", color=color, label=f"{kind} step")
        axes[0].plot(x, [r.bound_ms for r in series], "--", color=color, label=f"{kind} bound")
        axes[1].plot(x, [r.fraction for r in series], "o-", color=color, label=f"{kind} step")
        if kind == "decode":
            engine = [r.engine_ms for r in series]
            axes[0].plot(x, engine, "s:", color="black", label="decode, whole engine step")
            axes[1].plot(
                x,
                [r.engine_fraction for r in series],
                "s:",
                color="black",
                label="decode, whole engine step",
            )
    for axis in axes[:2]:
        axis.set_xscale("log", base=2)
        axis.set_xlabel("requests in the step")
        axis.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms per step")
    axes[0].set_title(f"step time and its bound ({title})", fontsize=9)
    axes[1].set_ylabel("bound / measured")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("fraction of the bound reached", fontsize=9)
    if traced:
        classes = sorted({c for r in rows for c in r.device_ms})
        labels = [f"{r.kind[0]}{r.num_reqs}" for r in rows]
        bottom = np.zeros(len(rows))
        for cls in classes:
            values = np.array([r.device_ms.get(cls, 0.0) for r in rows])
            axes[2].bar(labels, values, bottom=bottom, label=cls)
            bottom += values
        axes[2].bar(
            labels,
            [r.host_ms or 0.0 for r in rows],
            bottom=bottom,
            label="host, gaps",
            color="lightgrey",
        )
        axes[2].set_ylabel("ms per step")
        axes[2].set_title("where the step's time goes (d: decode, v: verify)", fontsize=9)
        axes[2].tick_params(axis="x", labelrotation=90, labelsize=7)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default=None, help="HF directory or GGUF (default SmolLM2)")
    source.add_argument("--shape", default=None, help="a named shape with random weights")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--context", type=int, default=512, help="cached tokens per request")
    parser.add_argument("--k", type=int, default=4, help="drafts per request in a verify step")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--trace", action="store_true", help="device time by kernel class")
    parser.add_argument(
        "--drafter",
        default=None,
        help="also time this drafter's proposals for the verify steps (dspark: the shipped "
        "one, ngram, or a drafter directory)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="default: bfloat16 on CUDA, float32 on the CPU",
    )
    parser.add_argument(
        "--copy-mib",
        type=int,
        default=None,
        help="size of the bandwidth probe's copy (default 2048 CUDA, 256 CPU)",
    )
    parser.add_argument(
        "--gemm-n",
        type=int,
        default=None,
        help="side of the peak probe's GEMM (default 8192 CUDA, 1024 CPU)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("results/roofline"))


def main(args: argparse.Namespace) -> None:
    from dspark.models.loader import load_model, resolve_dtype
    from dspark.models.shapes import random_model

    for name in ("context", "k", "repeats", "copy_mib", "gemm_n"):
        if (getattr(args, name) or 1) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.concurrency) < 1:
        raise ValueError("--concurrency levels must be at least 1")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = resolve_dtype(args.dtype, args.device)
    if args.shape:
        loaded = random_model(args.shape, dtype, device)
    else:
        loaded = load_model(args.model, dtype, device)
    # The probes first: their buffers are freed before the engines take the memory.
    bandwidth = copy_bandwidth(device, (args.copy_mib or (2048 if cuda else 256)) << 20, 10)
    peak = gemm_peak(device, dtype, args.gemm_n or (8192 if cuda else 1024), 10)
    if cuda:
        torch.cuda.empty_cache()
    largest, query = max(args.concurrency), args.k + 1
    step_tokens = max(2048, largest * query)
    # Room per request for the dummy steps and for the engine's decode steps after its
    # prompt, in whole blocks (each slot owns a run of them on the CPU).
    block = EngineConfig().block_size
    generated = max(query, decode_room(largest, args.context, args.repeats, step_tokens))
    room = block * math.ceil((args.context + generated + 1) / block)
    config = EngineConfig(
        max_num_seqs=largest,
        max_num_batched_tokens=step_tokens,
        kv_cache_tokens=largest * room,
        max_model_len=room,
    )
    engine = LLMEngine(loaded, config)
    drafter_engine = None
    if args.drafter:  # an engine of its own: the one above times steps without drafting
        drafting = replace(config, spec="fixed", num_drafts=args.k, drafter=args.drafter)
        drafter_engine = LLMEngine(loaded, drafting)
    print(
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write), GEMM {peak / 1e12:.2f} "
        f"TFLOP/s ({str(dtype).replace('torch.', '')})"
    )
    rows = measure(
        engine,
        sorted(args.concurrency),
        args.context,
        args.k,
        args.repeats,
        bandwidth,
        peak,
        trace=args.trace,
        drafter_engine=drafter_engine,
    )
    print_table(rows)
    name = (args.shape or Path(str(loaded.path)).name).replace(":", "-")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"roofline_{name}_{device.type}"
    payload = {
        "machine": platform.platform(),
        "device": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "torch": torch.__version__,
        "source_digest": source_digest(),
        "model": str(loaded.path),
        "dtype": str(dtype),
        "copy_bandwidth_bytes_s": bandwidth,
        "gemm_flops_s": peak,
        "args": {k: str(v) for k, v in vars(args).items() if k != "handler"},
        "rows": [asdict(r) for r in rows],
    }
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    print(f"wrote {stem}.json")
    plot(rows, stem.with_suffix(".png"), f"{name}, {device.type}")
    print(f"wrote {stem}.png")
