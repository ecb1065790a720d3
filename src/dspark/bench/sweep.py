"""``dspark bench``: no speculation vs every fixed K vs adaptive verification, across load.

A closed loop per concurrency level: that many requests are in flight at all times (a
finished one is replaced by the next prompt) until the level's requests are done, after
a shorter warm-up loop on other prompts at the same level (graphs captured, adaptive step
costs measured: the steady state of a serving engine). The engine captures CUDA graphs
lazily, the first time a step shape is met, and the warm-up cannot meet every shape (a
step's shape follows its tokens, pieces and longest context; ``--full-warmup`` runs a
warm-up as long as the measured run, which meets nearly all of them). The host time of
captures met while measuring is a start-up cost that an engine capturing ahead pays
before serving, so aggregate tok/s leaves it out (``tok_s``; ``tok_s_wall`` keeps it;
``capture_steps`` and ``capture_s`` say how many steps captured and how long the
captures took); per-request TPOT and per-user tok/s come from the requests' own
timestamps and keep it (a capture delays the requests of its step). Every
configuration runs the same held-out prompts on the same engine settings with the same
drafter (by default the shipped DSpark drafter of the model, else n-gram). Repeats are
interleaved (repeat 1 of every configuration, then repeat 2, ...), the settings of a level
in reverse order on every other repeat, so that drifts of the machine's speed spread over
all of them; tables quote medians, and with several repeats the comparison also quotes
paired ratios (adaptive against a baseline within each repeat, whose machine speed they
shared), whose median is less exposed to drift than the ratio of medians.

``--slice-ms``: time-sliced runs, for machines whose speed wanders within seconds (this
2-core VM; the H200 machines' hosts, whose probes moved 2x within a call in session 40).
Per level every setting's engine is built and warmed once and kept, and the loops run a
quarter of a window unmeasured; each repeat is then a window in which every engine runs
``--window-s`` of its own time in rounds of ``--slice-ms``, round robin (each round takes
every engine to the same target of its own time), its closed loop refilled from the
prompts taken in order (and again from the start) so that it never drains: every setting
is measured over the same stretch of wall time, at steady state. Tokens are those
emitted in the engine's own turns; TPOT uses a request clock that leaves out the other
engines' turns (``LLMEngine.idle_s``). All of a level's engines are alive at once, so
this suits models whose engines fit side by side (not the 8B shape at 256).

Per configuration and level: aggregate tok/s (generated tokens, each counted once, over
the level's wall time less captures), per-user tok/s and TPOT p50/p99 from each request's own
timestamps (first token to finish), acceptance length (tokens per decode round, bonus
included), verified tokens per decode round, and for adaptive the share of wall time
spent choosing the budget and allocating drafts. Writes a table, JSON and PNG plots.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.bench.provenance import source_digest
from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import (
    STEP_FIELDS,
    EngineConfig,
    LLMEngine,
    drafter_rows,
    uses_kv_regions,
)
from dspark.engine.graphs import CAPTURE_AFTER_WASTE
from dspark.engine.heap import CollectorPauses, frozen_heap
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.figures import save_figure
from dspark.models.loader import load_model, resolve_dtype, resolve_model_path
from dspark.models.shapes import SHAPES, random_model


@dataclass(frozen=True)
class Setting:
    spec: str  # none | fixed | adaptive
    k: int  # fixed: the K; adaptive: the most drafts per request
    tag: str = ""  # a variant's name (``--variant``), shown after the label
    # A variant's EngineConfig fields, as (name, value) pairs (``--variant``).
    overrides: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        base = {"none": "no spec", "fixed": f"K={self.k}", "adaptive": f"adaptive≤{self.k}"}
        return base[self.spec] + (f" {self.tag}" if self.tag else "")


def parse_variant(text: str, k: int) -> Setting:
    """``--variant TAG:FIELD=VALUE[,FIELD=VALUE...]``: adaptive verification with those
    ``EngineConfig`` fields changed, run as one more setting of every level (interleaved
    with the others in the same repeats, so it can be compared pairwise)."""
    tag, sep, assignments = text.partition(":")
    tag = tag.strip()
    if not sep or not assignments.strip() or not tag.isidentifier():
        raise ValueError(
            f"--variant must be TAG:FIELD=VALUE[,FIELD=VALUE...] with a tag of letters, "
            f"digits and underscores, got {text!r}"
        )
    types = {f.name: f.type for f in fields(EngineConfig)}
    overrides = []
    for assignment in assignments.split(","):
        name, sep, value = (part.strip() for part in assignment.partition("="))
        if not sep or name not in types or name in ("spec", "num_drafts", "max_num_seqs"):
            raise ValueError(
                f"--variant {text!r}: {assignment.strip()!r} must set an EngineConfig field "
                "other than spec, num_drafts and max_num_seqs (the bench sets those), e.g. "
                "calibrate_survival=on"
            )
        overrides.append((name, _config_value(name, types[name], value)))
    return Setting("adaptive", k, tag, tuple(overrides))


def _padding_budget(text: str) -> float | str:
    """``--graph-padding-budget``: "auto" or a number of steps >= 0."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a number >= 0, got {text!r}")
    return value


def _config_value(name: str, kind, value: str) -> object:
    """``value`` as the EngineConfig field ``name`` holds it (its annotation is a string
    under postponed evaluation)."""
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    lowered = value.lower()
    if kind == "bool":
        if lowered in ("1", "true", "on", "yes"):
            return True
        if lowered in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"--variant: {name} takes on or off, got {value!r}")
    if lowered == "none" and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        if "str" in kind:  # a number or a word (``graph_padding_budget``: "auto")
            return value
        raise ValueError(f"--variant: {name} takes a number ({kind}), got {value!r}") from None
    return value


@dataclass
class Measurement:
    label: str
    spec: str
    k: int
    concurrency: int
    requests: int
    tokens: int
    seconds: float  # wall time of the level
    tok_s: float  # generated tokens over the wall time less graph captures (steady state)
    per_user_tok_s: float  # median over requests
    tpot_p50_ms: float
    tpot_p99_ms: float
    acceptance_length: float
    verified_per_round: float
    schedule_share: float  # adaptive: scheduling time (all steps) / steady wall time
    step_ms: float = 0.0  # wall time per engine step (less captures)
    schedule_us_per_step: float = 0.0  # adaptive: budget + allocation per step
    graph_captures: int = 0  # CUDA graphs captured while measuring (after the warm-up)
    capture_s: float = 0.0  # host seconds those captures took
    capture_steps: int = 0  # steps that captured a graph while measuring
    # Target steps that replayed a larger captured shape than their own while measuring
    # (``dspark.engine.graphs.CaptureLedger``): they cost what that shape costs.
    covered_steps: int = 0
    covered_tokens: int = 0  # the padding tokens those covers added (a cover's size less its own)
    # Adaptive: steps whose budget rose into the padding of the graph they replayed, and
    # the drafts that added (``EngineConfig.fill_padding``).
    filled_steps: int = 0
    cheap_cuts: int = 0  # adaptive: drafts all verified, the cut priced dearer (EngineConfig)
    settled_steps: int = 0  # adaptive: drafting steps run at a settled depth (EngineConfig.settle)
    held_steps: int = 0  # adaptive: steps that held their draft room back (hold_draft_room)
    filled_drafts: int = 0
    tok_s_wall: float = 0.0  # generated tokens over the whole wall time, captures included
    undrafted_steps: int = 0  # adaptive: steps with decodes where it chose not to draft
    gate_vetoes: int = 0  # adaptive: of those, the throughput gate's (the model drafted)
    ceiling_cuts: int = 0  # adaptive: drafted steps the depth ceiling drafted shallower
    probes: int = 0  # adaptive: drafted steps the cost model declined (the gate's probes)
    depth_steps: list[int] = field(default_factory=list)  # adaptive: steps by depth 0..K
    lookahead_hits: int = 0  # adaptive: drafting decisions taken during the previous forward
    lookahead_us_per_step: float = 0.0  # look-ahead host time, used or not (during forwards)
    lookahead_plans: int = 0  # adaptive: of the hits, budgets planned ahead too
    drafting_plans: int = 0  # adaptive: budgets planned while the drafter ran
    share_plans: int = 0  # adaptive: budgets summed from shares planned ahead (changed batch)
    recut_plans: int = 0  # adaptive: budgets of a prompt-chunk step recut from the ranking ahead
    lookahead_reused: int = 0  # adaptive: depths decided ahead for a batch that changed
    heap_frozen: bool = False  # the start-up heap frozen for the run (``--freeze-gc``)
    gc_full: int = 0  # full (oldest-generation) collections while measuring
    gc_full_s: float = 0.0  # their seconds (inside the wall time)
    gc_s: float = 0.0  # seconds of every collection while measuring
    # The host's speed around the run: ``host_probe_ms`` before and after it (a fixed
    # piece of Python and NumPy work, the fastest of a few tries), and the medians of the
    # run's host phases (``EngineStats``: the drafter's proposal, verification and
    # emission, the forward from queueing to outputs on the host). A machine whose host
    # runs some runs slower than others (seen on the H200's) shows it in both; a slow run
    # whose probe is not slow was slowed by something else than the host's speed.
    probe_ms: tuple[float, float] = (0.0, 0.0)
    phase_ms: dict[str, float] = field(default_factory=dict)
    # Adaptive: what its cost model and verifier believed at the end of the run
    # (``learnt_state``), so that runs that chose differently can be told apart.
    learnt: dict = field(default_factory=dict)
    # A window of a time-sliced run (``--slice-ms``): its requests, tokens and seconds
    # are that window's own, and a row sums them over the windows (``summarise``).
    window: bool = False


PROBE_TRIES = 7


def host_probe_ms(tries: int = PROBE_TRIES) -> float:
    """Milliseconds a fixed piece of host work takes here, the fastest of ``tries``:
    the kind of work an engine's step does around its kernels (list and dict
    bookkeeping over a batch, a few small NumPy calls), about half a millisecond on this
    2-core VM and on the H200 machines' hosts at full speed. The fastest try leaves out
    preemptions; what remains is the host's speed."""
    best = float("inf")
    values = np.arange(64, dtype=np.int64)
    for _ in range(tries):
        start = time.perf_counter()
        for step in range(40):
            table = {i: i * step for i in range(64)}
            counts = [table[i] % 7 for i in range(64)]
            order = np.argsort(np.array(counts, dtype=np.int64) - values)
            float(np.add.accumulate(values[order]).max())
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def learnt_state(engine: LLMEngine, num_reqs: int) -> dict:
    """Adaptive: the drafter's price by depth for ``num_reqs`` requests (index 0: what an
    undrafted step adds), the measured overhead lines (``ObservedDraftCost``), the
    population's survival by position, how well a request's rounds predict its next and,
    with ``depth_ceiling``, the ceilings found (empty for fixed K and no speculation)."""
    verifier = getattr(engine, "verifier", None)
    if verifier is None:
        return {}
    model = verifier.cost_model
    state: dict = {
        "population_survival": [round(float(s), 4) for s in verifier.population_survival],
        "predictiveness": round(float(verifier.predictiveness), 4),
    }
    by_depth = getattr(model, "draft_costs_by_depth", None)
    if by_depth is not None:
        prices = by_depth(num_reqs, verifier.num_positions)
        state["draft_ms_by_depth"] = [round(float(ms), 4) for ms in prices]
    lines = getattr(model, "overhead_lines", None)
    if lines is not None:
        state["overhead_lines"] = {
            kind: [round(float(a), 4), round(float(b), 4)] for kind, (a, b) in lines().items()
        }
    ceiling = getattr(engine, "ceiling", None)
    if ceiling is not None:  # each batch-size bucket's depth ceiling, by its smallest size
        state["depth_ceilings"] = {str(n): c for n, c in sorted(ceiling.ceilings().items())}
    return state


def _phase_medians(stats) -> dict[str, float]:
    phases = {"drafter": stats.drafter_ms, "apply": stats.apply_ms, "forward": stats.forward_ms}
    return {name: float(np.median(ms)) for name, ms in phases.items() if len(ms)}


def closed_loop(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, concurrency: int
) -> tuple[list, float]:
    """Run ``prompts`` keeping ``concurrency`` in flight; finished requests and seconds."""
    queue = list(prompts)
    running, finished = [], []
    start = time.perf_counter()
    while queue or running:
        while queue and len(running) < concurrency:
            running.append(engine.add_request(queue.pop(0), params))
        engine.step()
        still = []
        for request in running:
            (finished if request.is_finished else still).append(request)
        running = still
    seconds = time.perf_counter() - start
    for request in finished:
        engine.requests.pop(request.request_id, None)
    return finished, seconds


class SlicedLoop:
    """One setting's closed loop for ``--slice-ms``: ``concurrency`` requests in flight,
    the prompts taken in order and taken again from the start when they run out, stepped
    a slice of time at a time while other settings' loops take their turns
    (``sliced_windows``). The engine's request clock leaves out the turns of the others
    (``LLMEngine.idle_s``), so TPOT is this engine's own."""

    def __init__(
        self,
        engine: LLMEngine,
        setting: Setting,
        prompts: list[list[int]],
        params: SamplingParams,
        concurrency: int,
    ) -> None:
        if not prompts:
            raise ValueError("a sliced loop needs prompts")
        self.engine, self.setting = engine, setting
        self.prompts, self.params, self.concurrency = prompts, params, concurrency
        self.next_prompt = 0
        self.running: list = []
        self.finished: list = []  # since the window began
        self.busy_s = 0.0  # this engine's own time in the window
        self._last_end: float | None = None
        self._on_cuda = engine.device.type == "cuda"

    def begin_window(self) -> _Marks:
        self.engine.stats.__init__()
        self.finished, self.busy_s = [], 0.0
        return _Marks(self.engine)

    def run_slice(self, until_s: float) -> None:
        """Steps (at least one) until this window's own time reaches ``until_s``: a turn
        that overran its target starts the next one later, so over a window every loop
        keeps pace with the rounds whatever its step time (``sliced_windows``)."""
        engine = self.engine
        start = time.perf_counter()
        if self._last_end is not None:
            engine.idle_s += start - self._last_end
        until = until_s - self.busy_s
        while True:
            while len(self.running) < self.concurrency:
                prompt = self.prompts[self.next_prompt % len(self.prompts)]
                self.next_prompt += 1
                self.running.append(engine.add_request(prompt, self.params))
            engine.step()
            still = []
            for request in self.running:
                if request.is_finished:
                    if request.error:
                        raise ValueError(f"a benchmark request failed: {request.error}")
                    self.finished.append(request)
                    engine.requests.pop(request.request_id, None)
                else:
                    still.append(request)
            self.running = still
            if time.perf_counter() - start >= until:
                break
        if self._on_cuda:  # the device's work is this engine's, not the next one's
            torch.cuda.synchronize(engine.device)
        end = time.perf_counter()
        self.busy_s += end - start
        self._last_end = end


def sliced_windows(
    loops: list[SlicedLoop],
    window_s: float,
    slice_s: float,
    freeze_gc: bool = True,
    rotation: int = 0,
) -> list[Measurement]:
    """One window of ``--slice-ms``: every loop runs ``window_s`` of its own time in turns,
    round robin, so every setting meets the machine's speed of the same stretch of wall
    time; a measurement each, of the tokens it emitted and the requests that finished in
    its turns. Round ``r`` takes each loop to ``(r + 1) * slice_s`` of its own time (a
    loop whose last step overran that sits the round out), so loops of long steps and of
    short ones end the window together; the first turn moves one loop on each round,
    starting at ``rotation``. Requests in flight carry over from window to window, as
    does what adaptive verification learnt: the steady state of a serving engine."""
    marks = [loop.begin_window() for loop in loops]
    pauses = [CollectorPauses() for _ in loops]
    probe_before = host_probe_ms()
    turn = rotation
    with frozen_heap() if freeze_gc else nullcontext():
        target = 0.0
        while any(loop.busy_s < window_s for loop in loops):
            target = min(target + slice_s, window_s)
            for j in range(len(loops)):
                i = (turn + j) % len(loops)
                if loops[i].busy_s < target:
                    with pauses[i].watching():
                        loops[i].run_slice(target)
            turn += 1
    probe_ms = (probe_before, host_probe_ms())
    results = []
    for loop, start, paused in zip(loops, marks, pauses, strict=True):
        engine = loop.engine
        results.append(
            _measurement(
                engine,
                loop.setting,
                loop.concurrency,
                loop.finished,
                engine.stats.num_generated,
                loop.busy_s,
                start,
                paused,
                probe_ms,
                freeze_gc,
                window=True,
            )
        )
    return results


def measure(
    engine: LLMEngine,
    setting: Setting,
    prompts: list[list[int]],
    params: SamplingParams,
    concurrency: int,
    warmup: list[list[int]] | None = None,
    full_warmup: bool = False,
    freeze_gc: bool = True,
) -> Measurement:
    """One closed-loop run of ``prompts``, after a shorter one over ``warmup`` (default:
    the first prompt) at the same concurrency: a serving engine runs in steady state, with
    its graphs captured and (adaptive) its step costs measured, and so does the bench.
    ``full_warmup``: the warm-up requests run as many tokens as the measured ones (else a
    quarter), so that they meet the measured run's step shapes (contexts as long). The
    warm-up samples as the measured run does: what adaptive verification learns there
    (the drafts' survival, what drafting costs and earns) is what it meets next, and a
    greedy warm-up before a run at temperature 1 taught it greedy acceptance.

    ``freeze_gc``: the heap as the warm-up leaves it is frozen for the measured run
    (``dspark.engine.heap``), as a serving engine freezes its start-up heap, so that a
    full collection does not walk the model's objects in some run's step; the run's
    collections are counted either way (``gc_full``, ``gc_full_s``, ``gc_s``)."""
    warm_up(engine, params, concurrency, warmup or prompts[:1], full_warmup)
    start = _Marks(engine)
    pauses = CollectorPauses()
    probe_before = host_probe_ms()
    with frozen_heap() if freeze_gc else nullcontext(), pauses.watching():
        finished, seconds = closed_loop(engine, prompts, params, concurrency)
    probe_ms = (probe_before, host_probe_ms())
    failed = [r for r in finished if r.error]
    if failed:
        raise ValueError(f"{len(failed)} benchmark requests failed: {failed[0].error}")
    tokens = sum(len(r.output_ids) for r in finished)
    return _measurement(
        engine, setting, concurrency, finished, tokens, seconds, start, pauses, probe_ms, freeze_gc
    )


def warm_up(
    engine: LLMEngine,
    params: SamplingParams,
    concurrency: int,
    warmup: list[list[int]],
    full_warmup: bool,
) -> None:
    """The closed loop over ``warmup`` that ``measure`` runs first; clears the stats."""
    warm_tokens = params.max_tokens if full_warmup else max(4, params.max_tokens // 4)
    closed_loop(engine, warmup, replace(params, max_tokens=warm_tokens), concurrency)
    engine.stats.__init__()


class _Marks:
    """An engine's capture and cover counters when a measurement began."""

    def __init__(self, engine: LLMEngine) -> None:
        self.captures, self.capture_s = engine.num_captures(), engine.capture_seconds()
        graphs = engine.graphs
        self.covered = graphs.num_covered if graphs is not None else 0
        self.padding = graphs.covered_tokens if graphs is not None else 0


def _measurement(
    engine: LLMEngine,
    setting: Setting,
    concurrency: int,
    finished: list,
    tokens: int,
    seconds: float,
    start: _Marks,
    pauses: CollectorPauses,
    probe_ms: tuple[float, float],
    freeze_gc: bool,
    window: bool = False,
) -> Measurement:
    """One measurement from what the engine's stats hold since ``start`` (``seconds``:
    the engine's own time, ``tokens``: those it emitted in it, ``finished``: the requests
    that finished in it)."""
    capture_s = engine.capture_seconds() - start.capture_s
    covered = padding = 0
    if engine.graphs is not None:
        covered = engine.graphs.num_covered - start.covered
        padding = engine.graphs.covered_tokens - start.padding
    stats = engine.stats
    steady_s = seconds - capture_s
    tpot = [
        (r.finish_time - r.first_token_time) / (len(r.output_ids) - 1)
        for r in finished
        if len(r.output_ids) > 1
    ]
    tpot = np.array(tpot) if tpot else np.array([np.nan])
    return Measurement(
        label=setting.label,
        spec=setting.spec,
        k=setting.k,
        concurrency=concurrency,
        requests=len(finished),
        tokens=tokens,
        seconds=seconds,
        tok_s=tokens / steady_s,
        per_user_tok_s=float(np.median(1.0 / tpot)),
        tpot_p50_ms=float(np.percentile(tpot, 50) * 1e3),
        tpot_p99_ms=float(np.percentile(tpot, 99) * 1e3),
        acceptance_length=stats.acceptance_length,
        verified_per_round=stats.verified_per_step,
        schedule_share=sum(stats.schedule_ms) / (steady_s * 1e3),
        step_ms=steady_s * 1e3 / max(stats.num_steps, 1),
        schedule_us_per_step=sum(stats.schedule_ms) * 1e3 / max(stats.num_steps, 1),
        graph_captures=engine.num_captures() - start.captures,
        capture_s=capture_s,
        capture_steps=stats.capture_steps,
        covered_steps=covered,
        covered_tokens=padding,
        filled_steps=stats.filled_steps,
        cheap_cuts=stats.cheap_cuts,
        settled_steps=stats.settled_steps,
        held_steps=stats.held_steps,
        filled_drafts=stats.filled_drafts,
        tok_s_wall=tokens / seconds,
        undrafted_steps=stats.undrafted_steps,
        gate_vetoes=stats.gate_vetoes,
        ceiling_cuts=stats.ceiling_cuts,
        probes=stats.probes,
        lookahead_hits=stats.lookahead_hits,
        lookahead_reused=stats.lookahead_reused,
        lookahead_plans=stats.lookahead_plans,
        drafting_plans=stats.drafting_plans,
        share_plans=stats.share_plans,
        recut_plans=stats.recut_plans,
        lookahead_us_per_step=sum(stats.lookahead_ms) * 1e3 / max(stats.num_steps, 1),
        heap_frozen=freeze_gc,
        gc_full=pauses.counts[2],
        gc_full_s=pauses.seconds[2],
        gc_s=sum(pauses.seconds),
        probe_ms=probe_ms,
        phase_ms=_phase_medians(stats),
        learnt=learnt_state(engine, concurrency),
        window=window,
        depth_steps=[stats.depth_steps[d] for d in range(setting.k + 1)]
        if setting.spec == "adaptive"
        else [],
    )


CPU_SLICE_MS = 250.0
"""``--slice-ms`` on a CPU unless given: this 2-core VM moves whole runs by +-15% with its
phases, and time slices put every setting in the same phases (session 40)."""

PRIME_SHARE = 0.25
"""With time slices, a level's loops first run this share of a window unmeasured
(``_run_sliced``): requests in flight at staggered points, as in the windows after."""

SLICED_REPEATS = 2
"""``--repeats`` with time slices unless given: windows are cheap next to the engines'
start-up, and two give a paired range."""


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the options whose defaults depend on the device: ``--slice-ms``
    (``CPU_SLICE_MS`` on a CPU, off on CUDA) and then ``--repeats``."""
    if args.slice_ms is None:
        args.slice_ms = 0.0 if args.device.startswith("cuda") else CPU_SLICE_MS
    if args.repeats is None:
        args.repeats = SLICED_REPEATS if args.slice_ms else 1
    return args


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    cuda = torch.cuda.is_available()
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--dataset", choices=["sharegpt", "humaneval"], default="sharegpt")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 4, 16, 64, 256] if cuda else [1, 4],
        help="closed-loop levels (default: 1 4 on CPU, 1 ... 256 on CUDA)",
    )
    parser.add_argument(
        "--fixed", type=int, nargs="*", default=[1, 3, 5, 7], help="fixed K values to compare"
    )
    parser.add_argument("--k", type=int, default=7, help="adaptive: the most drafts per request")
    parser.add_argument("--no-baseline", action="store_true", help="skip no speculation")
    parser.add_argument("--no-adaptive", action="store_true")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="TAG:FIELD=VALUE[,FIELD=VALUE]",
        help="also run adaptive with these EngineConfig fields changed, as a setting "
        "labelled 'adaptive≤K TAG' in the same interleaved repeats, compared with plain "
        "adaptive pairwise (an in-run A/B; e.g. cal:calibrate_survival=on or "
        "m2:depth_margin=0.02); repeatable",
    )
    parser.add_argument("--drafter", default="auto", help="auto | dspark | ngram | DIR")
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument(
        "--full-warmup",
        action="store_true",
        help="warm up on as many requests and tokens as are measured (other prompts), so "
        "that graph shapes are captured before measuring; default: a quarter of the tokens "
        "of one request per user",
    )
    parser.add_argument(
        "--freeze-gc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="freeze the heap after each warm-up for the measured run, as a serving engine "
        "freezes its start-up heap (dspark.engine.heap); collections while measuring are "
        "reported either way",
    )
    parser.add_argument("--min-requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"default: {SLICED_REPEATS} with time slices, else 1",
    )
    parser.add_argument(
        "--slice-ms",
        type=float,
        default=None,
        help="time-sliced runs: per level, every setting's engine is warmed once and kept, "
        "and each repeat is a window of --window-s of every engine's own time, taken in "
        "turns of this many ms (closed loops that never drain: steady state), so every "
        "setting meets the machine's speed of the same stretch of time; 0: one fresh "
        "engine per run, each running the level's prompts to the end (default: "
        f"{CPU_SLICE_MS:g} on CPU, where one run moves with the VM's phases; 0 on CUDA)",
    )
    parser.add_argument(
        "--window-s",
        type=float,
        default=4.0,
        help="with --slice-ms: seconds of each engine's own time per repeat",
    )
    parser.add_argument(
        "--step-log",
        action="store_true",
        help="also write steps.json: every measured step of every run (its time, its "
        "phases, its batch, how deep it drafted, how its forward ran; "
        "dspark.engine.engine.STEP_FIELDS), for scripts/step_log.py",
    )
    parser.add_argument("--prompts", default=None, help="tokenised prompt splits file")
    parser.add_argument("--out", default="bench-results", help="directory for JSON and PNG")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="run a target of this shape with random weights (and a random drafter of "
        "matching shape); acceptance is REPLAYED from --trace, not computed",
    )
    parser.add_argument(
        "--graph-padding-budget",
        type=_padding_budget,
        default=CAPTURE_AFTER_WASTE,
        help="CUDA graphs: steps' worth of padding a new step shape replays on a larger "
        "captured one before it is captured itself (0: capture every new shape at once; "
        f"auto: one capture's time over a forward's, at most {CAPTURE_AFTER_WASTE:g})",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="with --shape: acceptance trace (.npz from AcceptanceTrace.save), or "
        "published:DOMAIN[:DRAFTER] (chat, math or code; synthetic rounds matching the DSpark "
        "paper's per-position acceptance); default: the shipped SmolLM2 drafter trace on "
        "held-out ShareGPT",
    )


def bench_prompts(tokenizer, args, count: int) -> list[list[int]]:
    from dspark.train.data import humaneval_prompts, load_prompts, sharegpt_prompts

    if args.prompts:
        given = load_prompts(args.prompts)
        pool = given["eval" if args.dataset == "sharegpt" else "humaneval"]
        pool = [p for p in pool if len(p) <= args.max_prompt_tokens]
    elif args.dataset == "sharegpt":
        pool = sharegpt_prompts(tokenizer, "eval", args.max_prompt_tokens, count)
    else:
        pool = humaneval_prompts(tokenizer, args.max_prompt_tokens)
    if not pool:
        raise ValueError(f"no {args.dataset} prompt fits {args.max_prompt_tokens} tokens")
    return [pool[i % len(pool)] for i in range(count)]


@dataclass
class Replay:
    """``--shape``: the random-weight drafter model and the trace its acceptance comes from."""

    draft_model: object
    trace: AcceptanceTrace


def engine_for(
    loaded, setting: Setting, concurrency: int, args, replay: Replay | None = None
) -> LLMEngine:
    k = max(setting.k, 1)
    out = Path(args.out)
    name = args.shape or "model"
    # A variant profiles apart (its fields may change what profiling measures).
    tag = f"-{setting.tag}" if setting.tag else ""
    values = dict(
        spec=setting.spec,
        num_drafts=k,
        drafter=args.drafter,
        max_num_seqs=concurrency,
        # A full verify batch plus one whole prompt: otherwise the per-request draft room
        # (K each) leaves prompt chunks no tokens, and new requests starve at high K.
        max_num_batched_tokens=max(512, concurrency * (k + 1) + args.max_prompt_tokens),
        kv_cache_tokens=max(4096, concurrency * (args.max_prompt_tokens + args.max_tokens + 32)),
        profile_path=str(
            out / "profiles" / f"profile-{name}-c{concurrency}-k{k}-{args.device}{tag}.json"
        ),
        graph_padding_budget=args.graph_padding_budget,
    )
    values.update(setting.overrides)  # a variant's fields win over the bench's
    config = EngineConfig(**values)
    drafter = None
    if replay is not None and setting.spec != "none":
        block = replay.draft_model.config.block_size
        on_gpu = args.device.startswith("cuda")
        graphs = (concurrency, loaded.config.max_position) if on_gpu else None
        regions = config.max_num_seqs if uses_kv_regions(config, torch.device(args.device)) else 0
        inner = DSparkDrafter(
            replay.draft_model,
            drafter_rows(config, block),
            config.block_size,
            graphs=graphs,
            regions=regions,  # as the engine gives the drafter it builds itself
        )
        # The same seed for every configuration: a request meets the same round at the
        # same point of its output in all of them (common random numbers).
        drafter = ReplayDrafter(inner, replay.trace, seed=0)
    return LLMEngine(loaded, config, drafter=drafter)


def main(args: argparse.Namespace) -> None:
    resolve_defaults(args)
    if args.repeats < 1 or min(args.concurrency) < 1:
        raise ValueError("--repeats and every --concurrency must be at least 1")
    if not (math.isfinite(args.slice_ms) and args.slice_ms >= 0):
        raise ValueError(f"--slice-ms must be a time >= 0 (0: off), got {args.slice_ms}")
    if args.slice_ms and not (math.isfinite(args.window_s) and args.window_s > 0):
        raise ValueError(f"--window-s must be a positive time, got {args.window_s}")
    if any(not 1 <= k <= args.k for k in args.fixed):
        raise ValueError(f"--fixed values must be in 1..{args.k} (--k)")
    for flag, values in (("--fixed", args.fixed), ("--concurrency", args.concurrency)):
        if len(set(values)) != len(values):  # one setting's runs would fill two rows' slots
            raise ValueError(f"{flag} values must differ, got {values}")
    variants = checked_variants(args)  # before the model loads: bad input fails at once
    if args.slice_ms and any(name == "small_rows" for v in variants for name, _ in v.overrides):
        raise ValueError(
            "a variant that sets small_rows cannot run time-sliced: the row plan it sets "
            "is process-wide, so the engines alive together would share the last one's; "
            "run with --slice-ms 0"
        )
    dtype = resolve_dtype(args.dtype, args.device)
    replay = None
    if args.shape:
        loaded = random_model(args.shape, dtype=dtype, device=args.device)
        replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve(args.trace))
        print(
            f"[dspark] {args.shape} with random weights: acceptance is REPLAYED from "
            f"{replay.trace.source} ({replay.trace.acceptance_length:.3f} tokens/round at "
            f"full K={replay.trace.num_positions})"
        )
    else:
        loaded = load_model(args.model, dtype=dtype, device=args.device)
    tokenizer = loaded.tokenizer
    if replay is not None and not args.prompts:  # the trace's prompts, in the model's ids
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
    settings = [] if args.no_baseline else [Setting("none", 0)]
    settings += [Setting("fixed", k) for k in args.fixed]
    if not args.no_adaptive:
        settings.append(Setting("adaptive", args.k))
        settings += variants
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, int], list[Measurement]] = {}
    run = _run_sliced if args.slice_ms else _run_interleaved
    steps = StepLog(Path(args.out) / "steps.json") if args.step_log else None
    seen: dict = {}
    stopped = None
    try:
        with _sigterm_stops():
            run(args, loaded, tokenizer, settings, params, replay, runs, steps, seen)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (``_sigterm_stops``)
        stopped = str(interrupt) or "SIGINT"
    left_out = 0
    if stopped is not None:
        runs, left_out = finished_repeats(runs, [setting.label for setting in settings])
        if not runs:
            print(
                f"[dspark] stopped by {stopped} before every setting of a level had finished "
                f"a repeat: nothing to compare ({args.out}/bench.partial.json keeps each "
                "finished run)"
            )
            raise SystemExit(STOPPED_EXIT.get(stopped, 130))
        print(
            f"[dspark] stopped by {stopped}: the table holds the repeats every setting of "
            f"a level finished ({left_out} finished runs left out, kept in "
            f"{args.out}/bench.partial.json)"
        )
    rows = [summarise(measurements) for measurements in runs.values()]
    record = None if stopped is None else {"by": stopped, "runs_left_out": left_out}
    report(rows, args, dtype, seen.get("drafter"), replay, stopped=record)
    if stopped is not None:
        raise SystemExit(STOPPED_EXIT.get(stopped, 130))


STOPPED_EXIT = {"SIGINT": 130, "SIGTERM": 143}
"""``dspark bench``'s exit status when a signal stopped it (what the shell reports for a
process those signals end), after it reported what it had finished; 130 for any other
``KeyboardInterrupt``."""


@contextmanager
def _sigterm_stops():
    """SIGTERM (``timeout``, a job scheduler's limit) stops the bench as Ctrl-C does, as
    a ``KeyboardInterrupt``, so that it still reports the repeats it finished rather
    than dying with them. Only the main thread can take signals; elsewhere nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.getsignal(signal.SIGTERM)  # None: not set from Python
    try:
        signal.signal(signal.SIGTERM, stop)
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def finished_repeats(
    runs: dict[tuple[str, int], list], labels: list[str]
) -> tuple[dict[tuple[str, int], list], int]:
    """Of a stopped bench's runs (``(label, concurrency) -> runs in repeat order``), what
    can be compared: per level, every setting's first ``n`` runs, ``n`` the fewest that
    any of ``labels`` finished there (so that each repeat pairs every setting's run of
    it); a level that some setting never finished a run of is left out. Returns those
    runs, in ``runs``' order, and how many finished runs were left out."""
    kept: dict[tuple[str, int], list] = {}
    levels = {concurrency for _, concurrency in runs}
    finished = {c: min(len(runs.get((label, c), [])) for label in labels) for c in levels}
    for (label, concurrency), measured in runs.items():
        n = finished[concurrency]
        if n:
            kept[label, concurrency] = measured[:n]
    left_out = sum(len(m) for m in runs.values()) - sum(len(m) for m in kept.values())
    return kept, left_out


def _run_interleaved(
    args, loaded, tokenizer, settings, params, replay, runs, steps=None, seen=None
) -> str | None:
    """Every (repeat, level, setting) a run of its own on a fresh engine (``job_order``);
    returns the drafter's class name (also kept in ``seen["drafter"]`` as soon as it is
    known, for a run stopped before it returns)."""
    jobs = job_order(args.repeats, args.concurrency, settings)
    drafter_name = None
    seen = {} if seen is None else seen
    for _, concurrency, setting in tqdm(jobs, desc="bench"):
        warmup, measured = _level_prompts(tokenizer, args, concurrency)
        engine = engine_for(loaded, setting, concurrency, args, replay)
        if engine.drafter is not None:
            drafter_name = seen["drafter"] = type(engine.drafter).__name__
        result = measure(
            engine,
            setting,
            measured,
            params,
            concurrency,
            warmup,
            args.full_warmup,
            args.freeze_gc,
        )
        runs.setdefault((setting.label, concurrency), []).append(result)
        if steps is not None:
            steps.add(result, len(runs[setting.label, concurrency]) - 1, engine)
        # An engine holds reference cycles (its scheduler calls back into it): collected
        # now, not by a cycle collection that would pause some later setting's run.
        del engine
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()  # the next engine allocates its own KV cache
        _write_partial(args, runs)
    return drafter_name


def _run_sliced(
    args, loaded, tokenizer, settings, params, replay, runs, steps=None, seen=None
) -> str | None:
    """``--slice-ms``: per level, every setting's engine warmed once and kept; then each
    repeat is one window of ``--window-s`` of every engine's own time, run in turns
    (``sliced_windows``). All of a level's engines are alive at once (their KV caches and
    graphs side by side). Returns the drafter's class name (and keeps it in ``seen``, as
    ``_run_interleaved``)."""
    drafter_name = None
    seen = {} if seen is None else seen
    progress = tqdm(total=len(args.concurrency) * args.repeats, desc="bench (sliced)")
    for concurrency in args.concurrency:
        warmup, measured = _level_prompts(tokenizer, args, concurrency)
        loops = []
        for setting in settings:
            try:
                engine = engine_for(loaded, setting, concurrency, args, replay)
                warm_up(engine, params, concurrency, warmup, args.full_warmup)
            except torch.OutOfMemoryError as error:
                if not loops:
                    raise
                raise RuntimeError(
                    f"--slice-ms keeps every setting's engine of a level alive at once, and "
                    f"the engine for {setting.label} at concurrency {concurrency} does not fit "
                    f"beside the {len(loops)} built before it; run with --slice-ms 0 (one "
                    "engine at a time) or fewer settings"
                ) from error
            if engine.drafter is not None:
                drafter_name = seen["drafter"] = type(engine.drafter).__name__
            loops.append(SlicedLoop(engine, setting, measured, params, concurrency))
        slice_s = args.slice_ms / 1e3
        # Unmeasured: the warm-ups drained every loop, and a window that starts with all
        # requests arriving together is not the steady state the windows measure.
        sliced_windows(loops, args.window_s * PRIME_SHARE, slice_s, args.freeze_gc)
        for repeat in range(args.repeats):
            window = sliced_windows(loops, args.window_s, slice_s, args.freeze_gc, rotation=repeat)
            for loop, result in zip(loops, window, strict=True):
                runs.setdefault((result.label, concurrency), []).append(result)
                if steps is not None:
                    steps.add(result, repeat, loop.engine)
            _write_partial(args, runs)
            progress.update()
        del loops, engine  # reference cycles: collected now, not in a later window
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    progress.close()
    return drafter_name


def _level_prompts(tokenizer, args, concurrency: int) -> tuple[list, list]:
    """A level's warm-up prompts and measured prompts (other prompts, as many as
    ``--min-requests`` or ``--requests-per-user`` ask; the warm-up as many again with
    ``--full-warmup``, else one per user)."""
    count = max(args.min_requests, concurrency * args.requests_per_user)
    num_warmup = count if args.full_warmup else concurrency
    prompts = bench_prompts(tokenizer, args, count + num_warmup)
    return prompts[:num_warmup], prompts[num_warmup:]


class StepLog:
    """``--step-log``: every measured run's steps (``EngineStats.step_log``, fields
    ``STEP_FIELDS``), rewritten to ``path`` after each run so an interrupted bench keeps
    what it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: list[dict] = []

    def add(self, result: Measurement, repeat: int, engine: LLMEngine) -> None:
        rows = list(engine.stats.step_log)
        if len(rows) < engine.stats.num_steps:
            print(
                f"[dspark] --step-log: {result.label} at {result.concurrency} ran "
                f"{engine.stats.num_steps} steps; the log keeps the last {len(rows)}"
            )
        self.runs.append(
            {
                "label": result.label,
                "concurrency": result.concurrency,
                "repeat": repeat,
                "fields": list(STEP_FIELDS),
                "steps": [
                    [round(v, 4) if isinstance(v, float) else v for v in row] for row in rows
                ],
            }
        )
        self.path.write_text(json.dumps(self.runs))


def _write_partial(args, runs: dict) -> None:
    partial = [asdict(m) for ms in runs.values() for m in ms]  # survives an interruption
    (Path(args.out) / "bench.partial.json").write_text(json.dumps(partial))


def checked_variants(args: argparse.Namespace) -> list[Setting]:
    """``--variant`` settings, each checked as an ``EngineConfig`` (its own validation)
    and against the others, so that a bad one fails before any run, not in its first."""
    variants = [parse_variant(text, args.k) for text in args.variant]
    if len({v.tag for v in variants}) != len(variants):
        raise ValueError(f"--variant tags must differ, got {[v.tag for v in variants]}")
    if variants and args.no_adaptive:
        raise ValueError("--variant runs adaptive variants: it cannot go with --no-adaptive")
    for variant in variants:
        try:
            EngineConfig(spec="adaptive", num_drafts=args.k, **dict(variant.overrides))
        except (TypeError, ValueError) as error:
            raise ValueError(f"--variant {variant.tag}: {error}") from None
    return variants


def job_order(
    repeats: int, concurrency: list[int], settings: list[Setting]
) -> list[tuple[int, int, Setting]]:
    """(repeat, level, setting) in run order: repeats outermost, a level's settings
    reversed on every other repeat (a drift over the run then hits them alike)."""
    return [
        (repeat, level, setting)
        for repeat in range(repeats)
        for level in concurrency
        for setting in (settings if repeat % 2 == 0 else settings[::-1])
    ]


def summarise(measurements: list[Measurement]) -> dict:
    """Medians over repeats (and each repeat's tok/s, for the spread). A run's
    ``requests``, ``tokens`` and ``seconds`` are the first repeat's (every repeat runs the
    same prompts), a time-sliced row's their sums over the windows."""
    row = asdict(measurements[0])
    if measurements[0].window:
        for key in ("requests", "tokens", "seconds"):
            row[key] = sum(getattr(m, key) for m in measurements)
    for key in (
        "tok_s",
        "per_user_tok_s",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "schedule_share",
        "step_ms",
        "schedule_us_per_step",
        "graph_captures",
        "capture_s",
        "capture_steps",
        "covered_steps",
        "covered_tokens",
        "filled_steps",
        "cheap_cuts",
        "settled_steps",
        "held_steps",
        "filled_drafts",
        "tok_s_wall",
        "undrafted_steps",
        "gate_vetoes",
        "ceiling_cuts",
        "probes",
        "lookahead_hits",
        "lookahead_us_per_step",
        "lookahead_plans",
        "drafting_plans",
        "share_plans",
        "recut_plans",
        "lookahead_reused",
        "gc_full",
        "gc_full_s",
        "gc_s",
    ):
        row[key] = float(np.median([getattr(m, key) for m in measurements]))
    if row["depth_steps"]:  # per depth, the median over repeats (not the first repeat's)
        by_depth = np.array([m.depth_steps for m in measurements], dtype=float)
        row["depth_steps"] = [float(v) for v in np.median(by_depth, axis=0)]
    for key in ("acceptance_length", "verified_per_round"):
        row[key] = float(np.mean([getattr(m, key) for m in measurements]))
    row["tok_s_runs"] = [round(m.tok_s, 2) for m in measurements]
    row["gc_full_runs"] = [m.gc_full for m in measurements]
    del row["probe_ms"], row["phase_ms"], row["learnt"]  # per run only, below
    row["probe_ms_runs"] = [[round(v, 4) for v in m.probe_ms] for m in measurements]
    row["phase_ms_runs"] = [{k: round(v, 4) for k, v in m.phase_ms.items()} for m in measurements]
    row["learnt_runs"] = [m.learnt for m in measurements]
    return row


def report(
    rows: list[dict],
    args,
    dtype,
    drafter_name: str | None,
    replay: Replay | None = None,
    stopped: dict | None = None,
) -> None:
    """The table, the comparisons, ``bench.json`` and ``bench.png``. ``stopped``: a run
    a signal cut short (``main``), reported from the repeats it finished; the JSON says
    so."""
    out = Path(args.out)
    if args.device.startswith("cuda"):
        device = torch.cuda.get_device_name()
    else:
        device = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
    header = (
        f"{'conc':>4} {'setting':>16} {'tok/s':>9} {'user tok/s':>10} {'TPOT p50':>9} "
        f"{'TPOT p99':>9} {'accept':>6} {'verify':>6} {'step':>8} {'sched%':>6} {'capt':>9} "
        f"{'cover':>5} {'fill':>4}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['concurrency']:>4} {row['label']:>16} {row['tok_s']:>9.1f} "
            f"{row['per_user_tok_s']:>10.1f} {row['tpot_p50_ms']:>8.1f}ms "
            f"{row['tpot_p99_ms']:>8.1f}ms {row['acceptance_length']:>6.2f} "
            f"{row['verified_per_round']:>6.2f} {row['step_ms']:>6.1f}ms "
            f"{100 * row['schedule_share']:>6.2f} {row['capture_steps']:>3.0f}/"
            f"{row['capture_s']:>4.2f}s {row['covered_steps']:>5.0f} "
            f"{row.get('filled_steps', 0):>4.0f}"
        )
    verdicts = compare(rows)
    for line in verdicts:
        print(line)
    collected = [r for r in rows if any(r["gc_full_runs"])]
    for row in collected:  # a full collection pauses whichever step triggers it
        print(
            f"[dspark] c{row['concurrency']} {row['label']}: full garbage collections "
            f"while measuring, by repeat: {row['gc_full_runs']} (median "
            f"{1e3 * row['gc_full_s']:.1f} ms; heap "
            f"{'frozen' if row['heap_frozen'] else 'not frozen'})"
        )
    model = args.model or "SmolLM2-135M-Instruct"
    acceptance = "computed (target verifies the drafts)"
    if replay is not None:
        model = f"{args.shape} shape, random weights"
        acceptance = f"REPLAYED from {replay.trace.source}"
        print(f"[dspark] acceptance in this table is {acceptance}")
    payload = {
        "device": device,
        "model": model,
        "acceptance": acceptance,
        "dtype": str(dtype),
        "torch": torch.__version__,
        "source_digest": source_digest(),  # the code that ran (dspark.bench.provenance)
        "dataset": args.dataset,
        "drafter": f"{args.drafter} ({drafter_name})",
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        # Time-sliced (``--slice-ms``): each repeat a window of every engine's own time.
        "slice_ms": args.slice_ms,
        "window_s": args.window_s if args.slice_ms else None,
        # A run a signal stopped: by which, and how many finished runs the rows leave out
        # (a row's ``tok_s_runs`` has one entry per repeat it holds).
        "stopped": stopped,
        "rows": rows,
        "summary": verdicts,
    }
    (out / "bench.json").write_text(json.dumps(payload, indent=1))
    title = f"{model}, {args.dataset}, {device}, {dtype}"
    if replay is not None:
        title += f"\nacceptance REPLAYED: {replay.trace.source}"
    plot(rows, out / "bench.png", title)
    digest = payload["source_digest"]
    print(f"[dspark] wrote {out}/bench.json and bench.png (source digest {digest})")


def compare(rows: list[dict]) -> list[str]:
    """Per level: adaptive against the best fixed K and against no speculation (each
    adaptive variant in turn, and each ``--variant`` against plain adaptive)."""
    lines = []
    for concurrency in sorted({r["concurrency"] for r in rows}):
        level = [r for r in rows if r["concurrency"] == concurrency]
        variants = [r for r in level if r["spec"] == "adaptive"]
        # Plain adaptive (no tag) first: every variant is compared with it.
        variants.sort(key=lambda r: bool(r["label"].partition(" ")[2]))
        fixed = [r for r in level if r["spec"] == "fixed"]
        baseline = next((r for r in level if r["spec"] == "none"), None)
        fastest = fastest_probe(level)
        for adaptive in variants:
            tag = adaptive["label"].partition(" ")[2]  # a variant's tag
            name = f"adaptive {tag}" if tag else "adaptive"
            parts = [f"concurrency {concurrency}: {name} {adaptive['tok_s']:.1f} tok/s"]
            if fixed:
                best = max(fixed, key=lambda r: r["tok_s"])
                parts.append(
                    f"{adaptive['tok_s'] / best['tok_s']:.3f}x best fixed ({best['label']})"
                    + paired_ratios(adaptive, best, fastest)
                )
            if baseline:
                parts.append(
                    f"{adaptive['tok_s'] / baseline['tok_s']:.3f}x no spec"
                    + paired_ratios(adaptive, baseline, fastest)
                )
            if adaptive is not variants[0] and not variants[0]["label"].partition(" ")[2]:
                parts.append(
                    f"{adaptive['tok_s'] / variants[0]['tok_s']:.3f}x {variants[0]['label']}"
                    + paired_ratios(adaptive, variants[0], fastest)
                )
            lines.append(", ".join(parts))
    return lines


FULL_SPEED = 1.25
"""A run had the host at full speed when both its probes (``host_probe_ms``) read at most
this factor above the fastest probe of its level: the hosts seen switch between two
speeds about 1.5x apart (H200 machines: 0.40-0.48 against 0.64-1.00 ms; this 2-core VM:
0.44-0.47 against 0.63-0.82), and a run slowed at either end may have run slow."""


def paired_ratios(row: dict, baseline: dict, fastest: float | None = None) -> str:
    """`` [paired: median m, min-max]`` of ``row``'s tok/s over ``baseline``'s within each
    repeat (``tok_s_runs`` in repeat order), or nothing with a single repeat. Given the
    level's fastest host probe, also the median over the repeats whose two runs both had
    the host at full speed (``FULL_SPEED``), when some but not all did."""
    runs, base = row.get("tok_s_runs", []), baseline.get("tok_s_runs", [])
    if len(runs) < 2 or len(runs) != len(base):
        return ""
    ratios = np.divide(runs, base)
    text = (
        f" [paired over {len(ratios)} repeats: median {np.median(ratios):.3f}, "
        f"{ratios.min():.3f}-{ratios.max():.3f}"
    )
    probes, base_probes = row.get("probe_ms_runs"), baseline.get("probe_ms_runs")
    if fastest and probes and base_probes and len(probes) == len(base_probes) == len(runs):
        limit = FULL_SPEED * fastest
        full = [
            ratio
            for ratio, mine, theirs in zip(ratios, probes, base_probes, strict=True)
            if max(mine) <= limit and max(theirs) <= limit
        ]
        if 0 < len(full) < len(ratios):
            text += f"; host at full speed in both: median {np.median(full):.3f} over {len(full)}"
    return text + "]"


def fastest_probe(rows: list[dict]) -> float | None:
    """The fastest host probe over ``rows``' runs (None where none was taken)."""
    readings = [min(p) for r in rows for p in r.get("probe_ms_runs", []) if min(p) > 0]
    return min(readings) if readings else None


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        series = sorted((r for r in rows if r["label"] == label), key=lambda r: r["concurrency"])
        style = dict(marker="o", lw=2.5 if label.startswith("adaptive") else 1.2)
        if label == "no spec":
            style.update(color="black", ls="--")
        x = [r["concurrency"] for r in series]
        left.plot(x, [r["tok_s"] for r in series], label=label, **style)
        user = [r["per_user_tok_s"] for r in series]
        right.plot(user, [r["tok_s"] for r in series], label=label, **style)
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrency (requests in flight)")
    left.set_ylabel("aggregate tok/s")
    left.set_title(f"throughput vs load ({title})", fontsize=9)
    right.set_xlabel("per-user tok/s (median 1/TPOT)")
    right.set_ylabel("aggregate tok/s")
    right.set_title("throughput vs per-user speed", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
