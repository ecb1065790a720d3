"""``dspark bench-scheduler``: how long the per-step scheduling decisions take.

Times, per call and at several batch sizes (K = 7), the budget (``choose_draft_budget``),
a plain port of the seed's host-side budget on the same inputs, the allocation
(``allocate_drafts``), the ``AdaptiveVerifier`` plan alone (``verifier_plan``), the
drafting-depth decision taken before the drafter runs (``drafting_depth``:
``drafting_pays``, every depth priced), the verifier's engine path (``verifier_step``:
record + plan + allocate), and the torch allocation (CPU, or CUDA with events). Inputs
are realistic: per-position acceptance from the published DSpark figures with
per-request spread, and seed-style cost tables built from the measured H200 surface at
8k context. Prints a table and writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dspark.bench.provenance import source_digest
from dspark.bench.seed_port import SeedRequestTable, seed_budget
from dspark.figures import save_figure
from dspark.resources import H200_COST_SURFACE, PUBLISHED_ACCEPTANCE, load_json
from dspark.scheduling import (
    AdaptiveVerifier,
    CostTables,
    allocate_drafts,
    build_cost_tables,
    choose_draft_budget,
)
from dspark.scheduling._checks import as_confidences, as_draft_counts, count_total
from dspark.scheduling.budget import best_budget, search_sorts
from dspark.scheduling.gate import ALONE_WINDOW, ThroughputGate
from dspark.scheduling.survival import survival_by_position, threshold_partitions

NUM_POSITIONS = 7
PROFILE_CONTEXT = 8192
GRAPH_LIMIT = 512
MAX_NUM_TOKENS = 16384


@dataclass(frozen=True, slots=True)
class BenchConfig:
    sizes: tuple[int, ...] = (1, 16, 64, 256, 1024)
    num_inputs: int = 32
    repeats: int = 15
    seed: int = 0
    torch_device: str | None = "cpu"
    out_dir: Path = Path("results")
    breakdown: bool = False

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"sizes must be positive request counts, got {self.sizes}")
        if self.num_inputs < 1 or self.repeats < 1:
            raise ValueError("num_inputs and repeats must be at least 1")


@dataclass(slots=True)
class Batch:
    """One scheduling input: a decode batch of ``num_reqs`` requests with K drafts each."""

    stale: np.ndarray  # [num_reqs, K] float32
    fresh: np.ndarray  # [num_reqs, K] float32
    num_drafts: np.ndarray  # [num_reqs]
    num_non_draft: np.ndarray  # [num_reqs]
    seed_table: SeedRequestTable
    seed_tokens: dict[str, int]
    seed_drafts: dict[str, list[int]]


@dataclass(slots=True)
class SizeResult:
    num_reqs: int
    median_budget: float
    us: dict[str, float] = field(default_factory=dict)
    budget_mismatches: int = 0
    ranking: str = ""  # how the budget / the allocation's threshold ranked the slots


def h200_seed_tables(max_num_reqs: int) -> CostTables:
    """The seed's 1-D tables from the H200 surface: profiled at one context length."""
    surface = load_json(H200_COST_SURFACE)
    verify: dict[int, list[float]] = {}
    for row in surface["target"]:
        if row["context_len"] == PROFILE_CONTEXT:
            verify.setdefault(row["num_reqs"] * row["query_len"], []).append(row["ms"])
    draft = [
        (r["num_reqs"], r["ms"]) for r in surface["draft"] if r["context_len"] == PROFILE_CONTEXT
    ]
    verify_curve = [(n, float(np.median(ms))) for n, ms in sorted(verify.items())]
    return build_cost_tables(draft, verify_curve, max_num_reqs, MAX_NUM_TOKENS, GRAPH_LIMIT)


def realistic_confidences(rng: np.random.Generator, num_reqs: int) -> np.ndarray:
    """``[num_reqs, K]`` confidences around the published DSpark per-position rates."""
    published = load_json(PUBLISHED_ACCEPTANCE)["conditional_acceptance_per_position"]
    domains = np.array([published[d]["dspark"] for d in ("chat", "code", "math")])
    domain = rng.integers(0, len(domains), num_reqs)
    ease = rng.normal(0.0, 0.08, (num_reqs, 1))  # some requests are easier than others
    noise = rng.normal(0.0, 0.05, (num_reqs, NUM_POSITIONS))
    return np.clip(domains[domain] + ease + noise, 0.0, 1.0).astype(np.float32)


def make_batch(rng: np.random.Generator, num_reqs: int) -> Batch:
    stale = realistic_confidences(rng, num_reqs)
    ids = [f"req-{i}" for i in range(num_reqs)]
    table = SeedRequestTable(
        req_id_to_index={r: i for i, r in enumerate(ids)},
        num_computed_tokens=np.full(num_reqs, 100),
        prefill_len=np.full(num_reqs, 50),
        stale_confidences=stale,
    )
    return Batch(
        stale=stale,
        fresh=realistic_confidences(rng, num_reqs),
        num_drafts=np.full(num_reqs, NUM_POSITIONS),
        num_non_draft=np.ones(num_reqs, dtype=np.int64),
        seed_table=table,
        seed_tokens={r: 1 + NUM_POSITIONS for r in ids},
        seed_drafts={r: [0] * NUM_POSITIONS for r in ids},
    )


def median_us_per_call(
    cases: dict[str, Callable[[Batch], object]], batches: Sequence[Batch], repeats: int
) -> dict[str, float]:
    """Median over repeats of the mean µs per call over all input batches, per case.

    The cases take turns within every repeat, so a change in the machine's speed during
    the run (frequent on shared machines) affects them alike and their ratios stay fair.
    """
    for call in cases.values():
        for batch in batches[:4]:
            call(batch)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, call in cases.items():
            start = time.perf_counter_ns()
            for batch in batches:
                call(batch)
            samples[name].append((time.perf_counter_ns() - start) / len(batches) / 1e3)
    return {name: statistics.median(times) for name, times in samples.items()}


def bench_size(config: BenchConfig, num_reqs: int, tables: CostTables) -> SizeResult:
    rng = np.random.default_rng([config.seed, num_reqs])
    batches = [make_batch(rng, num_reqs) for _ in range(config.num_inputs)]
    logits = num_reqs * (NUM_POSITIONS + 1)

    def ours(b: Batch) -> int:
        return choose_draft_budget(b.stale, b.num_drafts, b.num_non_draft, num_reqs, tables, logits)

    def seed(b: Batch) -> int:
        return seed_budget(
            b.seed_table, b.seed_tokens, b.seed_drafts, tables.draft_ms, tables.verify_ms, logits
        )

    budgets = [ours(b) for b in batches]
    result = SizeResult(num_reqs, float(np.median(budgets)))
    result.budget_mismatches = sum(seed(b) != ours(b) for b in batches)
    slots = np.arange(num_reqs)
    verifier = AdaptiveVerifier(num_reqs, NUM_POSITIONS, tables, logits)
    for slot in slots:
        verifier.add_request(slot)

    def engine_step(b: Batch) -> np.ndarray:
        verifier.record(slots, b.fresh)
        budget = verifier.plan(slots, b.num_drafts, b.num_non_draft, num_reqs)
        return verifier.allocate(slots, b.num_drafts, budget)

    def plan_only(b: Batch) -> int:
        return verifier.plan(slots, b.num_drafts, b.num_non_draft, num_reqs)

    def drafting_depth(b: Batch) -> int:
        return verifier.drafting_pays(slots, b.num_drafts, b.num_non_draft, num_reqs)

    # The allocation places the budget the plan chose (when it admits every draft, the
    # allocation is skipped in the engine, so time the largest smaller budget instead).
    allocation_budget = {
        id(b): min(budget, int(b.num_drafts.sum()) - 1)
        for b, budget in zip(batches, budgets, strict=True)
    }
    cases: dict[str, Callable[[Batch], object]] = {
        "budget": ours,
        "seed_budget": seed,
        "allocate": lambda b: allocate_drafts(b.fresh, b.num_drafts, allocation_budget[id(b)]),
        "verifier_plan": plan_only,
        "drafting_depth": drafting_depth,
        "verifier_step": engine_step,
        "gate_step": _gate_step(num_reqs, config.seed),
    }
    if config.breakdown:
        cases |= _budget_parts(batches, tables, num_reqs)
    if config.torch_device and config.torch_device != "cuda":
        cases[f"torch_allocate_{config.torch_device}"] = _torch_allocate_cpu(
            config.torch_device, batches, allocation_budget
        )
    result.us = median_us_per_call(cases, batches, config.repeats)
    num_slots = num_reqs * NUM_POSITIONS
    result.ranking = (
        f"{'sort' if search_sorts(num_slots) else 'bins'}/"
        f"{'partition' if threshold_partitions(num_slots) else 'bins'}"
    )
    if config.torch_device == "cuda":
        result.us |= _torch_allocate_cuda_us(batches, allocation_budget, config.repeats)
    return result


def _gate_step(num_reqs: int, seed: int) -> Callable[[Batch], object]:
    """The throughput gate's decision and its record for one step of ``num_reqs``
    requests, as the engine takes them on every step the cost model drafts. The gate's
    windows are full (a batch of one keeps ``ALONE_WINDOW`` steps an arm, larger ones the
    gate's window) of drafted steps whose walls vary as drafting depths' do (some above
    twice the shortest, so the outlier cap applies) and of steadier undrafted ones."""
    gate = ThroughputGate()
    rng = np.random.default_rng([seed, num_reqs, 1])
    count = 4096
    tokens = rng.integers(num_reqs, num_reqs * (NUM_POSITIONS + 1) + 1, count).tolist()
    drafted_walls = rng.uniform(3.5, 8.5, count).tolist()
    undrafted_walls = rng.uniform(3.2, 3.5, count).tolist()
    index = [0]

    def step(_batch: Batch | None) -> bool:
        i = index[0] = (index[0] + 1) % count
        drafted = gate.should_draft(num_reqs)
        if drafted:
            gate.record(num_reqs, True, tokens[i], drafted_walls[i])
        else:
            gate.record(num_reqs, False, num_reqs, undrafted_walls[i])
        return drafted

    for i in range(ALONE_WINDOW):  # both arms' windows full
        gate.record(num_reqs, True, tokens[i], drafted_walls[i])
        gate.record(num_reqs, False, num_reqs, undrafted_walls[i])
    step.gate = gate  # for tests
    return step


def _budget_parts(
    batches: Sequence[Batch], tables: CostTables, num_reqs: int
) -> dict[str, Callable[[Batch], object]]:
    """The pieces of one ``choose_draft_budget`` call, timed separately."""
    cap = num_reqs * NUM_POSITIONS
    costs = tables.step_costs_ms(num_reqs, num_reqs, cap)
    scores = {id(b): survival_by_position(b.stale, b.num_drafts, True).ravel() for b in batches}

    def checks(b: Batch) -> object:
        as_confidences("c", b.stale)
        as_draft_counts("d", b.num_drafts, num_reqs, NUM_POSITIONS)
        return count_total("t", b.num_non_draft, num_reqs)

    return {
        "part_checks": checks,
        "part_survival": lambda b: survival_by_position(b.stale, b.num_drafts, True),
        "part_costs": lambda b: tables.step_costs_ms(num_reqs, num_reqs, cap),
        "part_search": lambda b: best_budget(scores[id(b)], cap, num_reqs, costs),
    }


def _torch_inputs(device: str, batches: Sequence[Batch], budgets: dict[int, int]) -> dict:
    import torch

    return {
        id(b): (
            torch.from_numpy(b.fresh).to(device),
            torch.from_numpy(b.num_drafts).to(device),
            budgets[id(b)],
        )
        for b in batches
    }


def _torch_allocate_cpu(
    device: str, batches: Sequence[Batch], budgets: dict[int, int]
) -> Callable[[Batch], object]:
    from dspark.ops import allocate_drafts_torch

    inputs = _torch_inputs(device, batches, budgets)
    return lambda b: allocate_drafts_torch(*inputs[id(b)])


def _torch_allocate_cuda_us(
    batches: Sequence[Batch], budgets: dict[int, int], repeats: int
) -> dict[str, float]:
    """µs per call on the GPU from CUDA events, after warm-up: issued eagerly from Python
    (bounded by kernel launches), and replayed from a captured CUDA graph (the kernels'
    own time; capture also proves the op never synchronises with the host)."""
    import torch

    from dspark.ops import allocate_drafts_torch

    inputs = list(_torch_inputs("cuda", batches, budgets).values())

    def time_us(run_all: Callable[[], object], calls: int) -> float:
        run_all()
        torch.cuda.synchronize()
        per_call = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run_all()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) * 1e3 / calls)
        return statistics.median(per_call)

    eager = time_us(lambda: [allocate_drafts_torch(*args) for args in inputs], len(inputs))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        allocate_drafts_torch(*inputs[0])  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in inputs:
            allocate_drafts_torch(*args)
    replay = time_us(graph.replay, len(inputs))
    return {"torch_allocate_cuda": eager, "torch_allocate_cuda_graph": replay}


def run(config: BenchConfig) -> list[SizeResult]:
    tables = h200_seed_tables(max(config.sizes))
    return [
        bench_size(config, n, tables)
        for n in tqdm(config.sizes, desc="bench-scheduler", unit="size")
    ]


def format_table(results: Sequence[SizeResult]) -> str:
    names = list(results[0].us)
    header = [
        "num_reqs",
        "budget b*",
        *[f"{n} µs" for n in names],
        "seed/ours",
        "mismatch",
        "ranking",
    ]
    rows = [
        [
            str(r.num_reqs),
            f"{r.median_budget:.0f}",
            *[f"{r.us[n]:.1f}" for n in names],
            f"{r.us['seed_budget'] / r.us['budget']:.1f}x",
            str(r.budget_mismatches),
            r.ranking,
        ]
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def save(results: Sequence[SizeResult], config: BenchConfig) -> tuple[Path, Path]:
    config.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = config.out_dir / "bench_scheduler.json"
    payload = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
        },
        "source_digest": source_digest(),  # the code that ran (dspark.bench.provenance)
        "config": {**asdict(config), "out_dir": str(config.out_dir)},
        "num_positions": NUM_POSITIONS,
        "results": [asdict(r) for r in results],
    }
    json_path.write_text(json.dumps(payload, indent=2))
    png_path = config.out_dir / "bench_scheduler.png"
    _plot(results, png_path)
    return json_path, png_path


def _plot(results: Sequence[SizeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r.num_reqs for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in results[0].us:
        ax.plot(sizes, [r.us[name] for r in results], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_yscale("log")
    ax.set_xlabel(f"requests in the batch (K = {NUM_POSITIONS})")
    ax.set_ylabel("median µs per call")
    ax.set_title("Per-step scheduling cost")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    defaults = BenchConfig()
    parser.add_argument("--sizes", type=int, nargs="+", default=list(defaults.sizes))
    parser.add_argument(
        "--num-inputs", type=int, default=defaults.num_inputs, help="random batches per size"
    )
    parser.add_argument(
        "--repeats", type=int, default=defaults.repeats, help="timed passes; the median is reported"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--torch-device",
        default=defaults.torch_device,
        help="device for the torch allocation (cpu, cuda); 'none' skips it",
    )
    parser.add_argument("--out-dir", type=Path, default=defaults.out_dir)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the parts of a budget call (checks, survival, costs, search)",
    )


def main(args: argparse.Namespace) -> None:
    device = None if args.torch_device in (None, "none") else args.torch_device
    if device is not None:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: skipping the torch allocation")
            device = None
    config = BenchConfig(
        tuple(args.sizes),
        args.num_inputs,
        args.repeats,
        args.seed,
        device,
        args.out_dir,
        args.breakdown,
    )
    results = run(config)
    print(format_table(results))
    json_path, png_path = save(results, config)
    print(f"wrote {json_path} and {png_path}")
