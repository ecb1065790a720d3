"""``dspark simulate``: every verification policy side by side, over load and context.

For each domain, context length and concurrency, one closed-loop run per policy (no
speculation, fixed K = 1..7, the seed's adaptive policy, ours, the ideal-information
reference), all facing the same requests and coin flips. Prints a summary table, writes
the full metrics as JSON and text, and plots throughput against concurrency and against
per-user speed.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from dspark.sim.acceptance import DOMAINS, AcceptanceModel
from dspark.sim.policies import Adaptive, FixedK, IdealInformation, NoSpeculation, Policy
from dspark.sim.simulator import RunResult, SimConfig, simulate
from dspark.sim.surface import CostSurface, SurfaceCostModel, seed_tables_from_surface
from dspark.sim.workload import Workload

NUM_POSITIONS = 7
POLICY_NAMES = (
    "no-spec",
    *(f"fixed-{k}" for k in range(1, NUM_POSITIONS + 1)),
    "seed",
    "ours",
    "ideal",
)
CALIBRATION_LEVELS = ((0.0, 0.0), (0.0, 0.5), (0.5, 0.0), (0.5, 0.5), (-0.5, 0.5))  # (bias, noise)


@dataclass(frozen=True)
class SweepConfig:
    domains: tuple[str, ...] = DOMAINS
    contexts: tuple[int, ...] = (1024, 8192)
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    policies: tuple[str, ...] = POLICY_NAMES
    num_steps: int = 500
    warmup_steps: int = 100
    seed: int = 0
    surface: str | None = None  # path of a cost-surface JSON; None: the shipped H200 one
    sharegpt: bool = False
    output_len: tuple[int, int] = (128, 512)
    conf_bias: float = 0.0
    conf_noise: float = 0.0
    calibration_study: bool = True
    jobs: int = 2
    out_dir: Path = Path("results/sim")

    def __post_init__(self) -> None:
        unknown = set(self.policies) - set(POLICY_NAMES)
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; known: {list(POLICY_NAMES)}")
        unknown = set(self.domains) - set(DOMAINS)
        if unknown:
            raise ValueError(f"unknown domains {sorted(unknown)}; known: {list(DOMAINS)}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be positive, got {self.concurrency}")


@dataclass(frozen=True)
class Task:
    domain: str
    context: int
    concurrency: int
    conf_bias: float
    conf_noise: float
    policies: tuple[str, ...]


@dataclass
class SweepResult:
    config: SweepConfig
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0


def make_policy(name: str, concurrency: int, truth: SurfaceCostModel, seed_tables) -> Policy:
    if name == "no-spec":
        return NoSpeculation()
    if name.startswith("fixed-"):
        return FixedK(int(name.split("-")[1]))
    if name == "seed":
        return Adaptive("seed", seed_tables, NUM_POSITIONS, concurrency)
    if name == "ours":
        return Adaptive("ours", truth, NUM_POSITIONS, concurrency)
    if name == "ideal":
        return IdealInformation(truth, NUM_POSITIONS)
    raise ValueError(f"unknown policy {name!r}")


def run_task(config: SweepConfig, task: Task) -> list[RunResult]:
    surface = CostSurface.load(config.surface)
    truth = SurfaceCostModel(surface)
    truth_without_draft = SurfaceCostModel(surface, include_draft=False)
    seed_tables = seed_tables_from_surface(surface, max_num_seqs=max(256, task.concurrency))
    workload = Workload(
        domains=(task.domain,),
        context_len=task.context,
        output_len=config.output_len,
        sharegpt=config.sharegpt,
    )
    acceptance = AcceptanceModel(conf_bias=task.conf_bias, conf_noise=task.conf_noise)
    sim = SimConfig(task.concurrency, config.num_steps, config.warmup_steps, config.seed)
    runs = []
    for name in task.policies:
        policy = make_policy(name, task.concurrency, truth, seed_tables)
        result = simulate(policy, sim, workload, acceptance, truth, truth_without_draft)
        result.labels = {
            "domain": task.domain,
            "context": task.context,
            "conf_bias": task.conf_bias,
            "conf_noise": task.conf_noise,
            "surface": surface.name,
            "workload": "sharegpt" if config.sharegpt else "parametric",
        }
        runs.append(result)
    return runs


def _tasks(config: SweepConfig) -> list[Task]:
    tasks = [
        Task(d, c, n, config.conf_bias, config.conf_noise, config.policies)
        for d in config.domains
        for c in config.contexts
        for n in config.concurrency
    ]
    if config.calibration_study and "ours" in config.policies:
        for bias, noise in CALIBRATION_LEVELS:
            if (bias, noise) == (config.conf_bias, config.conf_noise):
                continue
            tasks += [
                Task(config.domains[0], c, n, bias, noise, ("ours",))
                for c in config.contexts
                for n in config.concurrency
            ]
    # Big batches first, so the pool is not left waiting on one slow task at the end.
    return sorted(tasks, key=lambda t: -t.concurrency * len(t.policies))


def _run_task_star(args: tuple[SweepConfig, Task]) -> list[RunResult]:
    return run_task(*args)


def run_sweep(config: SweepConfig) -> SweepResult:
    start = time.perf_counter()
    tasks = _tasks(config)
    runs: list[RunResult] = []
    progress = tqdm(total=len(tasks), desc="simulate", unit="point")
    if config.jobs > 1:
        with multiprocessing.get_context("fork").Pool(config.jobs) as pool:
            for result in pool.imap_unordered(_run_task_star, [(config, t) for t in tasks]):
                runs += result
                progress.update()
    else:
        for task in tasks:
            runs += run_task(config, task)
            progress.update()
    progress.close()
    return SweepResult(config, sorted(runs, key=_run_order), time.perf_counter() - start)


def _run_order(run: RunResult) -> tuple:
    labels = run.labels
    return (
        labels["domain"],
        labels["context"],
        labels["conf_bias"],
        labels["conf_noise"],
        run.concurrency,
        POLICY_NAMES.index(run.policy),
    )
