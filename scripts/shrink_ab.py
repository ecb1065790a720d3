"""A/B of the plan's batch-level shrink in the engine: scaling the stale rows (the code)
against shifting them (before c418f39), adaptive only, the two taking turns on the same
prompts in one process (the embedded SmolLM2 and its drafter, on this CPU).

    PYTHONPATH=src python3 scripts/shrink_ab.py [CONCURRENCY] [REPEATS]

Prints each run's tok/s and the paired ratios (scale over shift, per repeat).
"""

import sys
from unittest import mock

import numpy as np
import torch

import dspark.scheduling.verifier as verifier_module
from dspark.bench.sweep import Setting, bench_prompts, engine_for, measure
from dspark.cli import build_parser
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def shifted(rows: np.ndarray, population: np.ndarray, weight: float) -> None:
    """The shrink before: every row moved by the batch mean's shift, clipped to [0, 1]."""
    is_prior = rows[:, -1] == 1.0
    if is_prior.all():
        return
    measured = rows[~is_prior]
    measured -= (1.0 - weight) * (measured.mean(axis=0) - population)
    rows[~is_prior] = np.clip(measured, 0.0, 1.0)


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    flags = ["--max-tokens", "64", "--min-requests", "8", "--requests-per-user", "2"]
    args = build_parser().parse_args(
        ["bench", "--concurrency", str(concurrency), *flags, "--out", "/tmp/shrink-ab"]
    )
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    count = max(args.min_requests, concurrency * args.requests_per_user)
    prompts = bench_prompts(loaded.tokenizer, args, 2 * count)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    setting = Setting("adaptive", 7)
    ways = {"scale": verifier_module._shrink_batch_level, "shift": shifted}
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for repeat in range(repeats):
        for name in list(ways) if repeat % 2 == 0 else list(ways)[::-1]:
            with mock.patch.object(verifier_module, "_shrink_batch_level", ways[name]):
                engine = engine_for(loaded, setting, concurrency, args)
                warmup, measured = prompts[:count], prompts[count:]
                run = measure(engine, setting, measured, params, concurrency, warmup)
            rates[name].append(run.tok_s)
            print(
                f"repeat {repeat} {name}: {run.tok_s:.1f} tok/s, verified "
                f"{run.verified_per_round:.2f} a round, accepted {run.acceptance_length:.2f}, "
                f"undrafted steps {run.undrafted_steps}",
                flush=True,
            )
    ratios = np.array(rates["scale"]) / np.array(rates["shift"])
    print(f"scale / shift, paired: {np.round(ratios, 3).tolist()}, median {np.median(ratios):.3f}")


if __name__ == "__main__":
    main()
