"""A/B of a margin on the gate's drafted arm on the CPU default: no speculation, adaptive
as shipped and adaptive whose gate drafts only when the drafted arm's upper bound beats
the undrafted one's by ``MARGIN`` (the bound divided by it), taking turns on the same
prompts in one process, each run a fresh engine with ``dspark bench``'s short warm-up
(two requests per user, 64 tokens, greedy). An experiment, not shipped behaviour.

    PYTHONPATH=src python scripts/gate_margin_ab.py CONCURRENCY REPEATS [MARGIN]

Prints each run's tok/s, vetoes and undrafted steps, the medians, and each adaptive
variant's paired ratios to no speculation.
"""

import sys

import numpy as np
from gate_ab import cpu_bench_inputs  # scripts/ is on the path when run as a script

import dspark.scheduling.gate as gate
from dspark.bench.sweep import Setting, engine_for, measure

_MARGIN = [1.0]
_UPPER_BOUND = gate._Bucket.upper_bound


def _upper_bound_with_margin(self, arm: int, confidence: float) -> float:
    bound = _UPPER_BOUND(self, arm, confidence)
    return bound / _MARGIN[0] if arm == gate.DRAFTED else bound


def main() -> None:
    concurrency, repeats = int(sys.argv[1]), int(sys.argv[2])
    margin = float(sys.argv[3]) if len(sys.argv) > 3 else 1.05
    gate._Bucket.upper_bound = _upper_bound_with_margin
    args, loaded, warmup, measured, params = cpu_bench_inputs(concurrency, "/tmp/margin-ab")
    variants = [("none", 1.0), ("adaptive", 1.0), ("adaptive", margin)]
    rates = {v: [] for v in variants}
    for repeat in range(repeats):
        for spec, value in variants:
            _MARGIN[0] = value
            setting = Setting(spec, 0 if spec == "none" else 7)
            engine = engine_for(loaded, setting, concurrency, args)
            m = measure(engine, setting, measured, params, concurrency, warmup)
            rates[(spec, value)].append(m.tok_s)
            print(
                f"{repeat} {spec} margin {value}: {m.tok_s:.2f} tok/s, vetoes "
                f"{m.gate_vetoes}, undrafted {m.undrafted_steps}",
                flush=True,
            )
    none = np.array(rates[variants[0]])
    for variant in variants:
        print(variant, "median", round(float(np.median(rates[variant])), 2))
    for variant in variants[1:]:
        paired = np.array(rates[variant]) / none
        print(
            variant,
            "/ none paired",
            np.round(paired, 3),
            "median",
            round(float(np.median(paired)), 3),
        )


if __name__ == "__main__":
    main()
