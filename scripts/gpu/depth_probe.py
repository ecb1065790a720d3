"""What a drafted position really costs and earns: adaptive verification with the depth
drawn at random, step by step, so that neither the batch's confidences nor the time of
the run choose it (the engine's own choices are confounded with both: it drafts deeper
when confident, and its steps' cost drifts as contexts grow).

    MODEL=path.gguf PYTHONPATH=src python3 scripts/gpu/depth_probe.py CONC DEPTHS [TOKENS] [REPEATS]

SmolLM2 (``MODEL``, or ``MODEL=default``: the embedded one) with its shipped drafter, K = 7,
closed loop at ``CONC`` as ``dspark bench --full-warmup`` runs it, the throughput gate off
(it would veto some draws). ``DEPTHS`` (e.g. ``2,3,4,5``): each decision the verifier
makes (in the step, or ahead during the previous forward) is replaced by a uniform draw
from them; the budget is the verifier's own. Prints, per depth, over the full-batch
decode steps: steps, mean and median wall, the medians of the proposal, forward and apply
phases, tokens emitted per step, and the tokens the verifier expected (its survival,
shrunk as it plans, summed over the batch for the positions drafted, plus one per
request); then the marginal wall time and tokens of each depth over the one below, and
what the verifier's cost model prices that depth at the end of the run. The same table
for the engine's own choices (gate on) and for fixed K = 3 at the same concurrency, for
reference (``RUNS=random,own,fixed``, the default; the repeats interleaved), with the
host time of the draft phase outside the proposal and the scheduling's host time.
"""

import gc
import itertools
import os
import sys
import time
from collections import defaultdict

import numpy as np
import step_trace  # this directory's; the script's own directory is on sys.path
import torch

from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


class Args(step_trace.Args):  # what engine_for and bench_prompts read
    out = "/tmp/depth-probe"
    max_tokens = 128
    shape = None  # SmolLM2 with its shipped drafter, not a random-weight shape
    prompts = os.environ.get("PROMPTS", ".gpu/prompts.npz")


def expected_by_position(verifier, slots: np.ndarray) -> np.ndarray:
    """``[K]``: the survival the verifier plans the slots' coming round with, summed (with
    ``CAL=on``, corrected by the outcomes it learnt, as ``drafting_pays`` prices it)."""
    survival = verifier.predicted_survival(slots)
    if os.environ.get("CAL") == "on":
        survival *= verifier.calibration
        np.minimum.accumulate(survival, axis=1, out=survival)
        np.minimum(survival, 1.0, out=survival)
    return survival.sum(axis=0)


def latest(values, mark: int) -> float:
    """The sum of what ``values`` (a deque) gained since it held ``mark`` entries."""
    return sum(values[-i] for i in range(1, len(values) - mark + 1))


def instrument(engine, depths, rng, log, fixed=0):
    verifier = engine.verifier
    if depths:
        original = verifier.drafting_pays

        def drawn(*args, **kwargs):
            original(*args, **kwargs)  # keeps its side effects (probe depth)
            depth = int(rng.choice(depths))
            verifier.probe_depth = depth
            return depth

        verifier.drafting_pays = drawn
    step, schedule = engine.step, engine.scheduler.schedule
    seen = {}

    def schedule_logged(*args, **kwargs):
        chunks = schedule(*args, **kwargs)
        start = time.perf_counter()
        slots = np.array([c.request.slot for c in chunks if c.is_decode], dtype=np.int64)
        seen["decode"] = bool(chunks) and all(c.is_decode for c in chunks)
        seen["num_reqs"] = len(chunks)
        seen["expected"] = (
            expected_by_position(verifier, slots) if slots.size and verifier else None
        )
        # The probe's own bookkeeping is not the step's: it leaves the step's wall time
        # (else the adaptive runs, which compute the expectation, pay for it).
        seen["probe_ms"] = (time.perf_counter() - start) * 1e3
        return chunks

    def wrapped():
        stats = engine.stats
        generated, captures = stats.num_generated, engine.num_captures()
        marks = (len(stats.drafter_ms), len(stats.forward_ms), len(stats.apply_ms))
        phase_mark, schedule_mark = len(stats.draft_phase_ms), len(stats.schedule_ms)
        seen.clear()
        start = time.perf_counter()
        out = step()
        wall = (time.perf_counter() - start) * 1e3
        if seen:
            wall -= seen["probe_ms"]
            phases = [
                values[-1] if len(values) > mark else None
                for values, mark in zip(
                    (stats.drafter_ms, stats.forward_ms, stats.apply_ms), marks, strict=True
                )
            ]
            log.append(
                {
                    "wall": wall,
                    "tokens": stats.num_generated - generated,
                    "capture": engine.num_captures() > captures,
                    "decode": seen["decode"],
                    "num_reqs": seen["num_reqs"],
                    "depth": (engine._priced_step or (0, 0, fixed, 0))[2],
                    "expected": seen["expected"],
                    "drafter": phases[0],
                    "forward": phases[1],
                    "apply": phases[2],
                    "draft_phase": latest(stats.draft_phase_ms, phase_mark),
                    "schedule": latest(stats.schedule_ms, schedule_mark),
                }
            )
        return out

    engine.step = wrapped
    engine.scheduler.schedule = schedule_logged


def report(log, concurrency, label):
    rows = defaultdict(list)
    for e in log:
        if e["decode"] and not e["capture"] and e["num_reqs"] == concurrency:
            rows[e["depth"]].append(e)

    def med(entries, key):
        values = [e[key] for e in entries if e[key] is not None]
        return float(np.median(values)) if values else float("nan")

    print(f"--- {label}: full-batch ({concurrency}) decode steps by depth")
    print(
        "  depth  steps  wall mean  wall p50  drafter  forward  apply  other  tokens  expected"
        "  draft-host  schedule"
    )
    summary = {}
    for depth in sorted(rows):
        entries = rows[depth]
        wall = np.array([e["wall"] for e in entries])
        tokens = np.array([e["tokens"] for e in entries], dtype=float)
        expected = [
            concurrency + float(e["expected"][:depth].sum())
            for e in entries
            if e["expected"] is not None
        ]
        phases = [med(entries, k) for k in ("drafter", "forward", "apply")]
        draft_host = np.median([e["draft_phase"] - (e["drafter"] or 0.0) for e in entries])
        other = float(np.median(wall)) - sum(p for p in phases if np.isfinite(p))
        summary[depth] = (wall.mean(), tokens.mean(), len(entries))
        print(
            f"  {depth:>5} {len(entries):>6} {wall.mean():>10.3f} {np.median(wall):>9.3f} "
            f"{phases[0]:>8.3f} {phases[1]:>8.3f} {phases[2]:>6.3f} {other:>6.3f} "
            f"{tokens.mean():>7.2f} {np.mean(expected) if expected else float('nan'):>9.2f} "
            f"{draft_host:>11.3f} {med(entries, 'schedule'):>9.3f}"
        )
    ordered = sorted(summary)
    for low, high in itertools.pairwise(ordered):
        (w0, t0, n0), (w1, t1, n1) = summary[low], summary[high]
        rate = t1 / w1
        print(
            f"  {low}->{high}: +{w1 - w0:.3f} ms, +{t1 - t0:.2f} tokens per step "
            f"(tok/ms {t0 / w0:.3f} -> {rate:.3f}; {n0} and {n1} steps)"
        )
    return summary


def main() -> None:
    concurrency = int(sys.argv[1])
    depths = [int(d) for d in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 3, 4, 5]
    Args.max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    dtype = torch.bfloat16 if Args.device == "cuda" else torch.float32
    path = os.environ.get("MODEL", "default")
    loaded = load_model(None if path == "default" else path, dtype, Args.device)
    count = max(48, concurrency * 3)
    prompts = bench_prompts(None, Args, 2 * count)
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    rng = np.random.default_rng(0)
    calibrated = os.environ.get("CAL") == "on"  # EngineConfig.calibrate_survival
    margin = float(os.environ.get("MARGIN", "0"))  # EngineConfig.depth_margin
    overrides = (("calibrate_survival", calibrated), ("depth_margin", margin))
    adaptive = Setting("adaptive", 7, "", overrides)
    runs = {
        "random": ("random depth " + ",".join(map(str, depths)), adaptive, depths),
        "own": ("engine's own depth", adaptive, None),
        "fixed": ("fixed K = 3", Setting("fixed", 3), None),
    }
    chosen = [runs[name] for name in os.environ.get("RUNS", "random,own,fixed").split(",")]
    logs = {label: [] for label, _, _ in chosen}
    # Interleaved: repeat r of every setting before repeat r + 1 of any.
    for label, setting, drawn in [run for _ in range(repeats) for run in chosen]:
        log = logs[label]
        engine = engine_for(loaded, setting, concurrency, Args)
        if drawn:
            engine.gate = None  # every draw is drafted
        if os.environ.get("LOOKAHEAD") == "on" and engine.verifier is not None:
            engine.lookahead = True  # as on CUDA (for a CPU run of the host's share)
        closed_loop(engine, prompts[:count], params, concurrency)  # warm-up, as measured
        engine.stats.__init__()
        instrument(engine, drawn, rng, log, setting.k if setting.spec == "fixed" else 0)
        finished, seconds = closed_loop(engine, prompts[count:], params, concurrency)
        tokens = sum(len(r.output_ids) for r in finished)
        print(f"{label}: {tokens} tokens in {seconds:.3f} s ({tokens / seconds:.1f} tok/s)")
        stats = engine.stats
        print(
            f"  tokens a decode round {stats.acceptance_length:.3f}, verified a round "
            f"{stats.verified_per_step:.3f}, budgets below the drafts: "
            f"{getattr(stats, 'budget_cuts', 'n/a')}"
        )
        model = engine.verifier.cost_model if engine.verifier is not None else None
        by_depth = getattr(model, "draft_costs_by_depth", None)
        if by_depth is not None:
            print(
                "  drafter price by depth at the end (ms):",
                np.round(by_depth(concurrency, 7), 3).tolist(),
            )
            verify = model.step_costs_ms(concurrency, concurrency, 7 * concurrency)
            print(
                f"  target step price at 0, {concurrency}, ... {7 * concurrency} drafts (ms):",
                np.round(verify[::concurrency], 3).tolist(),
            )
        if engine.verifier is not None and calibrated:
            print(
                "  survival calibration by position at the end:",
                np.round(engine.verifier.calibration, 3).tolist(),
            )
        # Drop the wrappers (they close over the engine) so that the engine is freed
        # now: dead engines left to the cycle collector slow every later gen-2 pass.
        del engine.step, engine.scheduler.schedule
        del engine
        gc.collect()
        if Args.device == "cuda":
            torch.cuda.empty_cache()
    for label, log in logs.items():
        report(log, concurrency, label)


if __name__ == "__main__":
    main()
