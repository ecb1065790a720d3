"""Where adaptive verification's time goes, step by step, against a fixed K on the GPU.

The 8B shape (random weights, replayed acceptance), closed loop at one concurrency as
``dspark bench`` runs it (same engine settings, warm-up, prompts), each setting measured
``REPEATS`` times, interleaved. Every measured step is classified (prefill in the batch,
graph captured, drafted or undrafted decode, budget below the drafts or not) and the
table gives, per class, the steps, their wall time and the tokens they emitted, so a gap
in tok/s can be traced to the steps that make it.

    PYTHONPATH=src python3 scripts/gpu/step_trace.py 4 7 [TRACE] [TOKENS] [REPEATS]

``MODEL=path.gguf`` (or ``MODEL=default``, the embedded SmolLM2) runs that model with its
shipped drafter instead (acceptance computed, the trace argument ignored);
``SETTINGS=none,fixed,adaptive`` picks the settings (default fixed,adaptive; at K, or
``fixed:3`` for another K; ``variant=TAG:FIELD=VALUE[,FIELD=VALUE]`` for adaptive with
EngineConfig fields changed, as ``dspark bench --variant``; separate the settings with
";" when a variant sets several fields); ``FULL_WARMUP=1`` warms up on as many
requests and tokens as are measured (``dspark bench --full-warmup``); ``PROFILE=1``
prints each setting's host hotspots (cProfile, first repeat; its overhead slows that
repeat, so read its table for shares, not its tok/s); ``TEMPERATURE=1`` samples
(default greedy); ``PHASES=1`` times the engine's host methods one by one
(``PARTS``); ``FORCE_DEPTH=3`` has every adaptive decision draft that deep (the
budget and allocation still run; the throughput gate is off), so the host work of
adaptive steps can be compared with a fixed K's where drafting would not pay
(``SHAPE=tiny DEVICE=cpu``); a setting ``adaptive@2`` forces that one setting's
decisions 2 deep. ``COUNT=64`` measures that many requests (default twice the
concurrency, at least 4).
"""

import cProfile
import gc
import os
import pstats
import sys
import time
from collections import defaultdict

import numpy as np
import torch

from dspark.bench.sweep import (
    Replay,
    Setting,
    bench_prompts,
    closed_loop,
    engine_for,
    parse_variant,
)
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model
from dspark.models.shapes import random_model


class Args:
    out = "/tmp/step-trace"
    device = os.environ.get("DEVICE", "cuda")
    drafter = "auto"
    max_prompt_tokens = 256
    max_tokens = 256
    shape = os.environ.get("SHAPE", "llama3-8b")  # SHAPE=tiny DEVICE=cpu: a smoke test
    prompts = ".gpu/prompts.npz"
    dataset = "sharegpt"
    graph_padding_budget = 4.0  # as dspark bench (CAPTURE_AFTER_WASTE)


def forward_probe(engine) -> dict:
    """Splits each step's forward phase (``EngineStats.forward_ms``: from queueing the
    target until its outputs are on the host) into the host's ``engine.forward`` call
    (staging the batch, launching the graph: ``prep``), the look-ahead's host work
    (``la``) and the target graph's own device time between CUDA events around its
    replay (``gpu``; eager steps: none). Filled per step; ``take`` reads and clears it."""
    probe: dict = {"prep": None, "la": None, "events": None}
    forward, look_ahead = engine.forward, getattr(engine, "_look_ahead", None)

    def timed_forward(*args, **kwargs):
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        probe["prep"] = (time.perf_counter() - start) * 1e3
        return out

    def timed_look_ahead(*args, **kwargs):
        start = time.perf_counter()
        out = look_ahead(*args, **kwargs)
        probe["la"] = (time.perf_counter() - start) * 1e3
        return out

    engine.forward = timed_forward
    if look_ahead is not None:
        engine._look_ahead = timed_look_ahead
    runner = engine.graphs
    if runner is not None and runner.capture:
        graph = runner._graph

        def timed_graph(shape):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = graph(shape)
            end.record()
            probe["events"] = (begin, end)
            return out

        runner._graph = timed_graph

    def take() -> dict:
        events = probe["events"]
        gpu = None
        if events is not None:
            events[1].synchronize()
            gpu = events[0].elapsed_time(events[1])
        out = {"prep": probe["prep"], "la": probe["la"], "gpu": gpu}
        probe.update(prep=None, la=None, events=None)
        return out

    probe["take"] = take
    return probe


PARTS = (
    "_batch_shape",
    "_drafting_depth",
    "_timed_flush",
    "_plan_while_drafting",
    "_shared_budget",
    "_reuses",
    "_admit_adaptively",
    "_filled_budget",
    "_clock",
    "_to_device",
    "_apply",
    "_take_flush_cost",
)
"""``PHASES=1``: the engine methods timed one by one within each step (host ms summed per
step; ``_clock`` is the device synchronisations around the timed phases), besides the
plan run while the drafter's passes are queued (``plan in draft``), the gate's record
(``gate record``), the allocation (``allocate_drafts``) and the scheduler's
``schedule`` (``schedule``). Nested methods count in their callers too. The allocation
is wrapped module-wide: with several engines alive, the latest one wrapped counts every
engine's allocations (step_trace runs one setting at a time)."""


def time_parts(engine) -> dict:
    """Wraps ``PARTS`` (and the plan made while drafting, and the gate's record) with
    timers; returns the per-step sums, cleared by the caller."""
    parts: dict = defaultdict(float)

    def timed(name, method):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                parts[name] += (time.perf_counter() - start) * 1e3

        return wrapper

    for name in PARTS:
        method = getattr(engine, name, None)
        if method is None:
            continue
        if name == "_plan_while_drafting":

            def planning(*args, _method=method, **kwargs):
                start = time.perf_counter()
                plan = _method(*args, **kwargs)
                parts["_plan_while_drafting"] += (time.perf_counter() - start) * 1e3
                return None if plan is None else timed("plan in draft", plan)

            setattr(engine, name, planning)
        else:
            setattr(engine, name, timed(name, method))
    if engine.gate is not None:
        engine.gate.record = timed("gate record", engine.gate.record)
    import dspark.engine.engine as engine_module

    unwrapped = getattr(engine_module.allocate_drafts, "unwrapped", engine_module.allocate_drafts)
    engine_module.allocate_drafts = timed("allocate_drafts", unwrapped)
    engine_module.allocate_drafts.unwrapped = unwrapped
    return parts


def traced(engine, log):
    step, schedule = engine.step, engine.scheduler.schedule
    scheduled = []
    probe = forward_probe(engine)
    parts = time_parts(engine) if os.environ.get("PHASES") else None

    def schedule_logged(*args, **kwargs):
        start = time.perf_counter()
        chunks = schedule(*args, **kwargs)
        if parts is not None:
            parts["schedule"] += (time.perf_counter() - start) * 1e3
        # Before the step computes them: which chunks decode, and the prompt tokens.
        scheduled.append(
            ([c.is_decode for c in chunks], sum(c.num_tokens for c in chunks if not c.is_decode))
        )
        return chunks

    def wrapped():
        stats = engine.stats
        generated, captures = stats.num_generated, engine.num_captures()
        undrafted, budgets = stats.depth_steps[0], len(stats.budgets)
        proposals, forwards, applies, phases = (
            len(stats.drafter_ms),
            len(stats.forward_ms),
            len(stats.apply_ms),
            len(stats.draft_phase_ms),
        )
        scheduled.clear()
        probe["take"]()
        if parts is not None:
            parts.clear()
        start = time.perf_counter()
        out = step()
        wall = (time.perf_counter() - start) * 1e3
        split = probe["take"]()
        chunks, prompt_tokens = scheduled[0] if scheduled else ([], 0)
        log.append(
            {
                "wall": wall,
                "tokens": stats.num_generated - generated,
                "capture": engine.num_captures() > captures,
                "decode": bool(chunks) and all(chunks),
                "num_reqs": len(chunks),
                "prompt_tokens": prompt_tokens,
                "undrafted": stats.depth_steps[0] > undrafted,
                "budget": stats.budgets[-1] if len(stats.budgets) > budgets else None,
                "depth": (engine._priced_step or (0, 0, None, 0))[2],
                "drafter": stats.drafter_ms[-1] if len(stats.drafter_ms) > proposals else None,
                "forward": stats.forward_ms[-1] if len(stats.forward_ms) > forwards else None,
                "apply": stats.apply_ms[-1] if len(stats.apply_ms) > applies else None,
                "phase": (stats.draft_phase_ms[-1] if len(stats.draft_phase_ms) > phases else None),
                "parts": dict(parts) if parts is not None else None,
                **split,
            }
        )
        return out

    engine.step = wrapped
    engine.scheduler.schedule = schedule_logged


def busy_host_work(engine, micros: float, asleep: bool = False) -> None:
    """After each target forward is queued (where the look-ahead runs), ``micros`` of
    small NumPy calls on the host, as the look-ahead's own (``asleep``: that long asleep
    instead)."""
    logits = engine.model.logits
    rng = np.random.default_rng(0)
    rows = rng.random((16, 7))

    def queued_then_busy(hidden):
        out = logits(hidden)
        if asleep:
            time.sleep(micros * 1e-6)
            return out
        end = time.perf_counter() + micros * 1e-6
        while time.perf_counter() < end:
            np.cumprod(rows, axis=1).ravel().argsort()
        return out

    engine.model.logits = queued_then_busy


def force_depth(verifier, depth: int) -> None:
    """``FORCE_DEPTH``: ``drafting_pays`` priced as usual, then answering ``depth``."""
    priced = verifier.drafting_pays

    def forced(*args, **kwargs):
        priced(*args, **kwargs)
        verifier.probe_depth = depth
        return depth

    verifier.drafting_pays = forced


def classify(entry, adaptive):
    if entry["capture"]:
        return "graph captured"
    if not entry["decode"]:
        if adaptive and entry["depth"] and not entry["undrafted"]:
            return "prompt in batch, drafted"
        return "prompt in batch"
    if not adaptive:
        return "decode"
    if entry["undrafted"] or not entry["depth"]:
        return "decode, undrafted"
    depth = entry["depth"]
    if entry["budget"] is not None and entry["budget"] < entry["num_reqs"] * depth:
        return f"decode d={depth}, budget cut"
    return f"decode d={depth}, all verified"


def print_by_batch_size(log, adaptive):
    """Decode steps (no capture, no prompt) per batch size: drafted and undrafted, and the
    drafted steps right after an undrafted one (they carry the drafter's held-back
    context updates), as steps, ms per step and tokens per step."""
    rows = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0]))
    previous_undrafted = False
    for entry in log:
        kind = classify(entry, adaptive)
        if kind.startswith("decode"):
            if kind == "decode, undrafted":
                arm = "undrafted"
            else:
                arm = "drafted after undrafted" if previous_undrafted else "drafted"
            row = rows[entry["num_reqs"]][arm]
            row[0] += 1
            row[1] += entry["wall"]
            row[2] += entry["tokens"]
        previous_undrafted = kind == "decode, undrafted"
    arms = ("drafted", "drafted after undrafted", "undrafted")
    print("  decode steps by batch size: steps, ms/step, tokens/step for " + " | ".join(arms))
    for size in sorted(rows):
        cells = []
        for arm in arms:
            steps, wall, toks = rows[size][arm]
            cells.append(
                f"{steps:>4} {wall / steps:6.2f} {toks / steps:6.2f}" if steps else " " * 18
            )
        print(f"  {size:>5}: " + " | ".join(cells))


def print_full_batch_by_depth(log, num_reqs, adaptive) -> None:
    """Decode steps of the full batch (``num_reqs`` requests, no prompt chunk, no capture)
    by drafting depth: steps, ms/step and tokens/step, the medians of the step's wall
    time and of its proposal, forward and apply phases, where what a deeper draft costs
    (and in which phase) and earns on this device shows without the batch size mixed in;
    the median of what the draft phase spends besides the proposal (``decide``: depth,
    budget, allocation) and of the step's wall outside the three phases (``rest``:
    scheduling, packing the batch, the gate's and cost model's records after apply);
    and for adaptive the depth chosen, step by step."""
    rows = defaultdict(lambda: [0, 0.0, 0, [], [], [], [], [], [], [], [], []])
    sequence = []
    for entry in log:
        if entry["num_reqs"] != num_reqs or not classify(entry, adaptive).startswith("decode"):
            continue
        depth = entry["depth"] if adaptive else "K"
        depth = 0 if entry["undrafted"] else depth
        sequence.append(str(depth))
        row = rows[depth]
        row[0] += 1
        row[1] += entry["wall"]
        row[2] += entry["tokens"]
        row[3].append(entry["wall"])
        for column, name in (
            (4, "drafter"),
            (5, "forward"),
            (6, "apply"),
            (9, "prep"),
            (10, "la"),
            (11, "gpu"),
        ):
            if entry[name] is not None:
                row[column].append(entry[name])
        if None not in (entry["phase"], entry["forward"], entry["apply"]):
            row[7].append(entry["phase"] - (entry["drafter"] or 0.0))
            row[8].append(entry["wall"] - entry["phase"] - entry["forward"] - entry["apply"])

    def p50(values):
        return np.median(values) if values else 0.0

    cells = [
        f"{depth}: {steps} x {wall / steps:.2f} ms (p50 {p50(walls):.2f}; drafter "
        f"{p50(drafter):.2f}, forward {p50(forward):.2f} [host call {p50(prep):.2f}, "
        f"look-ahead {p50(la):.2f}, graph on device {p50(gpu):.2f}], apply {p50(apply):.2f}, "
        f"decide {p50(decide):.3f}, rest {p50(rest):.3f}), {toks / steps:.1f} tok"
        for depth, (
            steps,
            wall,
            toks,
            walls,
            drafter,
            forward,
            apply,
            decide,
            rest,
            prep,
            la,
            gpu,
        ) in sorted(rows.items(), key=lambda kv: str(kv[0]))
    ]
    print(f"  full-batch ({num_reqs}) decode steps by depth:", "; ".join(cells) or "none")
    timed = [e for e in log if e.get("parts") is not None]
    if timed:  # PHASES=1: each timed method's median ms per full-batch step, by depth
        names = sorted({name for e in timed for name in e["parts"]})
        by_depth = defaultdict(list)
        for entry in timed:
            if entry["num_reqs"] != num_reqs or not classify(entry, adaptive).startswith("decode"):
                continue
            depth = 0 if entry["undrafted"] else (entry["depth"] if adaptive else "K")
            by_depth[depth].append(entry["parts"])
        for depth, entries in sorted(by_depth.items(), key=lambda kv: str(kv[0])):
            cells = ", ".join(
                f"{name} {np.median([e.get(name, 0.0) for e in entries]):.3f}" for name in names
            )
            print(f"    host parts, depth {depth} ({len(entries)} steps), median ms: {cells}")
        # Every drafted step, any batch (with a prompt chunk too): mean ms a step.
        drafted = [e for e in timed if not e["undrafted"] and e["depth"] and not e["capture"]]
        if drafted:
            cells = ", ".join(
                f"{name} {np.mean([e['parts'].get(name, 0.0) for e in drafted]):.3f}"
                for name in names
            )
            print(f"    host parts, every drafted step ({len(drafted)}), mean ms: {cells}")
    if adaptive and sequence:  # the depth chosen, step by step (runs: depth x count)
        runs = []
        for depth in sequence:
            if runs and runs[-1][0] == depth:
                runs[-1][1] += 1
            else:
                runs.append([depth, 1])
        print("  full-batch depth sequence:", " ".join(f"{d}x{n}" for d, n in runs))


def print_prices(verifier, num_reqs) -> None:
    """What the scheduler believes at the end of the run, for a full batch of decodes:
    the step's cost with b drafts, the drafter's price by depth (0: what an undrafted
    step adds), the population's survival and how well rounds predict each other."""
    model = verifier.cost_model
    costs = model.step_costs_ms(num_reqs, num_reqs, num_reqs * verifier.num_positions)
    picks = sorted({0, 1, 2, 4, num_reqs // 2, num_reqs, 2 * num_reqs, len(costs) - 1})
    print("  step cost by budget b (ms):", {b: round(float(costs[b]), 2) for b in picks})
    by_depth = getattr(model, "draft_costs_by_depth", None)
    if by_depth is not None:
        print("  drafter price by depth (ms):", np.round(by_depth(num_reqs, 7), 2).tolist())
    overhead = getattr(model, "_overhead", None)
    if overhead:  # ObservedDraftCost: ms the profile missed, (intercept, slope in depth)
        lines = {
            f"{'undrafted' if undrafted else 'drafted'} {1 << (bucket - 1)}+": (
                round(a, 2),
                round(b, 3),
            )
            for (bucket, undrafted), (a, b) in sorted(overhead.items())
        }
        print("  measured overhead lines (intercept ms, ms per depth):", lines)
    print(
        f"  population survival {np.round(verifier.population_survival, 3).tolist()}, "
        f"predictiveness {verifier.predictiveness:.3f}"
    )


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    trace = sys.argv[3] if len(sys.argv) > 3 else "published:chat"
    Args.max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    dtype = torch.bfloat16 if Args.device == "cuda" else torch.float32
    if os.environ.get("MODEL"):
        path = None if os.environ["MODEL"] == "default" else os.environ["MODEL"]  # SmolLM2
        loaded, replay, Args.shape = load_model(path, dtype, Args.device), None, None
    else:
        loaded = random_model(Args.shape, dtype, Args.device)
        replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve(trace))
    count = int(os.environ.get("COUNT", max(4, concurrency * 2)))  # measured requests
    full_warmup = os.environ.get("FULL_WARMUP") == "1"
    num_warm = count if full_warmup else concurrency
    prompts = bench_prompts(None, Args, count + num_warm)
    temperature = float(os.environ.get("TEMPERATURE", "0"))
    params = SamplingParams(temperature=temperature, max_tokens=Args.max_tokens)
    warm_tokens = Args.max_tokens if full_warmup else max(4, Args.max_tokens // 4)
    warm = SamplingParams(temperature=temperature, max_tokens=warm_tokens)
    settings, arms = [], []
    names = os.environ.get("SETTINGS", "fixed,adaptive")
    for name in names.split(";" if ";" in names else ","):  # ";" when a variant sets several
        # Diagnostic arms: "adaptive-nola" (the look-ahead off: every decision in the
        # step), "fixed:3+busy" (fixed K with BUSY_US of NumPy host work after each
        # forward is queued, where the look-ahead works: does host work there slow the
        # phases after it?), "fixed:3+sleep" (that time asleep instead: the device
        # idles alike, the host's caches stay as they were).
        if name.startswith("variant="):  # "variant=TAG:FIELD=VALUE": as dspark bench --variant
            settings.append(parse_variant(name.removeprefix("variant="), k))
            arms.append((name, False, False, False))
            continue
        if name.startswith("adaptive@"):  # "adaptive@2": adaptive, every decision 2 deep
            settings.append(Setting("adaptive", k))
            arms.append((name, False, False, False))
            continue
        base, sleep = name.removesuffix("+sleep"), name.endswith("+sleep")
        base, busy = base.removesuffix("+busy"), base.endswith("+busy")
        base, nola = base.removesuffix("-nola"), base.endswith("-nola")
        spec, _, depth = base.partition(":")
        settings.append(Setting(spec, 0 if spec == "none" else int(depth or k)))
        arms.append((name, nola, busy, sleep))
    for repeat in range(repeats):
        for setting, (arm, nola, busy, sleep) in zip(settings, arms, strict=True):
            engine = engine_for(loaded, setting, concurrency, Args, replay)
            if nola:
                engine.lookahead = False
            forced = arm.partition("@")[2] or os.environ.get("FORCE_DEPTH")
            if forced and engine.verifier is not None:
                force_depth(engine.verifier, int(forced))
                engine.gate = None  # nothing vetoes the forced depth
            if busy or sleep:
                busy_host_work(engine, float(os.environ.get("BUSY_US", "600")), sleep)
            closed_loop(engine, prompts[:num_warm], warm, concurrency)
            engine.stats.__init__()
            log = []
            traced(engine, log)
            target = engine.graphs
            target_runs = target.num_runs if target is not None else 0
            target_covered = target.num_covered if target is not None else 0
            target_padding = target.covered_tokens if target is not None else 0
            profiler = None
            if os.environ.get("PROFILE") and repeat == 0:  # host hotspots, first repeat
                profiler = cProfile.Profile()
                profiler.enable()
            finished, seconds = closed_loop(engine, prompts[num_warm:], params, concurrency)
            if profiler is not None:
                profiler.disable()
                print(f"\n--- cProfile, {setting.label}: top functions by own time ---")
                pstats.Stats(profiler).sort_stats("tottime").print_stats(22)
                print(f"--- cProfile, {setting.label}: the engine's host phases, cumulative ---")
                pstats.Stats(profiler).sort_stats("cumtime").print_stats(
                    r"engine\.py|verifier\.py|replay\.py|drafter\.py:\d+\(propose", 24
                )
            tokens = sum(len(r.output_ids) for r in finished)
            by_class = defaultdict(lambda: [0, 0.0, 0])
            for entry in log:
                row = by_class[classify(entry, setting.spec == "adaptive")]
                row[0] += 1
                row[1] += entry["wall"]
                row[2] += entry["tokens"]
            print(
                f"\n=== c{concurrency} {setting.label} [{arm}] (repeat {repeat}): {tokens} tokens "
                f"in {seconds:.3f} s ({tokens / seconds:.1f} tok/s), {len(log)} steps, step walls "
                f"sum {sum(e['wall'] for e in log) / 1e3:.3f} s"
            )
            header = ("class", "steps", "wall s", "ms/step", "tokens", "tok/ms")
            print("{:>28} {:>6} {:>8} {:>8} {:>7} {:>7}".format(*header))
            for name, (steps, wall, toks) in sorted(by_class.items(), key=lambda kv: -kv[1][1]):
                print(
                    f"{name:>28} {steps:>6} {wall / 1e3:>8.3f} {wall / steps:>8.2f} {toks:>7} "
                    f"{toks / wall:>7.3f}"
                )
            print_by_batch_size(log, setting.spec == "adaptive")
            print_full_batch_by_depth(log, concurrency, setting.spec == "adaptive")
            prompt_steps = [e for e in log if not e["decode"] and not e["capture"]]
            print(
                f"  steps with a prompt chunk: {sum(e['prompt_tokens'] for e in prompt_steps)} "
                "prompt tokens; (prompt tokens, requests, depth, ms, tokens emitted):",
                [
                    (e["prompt_tokens"], e["num_reqs"], e["depth"], round(e["wall"]), e["tokens"])
                    for e in prompt_steps
                ],
            )
            stats = engine.stats
            if engine.graphs is not None:
                runs = engine.graphs.num_runs - target_runs
                covered = engine.graphs.num_covered - target_covered
                extra = engine.graphs.covered_tokens - target_padding
                print(
                    f"  target steps that replayed a larger captured shape: {covered} of "
                    f"{runs} (padding tokens {extra / max(covered, 1):.1f} each)"
                )

            def med(values):
                return float(np.median(values)) if values else 0.0

            print(
                f"  medians per step, ms: forward {med(stats.forward_ms):.1f}, drafter "
                f"{med(stats.drafter_ms):.1f}, draft phase {med(stats.draft_phase_ms):.1f}, "
                f"apply {med(stats.apply_ms):.1f} (observe {med(stats.observe_ms):.1f})"
            )
            if setting.spec == "adaptive":
                walls = [e["wall"] for e in log if classify(e, True).startswith("decode d=")]
                walls = walls or [0.0]
                print(
                    f"  depth steps {dict(sorted(stats.depth_steps.items()))}, gate vetoes "
                    f"{stats.gate_vetoes}, probes {stats.probes}, lookahead hits "
                    f"{stats.lookahead_hits} plans {stats.lookahead_plans} (while drafting "
                    f"{stats.drafting_plans}, shares {getattr(stats, 'share_plans', 0)}) reused "
                    f"{stats.lookahead_reused}, schedule median "
                    f"{np.median(stats.schedule_ms) * 1e3:.0f} us, lookahead median "
                    f"{np.median(stats.lookahead_ms or [0]) * 1e3:.0f} us, drafted decode "
                    f"wall p50 {np.median(walls):.2f} p90 {np.percentile(walls, 90):.2f} ms"
                )
                if engine.gate is not None:
                    sizes = sorted({e["num_reqs"] for e in log})
                    for mixed in (False, True):
                        rates = {n: engine.gate.rates(n, mixed) for n in sizes}
                        kind = "with a prompt chunk" if mixed else "decoding"
                        print(f"  gate (drafted, undrafted) tok/ms by batch size, {kind}:", rates)
                budgets = [e["budget"] for e in log if e["budget"] is not None]
                if budgets:
                    print(f"  budgets: mean {np.mean(budgets):.1f}, first 40 {budgets[:40]}")
                print_prices(engine.verifier, concurrency)
            else:
                walls = [e["wall"] for e in log if classify(e, False) == "decode"]
                if walls:
                    p50, p90 = np.median(walls), np.percentile(walls, 90)
                    print(f"  decode wall p50 {p50:.2f} p90 {p90:.2f} ms")
            del engine
            gc.collect()  # its reference cycles, now (as dspark bench), not mid-capture
            if Args.device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
