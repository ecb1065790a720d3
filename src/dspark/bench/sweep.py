"""``dspark bench``: no speculation vs every fixed K vs adaptive verification, across load.

Every configuration runs the same held-out prompts on the same engine settings with the
same drafter (by default the model's shipped DSpark drafter, else n-gram).

A closed loop per concurrency level: that many requests are in flight at all times (a
finished one is replaced by the next prompt) until the level's requests are done, after a
shorter warm-up loop on other prompts at the same level (graphs captured, adaptive step
costs measured: the steady state of a serving engine). The engine captures CUDA graphs
lazily, the first time it meets a step shape; ``--full-warmup`` warms up as long as the
measured run, which meets nearly every shape. Captures met while measuring are start-up
cost: aggregate ``tok_s`` leaves them out, ``tok_s_wall`` keeps them, ``capture_steps``
and ``capture_s`` count them. Repeats are interleaved (repeat 1 of every configuration,
then repeat 2, ...), a level's settings reversed on every other repeat, so that drifts of
the machine's speed spread over all of them.

``--slice-ms``: time-sliced runs, for machines whose speed wanders within seconds. Per
level every setting's engine is built and warmed once and kept; each repeat is then a
window in which every engine runs ``--window-s`` of its own time in round-robin turns of
``--slice-ms``, its closed loop refilled so that it never drains: every setting is
measured over the same stretch of wall time, at steady state. TPOT leaves out the other
engines' turns (``LLMEngine.idle_s``). A level's engines are all alive at once, so they
must fit in memory side by side.

Per configuration and level it reports aggregate tok/s, per-user tok/s and TPOT p50/p99
from each request's own timestamps (first token to finish), acceptance length (tokens per
decode round, bonus included), verified tokens per round and, for adaptive, the share of
wall time spent choosing the budget and allocating drafts. Tables quote medians; with
several repeats the comparisons also quote paired ratios within each repeat, less exposed
to drift. Writes a table, bench.json and bench.png to ``--out`` (and steps.json with
``--step-log``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import signal
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.bench.build import Replay, bench_prompts, engine_for
from dspark.bench.loops import SlicedLoop, measure, sliced_windows, warm_up
from dspark.bench.measurement import Measurement, summarise
from dspark.bench.report import report
from dspark.bench.settings import Setting, checked_variants, job_order
from dspark.bench.step_log import StepLog
from dspark.engine.cli import add_tensor_parallel_arg
from dspark.engine.graphs import CAPTURE_AFTER_WASTE
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model, resolve_dtype, resolve_model_path
from dspark.models.parallel import TensorShard
from dspark.models.shapes import SHAPES, random_model

CPU_SLICE_MS = 250.0
"""``--slice-ms`` on a CPU unless given: a CPU host's speed moves whole runs with its
phases, and time slices put every setting in the same phases."""

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


def _padding_budget(text: str) -> float:
    """``--graph-padding-budget``: a number of steps >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    cuda = torch.cuda.is_available()
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    add_tensor_parallel_arg(parser)
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
        help="also run adaptive with these EngineConfig or AdaptiveConfig fields changed, "
        "as a setting labelled 'adaptive≤K TAG' in the same interleaved repeats, compared "
        "with plain adaptive pairwise (an in-run A/B; e.g. ns:settle=off); repeatable",
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
        f"{CPU_SLICE_MS:g} on CPU, where a whole run moves with the host's speed; 0 on CUDA)",
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
        "dspark.engine.stats.StepRecord), for scripts/step_log.py",
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
        "captured one before it is captured itself (0: capture every new shape at once)",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="with --shape: acceptance trace (.npz from AcceptanceTrace.save), or "
        "published:DOMAIN[:DRAFTER] (chat, math or code; synthetic rounds matching the DSpark "
        "paper's per-position acceptance); default: the shipped SmolLM2 drafter trace on "
        "held-out ShareGPT",
    )


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
    dtype = resolve_dtype(args.dtype, args.device)
    replay = None
    if args.shape and args.tensor_parallel_size > 1:
        raise ValueError(
            "--shape builds a random model in this process; --tensor-parallel-size needs a "
            "model directory every rank can load its shard from (--model)"
        )
    if args.shape:
        loaded = random_model(args.shape, dtype=dtype, device=args.device)
        replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve(args.trace))
        print(
            f"[dspark] {args.shape} with random weights: acceptance is REPLAYED from "
            f"{replay.trace.source} ({replay.trace.acceptance_length:.3f} tokens/round at "
            f"full K={replay.trace.num_positions})"
        )
    else:
        shard = TensorShard(0, args.tensor_parallel_size) if args.tensor_parallel_size > 1 else None
        loaded = load_model(args.model, dtype=dtype, device=args.device, shard=shard)
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
        engine.close()  # its tensor-parallel workers, if any
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
        for loop in loops:
            loop.engine.close()  # their tensor-parallel workers, if any
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


def _write_partial(args, runs: dict) -> None:
    partial = [asdict(m) for ms in runs.values() for m in ms]  # survives an interruption
    (Path(args.out) / "bench.partial.json").write_text(json.dumps(partial))
