"""Acceptance and the drafter's time at a fixed K with the DSpark drafter's block pass run
over the deepest draft's positions and EXTRA mask tokens after them (the engine's
``draft_block="cut"`` is EXTRA = 1), or over the whole block (EXTRA = -1,
``draft_block="full"``): SmolLM2 and its shipped drafter on this CPU, greedy, a closed
loop of 40 held-out ShareGPT prompts, 48 new tokens each.

    PYTHONPATH=src .venv/bin/python scripts/cpu_block_cut_acceptance.py K CONCURRENCY EXTRA

Session 44 (``docs/results/bench/cpu_session44_draft_block/README.md``) ran the same
experiment as a patch of the code before the option existed.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
import time

import numpy as np
import torch

import dspark.engine.drafter as drafter_module
from dspark.bench.sweep import Setting, add_cli_args, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model

CUT = "width = min(k, depth + 1) if self.block_cut else k"


def cut_after(extra: int) -> None:
    """Have ``DSparkDrafter.propose`` run ``depth + extra`` block positions when cut."""
    source = textwrap.dedent(inspect.getsource(drafter_module.DSparkDrafter.propose))
    if CUT not in source:
        raise SystemExit("DSparkDrafter.propose no longer cuts as this script expects")
    source = source.replace(CUT, f"width = min(k, depth + {extra}) if self.block_cut else k")
    namespace = dict(vars(drafter_module))
    exec(source, namespace)  # the method's own source, one line changed
    drafter_module.DSparkDrafter.propose = namespace["propose"]


def main() -> None:
    k, concurrency, extra = (int(a) for a in sys.argv[1:4])
    if extra >= 0:
        cut_after(extra)
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(["--out", "/tmp/block-cut", "--device", "cpu"])
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    prompts = bench_prompts(loaded.tokenizer, args, 40)
    params = SamplingParams(temperature=0.0, max_tokens=48)
    engine = engine_for(loaded, Setting("fixed", k), concurrency, args)
    engine.drafter.block_cut = extra >= 0
    start = time.perf_counter()
    closed_loop(engine, prompts, params, concurrency)
    seconds = time.perf_counter() - start
    stats = engine.stats
    print(
        f"K={k} at {concurrency}, "
        + ("whole block" if extra < 0 else f"depth + {extra} positions")
        + f": acceptance length {stats.num_accepted / stats.num_decode_rounds:.3f}, "
        f"drafter median {np.median(stats.drafter_ms):.2f} ms, {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
