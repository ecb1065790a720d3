"""A/B of how ``ObservedDraftCost`` prices drafting depths not yet measured in a bucket,
on the CPU default: no speculation, fixed K = 1, adaptive with the flat extrapolation of
before (every depth priced at the one depth measured) and adaptive as shipped (shallower
depths ramp up to it from the undrafted steps' overhead), taking turns on the same
prompts in one process (the order reversed every other repeat), each run a fresh engine
with ``dspark bench``'s short warm-up (two requests per user, 64 tokens).

    PYTHONPATH=src python scripts/depth_prior_ab.py CONCURRENCY REPEATS [TEMPERATURE]

Prints each run's tok/s and steps by drafting depth, the medians, and each variant's
paired ratios to no speculation and to K = 1.
"""

import sys

import numpy as np
from gate_ab import cpu_bench_inputs  # scripts/ is on the path when run as a script

from dspark.bench.sweep import Setting, engine_for, measure
from dspark.engine.sampling import SamplingParams
from dspark.scheduling.cost import ObservedDraftCost


class _Flat(dict):
    """A ``_one_depth`` that never holds a depth: the flat extrapolation of before."""

    def __setitem__(self, key, value) -> None:
        pass


def main() -> None:
    concurrency, repeats = int(sys.argv[1]), int(sys.argv[2])
    temperature = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    args, loaded, warmup, measured, _ = cpu_bench_inputs(concurrency, "/tmp/depth-prior-ab")
    params = SamplingParams(temperature=temperature, max_tokens=64, seed=0)
    variants = ["none", "K=1", "adaptive flat", "adaptive ramp"]
    rates = {v: [] for v in variants}
    for repeat in range(repeats):
        order = variants if repeat % 2 == 0 else variants[::-1]
        for variant in order:
            spec, k = {"none": ("none", 0), "K=1": ("fixed", 1)}.get(variant, ("adaptive", 7))
            setting = Setting(spec, k)
            engine = engine_for(loaded, setting, concurrency, args)
            cost = getattr(engine.verifier, "cost_model", None)
            if variant == "adaptive flat" and isinstance(cost, ObservedDraftCost):
                cost._one_depth = _Flat()
            m = measure(engine, setting, measured, params, concurrency, warmup)
            rates[variant].append(m.tok_s)
            depths = dict(sorted(engine.stats.depth_steps.items())) if spec == "adaptive" else ""
            print(f"{repeat} {variant}: {m.tok_s:.2f} tok/s {depths}", flush=True)
    for variant in variants:
        print(variant, "median", round(float(np.median(rates[variant])), 2))
    for base in ("none", "K=1"):
        for variant in ("adaptive flat", "adaptive ramp"):
            paired = np.array(rates[variant]) / np.array(rates[base])
            print(
                f"{variant} / {base} paired",
                np.round(paired, 3),
                "median",
                round(float(np.median(paired)), 3),
            )


if __name__ == "__main__":
    main()
