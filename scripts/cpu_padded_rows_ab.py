"""The small-row plan with padding against the same plan without it, on this CPU.

Tunes ``linear``'s plan on SmolLM2-135M's own weights (``tune_small_rows``, timed), then
sweeps every product of a forward over those weights through ``linear`` (30 layers and
the LM head, as a forward reads them) at 1-16 rows and a few larger counts, under the
measured plan and under the same measurements with padding off (``PAD_GAIN`` 0),
alternating the two plans, median of ``REPEATS`` sweeps each.

    .venv/bin/python scripts/cpu_padded_rows_ab.py [REPEATS]
"""

import sys
import time

import numpy as np
import torch

from dspark.models.loader import load_model
from dspark.ops import linear as llama

COUNTS = (*range(1, 17), 20, 24, 32)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    torch.set_num_threads(2)
    weights = load_model(None, torch.float32, "cpu").model.linear_weights()
    times: dict = {}
    measured: dict = {}
    plan_from_times = llama.plan_from_times

    def keep(best):  # the tuning's own measurements, to plan them again without padding
        measured.update(best)
        return plan_from_times(best)

    llama.plan_from_times = keep
    start = time.perf_counter()
    llama.tune_small_rows(weights)
    tuning_s = time.perf_counter() - start
    llama.plan_from_times = plan_from_times
    padded = plan_from_times(measured)
    gain, llama.PAD_GAIN = llama.PAD_GAIN, 0.0
    unpadded = plan_from_times(measured)  # the same choices of product, never padded
    llama.PAD_GAIN = gain
    print(f"tuned sweeps, ms {list(llama.PATHS)}:")
    print(
        "  "
        + ", ".join(f"{n}: " + "/".join(f"{t * 1e3:.1f}" for t in ts) for n, ts in measured.items())
    )
    print(f"tuning {tuning_s:.1f} s; padded plan 1-32: {list(padded[1:33])}")
    shapes = {tuple(w.shape) for w in weights}
    inputs = {n: torch.randn(COUNTS[-1], n) for n in {w.shape[1] for w in weights}}
    for rows in COUNTS:
        times[rows] = {"padded": [], "unpadded": []}
    with torch.inference_mode():
        for _ in range(repeats):
            for rows in COUNTS:
                for name, plan in (("padded", padded), ("unpadded", unpadded)):
                    for shape in shapes:
                        llama._ROW_PLAN[shape] = plan
                    t = time.perf_counter()
                    for w in weights:
                        llama.linear(inputs[w.shape[1]][:rows], w)
                    times[rows][name].append((time.perf_counter() - t) * 1e3)
    for shape in shapes:
        llama._ROW_PLAN[shape] = padded
    print(f"{'rows':>4} {'plan':>14} {'padded ms':>10} {'unpadded ms':>12} {'ratio':>6}")
    for rows in COUNTS:
        a, b = (float(np.median(times[rows][k])) for k in ("padded", "unpadded"))
        print(
            f"{rows:>4} {' '.join(map(str, padded[rows])):>14} {a:>10.1f} {b:>12.1f} {a / b:>6.3f}"
        )


if __name__ == "__main__":
    main()
