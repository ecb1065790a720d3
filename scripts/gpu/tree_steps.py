"""Per-step log of ``dspark bench``'s measured runs, for any source tree since session 21.

    PYTHONPATH=<tree>/src python3 scripts/gpu/tree_steps.py OUT.json -- <dspark bench args>
    python3 scripts/gpu/tree_steps.py --summarise A.json [B.json ...]

Runs ``dspark bench`` unchanged (its own parser, settings, warm-up and prompts) with
``LLMEngine.step`` wrapped: every step of every measured closed loop (not the warm-ups)
is logged with its setting, wall time, drafting depth (from ``EngineStats.depth_steps``),
decode rounds, drafts verified and tokens emitted, and after each measured run the
adaptive cost model's drafter prices at the run's concurrency, depth by depth (what it
learnt). Only what every tree since 2415998 has is read, so an older commit's ``src``
(``git archive REV src``) runs it too: the point is to tell whether two trees that run
adaptive at different speeds differ in what their steps cost or in the depths they pick.

``--summarise`` prints, per file and setting: steps, tokens a ms, and per drafting depth
the steps, their median wall time and the tokens a step emitted; then each setting's
time split three ways against the file's first setting (the fixed K): steps that
captured a graph, steps where every running request decoded ("full": no prompt chunk,
none finished), and the rest (a prompt chunk shared the step or requests left), with
the tokens a ms of the last two over the first setting's.
"""

import json
import sys
import time
from collections import Counter, defaultdict

import numpy as np


def record(out_path: str, bench_args: list[str]) -> None:
    from dspark import cli
    from dspark.bench import sweep
    from dspark.engine.engine import LLMEngine

    state = {"label": None, "loop": 0, "runs": []}
    steps: list[dict] = []

    original_step = LLMEngine.step

    def step(self):
        if state["loop"] != 2:  # the warm-up (loop 1) is not logged
            return original_step(self)
        stats = self.stats
        before = (
            stats.num_decode_rounds,
            stats.num_verified,
            stats.num_accepted,
            stats.num_generated,
            Counter(stats.depth_steps),
            self.num_captures(),
        )
        graphs = getattr(self, "graphs", None)  # the target's runner (CUDA graphs on)
        padded = (graphs.num_covered, graphs.covered_tokens) if graphs is not None else (0, 0)
        start = time.perf_counter()
        touched = original_step(self)
        wall_ms = (time.perf_counter() - start) * 1e3
        depth = [d for d, n in stats.depth_steps.items() if n != before[4].get(d, 0)]
        steps.append(
            {
                "label": state["label"],
                "run": len(state["runs"]),
                "wall_ms": wall_ms,
                "depth": depth[0] if depth else None,
                "rounds": stats.num_decode_rounds - before[0],
                "verified": stats.num_verified - before[1],
                "accepted": stats.num_accepted - before[2],
                "generated": stats.num_generated - before[3],
                "captured": self.num_captures() != before[5],
                # Replayed a larger captured shape than its own, padding this many tokens.
                "covered": graphs is not None and graphs.num_covered != padded[0],
                "padded_tokens": graphs.covered_tokens - padded[1] if graphs is not None else 0,
                "running": len(self.scheduler.running),
            }
        )
        return touched

    original_loop = sweep.closed_loop

    def closed_loop(*args, **kwargs):
        state["loop"] += 1
        return original_loop(*args, **kwargs)

    original_measure = sweep.measure

    def measure(engine, setting, *args, **kwargs):
        state["label"], state["loop"] = setting.label, 0
        result = original_measure(engine, setting, *args, **kwargs)
        state["loop"] = 0
        prices = None
        model = getattr(engine.verifier, "cost_model", None) if engine.verifier else None
        concurrency = args[2] if len(args) > 2 else kwargs.get("concurrency")
        if model is not None and hasattr(model, "draft_cost_ms"):
            prices = [float(model.draft_cost_ms(concurrency, d)) for d in range(1, 8)]
        state["runs"].append(
            {"label": setting.label, "tok_s": result.tok_s, "draft_prices_ms": prices}
        )
        return result

    LLMEngine.step = step
    sweep.closed_loop = closed_loop
    sweep.measure = measure
    try:
        cli.main(["bench", *bench_args])
    finally:
        with open(out_path, "w") as f:
            json.dump({"runs": state["runs"], "steps": steps}, f)


def summarise(paths: list[str]) -> None:
    for path in paths:
        log = json.load(open(path))
        print(f"== {path}")
        for run in log["runs"]:
            prices = run["draft_prices_ms"]
            shown = " ".join(f"{p:.2f}" for p in prices) if prices else "-"
            print(
                f"  run {run['label']:<12} {run['tok_s']:8.1f} tok/s  drafter prices "
                f"d=1..7 (ms): {shown}"
            )
        by_label = defaultdict(list)
        for s in log["steps"]:
            by_label[s["label"]].append(s)
        for label, rows in by_label.items():
            wall = sum(s["wall_ms"] for s in rows)
            tokens = sum(s["generated"] for s in rows)
            print(
                f"  {label:<12} steps {len(rows):4d}  {tokens / wall:6.2f} tok/ms  "
                f"captured {sum(s['captured'] for s in rows)}"
            )
            depths = defaultdict(list)
            for s in rows:
                if not s["captured"] and s["rounds"] and s["rounds"] == s["running"]:
                    depths[s["depth"]].append(s)
            for depth in sorted(depths, key=lambda d: -1 if d is None else d):
                group = depths[depth]
                ms = np.median([s["wall_ms"] for s in group])
                per_step = np.mean([s["generated"] for s in group])
                verified = np.mean([s["verified"] / s["rounds"] for s in group])
                covered = sum(s.get("covered", False) for s in group)
                print(
                    f"    depth {depth!s:>4}: {len(group):4d} steps  median "
                    f"{ms:6.2f} ms  {per_step:7.1f} tokens/step  {verified:4.2f} "
                    f"verified/round  {per_step / ms:6.2f} tok/ms  {covered} covered"
                )
        split = {label: _split(rows) for label, rows in by_label.items()}
        base = next(iter(split.values()), None)
        for label, parts in split.items():
            total = sum(ms for ms, _ in parts.values())
            rates = []
            for kind in ("full", "rest"):
                ms, tokens = parts[kind]
                base_ms, base_tokens = base[kind]
                ratio = (tokens / ms) / (base_tokens / base_ms) if ms and base_ms else float("nan")
                rates.append(f"{kind} {ms:6.0f} ms {ratio:5.3f}x")
            print(
                f"  {label:<16} {total:6.0f} ms: captures {parts['captured'][0]:5.0f} ms, "
                + ", ".join(rates)
            )


def _split(rows: list[dict]) -> dict[str, tuple[float, int]]:
    """(wall ms, tokens) of the steps that captured, full-batch decodes, and the rest."""
    parts = {"captured": [0.0, 0], "full": [0.0, 0], "rest": [0.0, 0]}
    for s in rows:
        kind = (
            "captured"
            if s["captured"]
            else ("full" if s["rounds"] and s["rounds"] == s["running"] else "rest")
        )
        parts[kind][0] += s["wall_ms"]
        parts[kind][1] += s["generated"]
    return {kind: (ms, tokens) for kind, (ms, tokens) in parts.items()}


if __name__ == "__main__":
    if sys.argv[1] == "--summarise":
        summarise(sys.argv[2:])
    else:
        split = sys.argv.index("--")
        record(sys.argv[1], sys.argv[split + 1 :])
