"""Two-token target forwards in closed loops on this CPU: K = 1, adaptive, and adaptive
with its decisions replaced by "one deep, admit every draft" (``stub``).

SmolLM2 with its shipped drafter, one request at a time, four warm-up requests then four
measured ones of 64 tokens, for each engine in turn, twice; prints per engine and round
the median time of its forwards that verified exactly two tokens (one-deep steps), how
many there were, and the median drafter time. Asks whether adaptive's one-deep steps
carry a slower forward than K = 1's in the loop, as two step traces suggested (docs/bench/cpu.md,
session 23).

    PYTHONPATH=src python scripts/cpu_closed_loop_forward.py
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import step_trace

from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def run(loaded, prompts, params, name: str) -> tuple[float, int, float]:
    args = step_trace.Args
    setting = Setting("fixed", 1) if name == "K=1" else Setting("adaptive", 7)
    engine = engine_for(loaded, setting, 1, args, None)
    if name == "stub":

        def one_deep(batch, limits, *rest):
            engine._priced_step = (1, 1, 1, 0)
            engine.stats.depth_steps[1] += 1
            return 1

        engine._drafting_depth = one_deep
        engine._admit_adaptively = lambda batch, drafts, proposal: None
    closed_loop(engine, prompts[:4], params, 1)
    engine.stats.__init__()
    forwards = []
    forward = engine.forward

    def timed(tables, num_cached, num_query, tokens):
        start = time.perf_counter()
        out = forward(tables, num_cached, num_query, tokens)
        if len(num_query) == 1 and num_query[0] == 2:
            forwards.append((time.perf_counter() - start) * 1e3)
        return out

    engine.forward = timed
    closed_loop(engine, prompts[4:], params, 1)
    drafter = np.median(engine.stats.drafter_ms) if engine.stats.drafter_ms else 0.0
    return float(np.median(forwards)), len(forwards), float(drafter)


def main() -> None:
    args = step_trace.Args
    args.device, args.shape, args.max_tokens = "cpu", None, 64
    loaded = load_model(None, torch.float32, "cpu")
    prompts = bench_prompts(None, args, 8)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    for round_ in range(2):
        for name in ("K=1", "adaptive", "stub"):
            median, count, drafter = run(loaded, prompts, params, name)
            print(
                f"round {round_} {name:8s} two-token forward median {median:6.2f} ms "
                f"({count} steps), drafter median {drafter:5.2f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
