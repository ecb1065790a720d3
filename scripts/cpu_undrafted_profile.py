"""Where adaptive's undrafted steps spend time beyond no speculation's, on this CPU at 4
requests: both engines (adaptive with every decision undrafted and the gate's probes off,
as ``cpu_undrafted_ab.py``) run the same closed loop, timed three times alternating, then
once each under cProfile.

    PYTHONPATH=src .venv/bin/python scripts/cpu_undrafted_profile.py

Session 36 (0d3a245; ``docs/results/bench/cpu_session36_c4never/profile_summary.txt``):
timed, the undrafted engine took 0.96x, 1.18x and 1.12x no speculation's seconds, and in
a second run 1.07x, 1.00x and 0.96x; under cProfile both did the same work (6.62 and 6.55
s, 2.97 s of it in ``torch.mm`` for each, and 9 calls of the drafter's model besides), so
what differed between the timed runs was how long the same products took.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np
import torch

from dspark.bench.sweep import Setting, add_cli_args, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model
from dspark.scheduling import gate
from dspark.scheduling.verifier import AdaptiveVerifier

CONCURRENCY = 4
REPEATS = 3


def main() -> None:
    AdaptiveVerifier.drafting_pays = lambda self, *args, **kwargs: 0
    gate.ThroughputGate.should_probe = lambda self, *args, **kwargs: False
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(["--out", "/tmp/cpu_undrafted_profile", "--device", "cpu"])
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    prompts = bench_prompts(loaded.tokenizer, args, 3 * CONCURRENCY)
    warmup, measured = prompts[:CONCURRENCY], prompts[CONCURRENCY:]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    engines = {
        s.label: engine_for(loaded, s, CONCURRENCY, args)
        for s in (Setting("none", 0), Setting("adaptive", 7))
    }
    for engine in engines.values():
        closed_loop(engine, warmup, params, CONCURRENCY)
    for repeat in range(REPEATS):
        for name, engine in engines.items():
            engine.stats.__init__()
            start = time.perf_counter()
            closed_loop(engine, measured, params, CONCURRENCY)
            seconds = time.perf_counter() - start
            forward = float(np.median(engine.stats.forward_ms))
            print(f"{repeat} {name}: {seconds:.2f} s, forward median {forward:.1f} ms")
    for name, engine in engines.items():
        profile = cProfile.Profile()
        profile.enable()
        closed_loop(engine, measured, params, CONCURRENCY)
        profile.disable()
        print(f"===== {name}")
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
