"""No speculation against adaptive held undrafted, time-sliced, on this CPU.

SmolLM2 with its shipped drafter at 4 requests: adaptive with every drafting decision
forced to 0 and no throughput gate, so it does no speculation's work plus adaptive's own
per-step host work (decisions, the target's captured features); the two engines run in
turns of 250 ms through windows of 6 s each (``dspark bench --slice-ms``), so both meet
the VM's phases alike. Prints each window's tok/s, step time and phase medians.

    PYTHONPATH=src python scripts/cpu_undrafted_sliced.py [WINDOWS]

Session 40: four windows, adaptive / no speculation 0.996, 0.923, 0.997, 1.032.
"""

import argparse
import sys

import torch

from dspark.bench.sweep import (
    Setting,
    SlicedLoop,
    add_cli_args,
    bench_prompts,
    engine_for,
    sliced_windows,
    warm_up,
)
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model

CONCURRENCY = 4


def main() -> None:
    windows = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(["--out", "/tmp/cpu_undrafted_sliced", "--device", "cpu"])
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    prompts = bench_prompts(loaded.tokenizer, args, 4 * CONCURRENCY)
    params = SamplingParams(temperature=0.0, max_tokens=48)
    loops = []
    for setting in (Setting("none", 0), Setting("adaptive", 7)):
        engine = engine_for(loaded, setting, CONCURRENCY, args)
        if setting.spec == "adaptive":
            engine.gate = None
            engine.verifier.drafting_pays = lambda *a, **k: 0
        warm_up(engine, params, CONCURRENCY, prompts[:CONCURRENCY], False)
        loops.append(SlicedLoop(engine, setting, prompts[CONCURRENCY:], params, CONCURRENCY))
    for _ in range(windows):
        none, held = sliced_windows(loops, 6.0, 0.25)
        print(
            f"no spec {none.tok_s:.2f} tok/s ({none.step_ms:.1f} ms a step), held undrafted "
            f"{held.tok_s:.2f} ({held.step_ms:.1f} ms): {held.tok_s / none.tok_s:.3f}x; "
            f"phases {none.phase_ms} / {held.phase_ms}",
            flush=True,
        )


if __name__ == "__main__":
    main()
