"""A/B of the gate's ``ALONE_SPEEDUP`` on the CPU default: adaptive only, the values
taking turns on the same prompts in one process, each run a fresh engine with the short
warm-up ``dspark bench`` uses (8 requests or two per user, 64 tokens, greedy).

    PYTHONPATH=src python scripts/gate_ab.py CONCURRENCY REPEATS 4,1

Prints each run's tok/s, vetoes and undrafted steps, the medians and the paired median
ratio of the first value over the second.
"""

import argparse
import sys

import numpy as np
import torch

import dspark.scheduling.gate as gate
from dspark.bench import sweep
from dspark.bench.sweep import Setting, bench_prompts, engine_for, measure
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def cpu_bench_inputs(concurrency: int, out: str):
    """What ``dspark bench`` runs at ``concurrency`` on the CPU default (64 tokens, greedy,
    two requests per user, the short warm-up): ``(args, loaded, warmup, measured, params)``."""
    parser = argparse.ArgumentParser()
    sweep.add_cli_args(parser)
    args = parser.parse_args(
        ["--concurrency", str(concurrency), "--max-tokens", "64", "--out", out]
    )
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    count = max(8, concurrency * 2)
    prompts = bench_prompts(loaded.tokenizer, args, count + concurrency)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    return args, loaded, prompts[:concurrency], prompts[concurrency:], params


def main() -> None:
    concurrency, repeats = int(sys.argv[1]), int(sys.argv[2])
    variants = [int(v) for v in sys.argv[3].split(",")]
    args, loaded, warmup, measured, params = cpu_bench_inputs(concurrency, "/tmp/gate-ab")
    setting = Setting("adaptive", 7)
    rates = {v: [] for v in variants}
    for repeat in range(repeats):
        for value in variants:
            gate.ALONE_SPEEDUP = value
            engine = engine_for(loaded, setting, concurrency, args)
            m = measure(engine, setting, measured, params, concurrency, warmup)
            rates[value].append(m.tok_s)
            print(
                repeat,
                value,
                round(m.tok_s, 2),
                "vetoes",
                m.gate_vetoes,
                "undrafted",
                m.undrafted_steps,
                flush=True,
            )
    for value in variants:
        print(
            value,
            "median",
            round(float(np.median(rates[value])), 2),
            [round(x, 2) for x in rates[value]],
        )
    first, second = (np.array(rates[v]) for v in variants[:2])
    print("paired ratio median", round(float(np.median(first / second)), 3))


if __name__ == "__main__":
    main()
