"""Does a captured target graph run at one speed or two, and what sets it?

The SmolLM2 shape (``SHAPE``, random bf16 weights) at 16 requests: dummy verify steps
(``_dummy_step``) of 4 and 5 tokens a request over several cached lengths, timed round
by round (host wall and the graph's device time between CUDA events around its
replay). (Session 29 also captured one shape afresh several times, clearing the
runner's graphs in between; PyTorch's allocator asserted on the first capture after
the clear, so that part was dropped.)

    PYTHONPATH=src python3 scripts/gpu/graph_modes.py
"""

import os

import numpy as np
import torch

from dspark.bench.sweep import Setting, engine_for
from dspark.engine.graphs import exact_shapes
from dspark.engine.profiling import _dummy_step
from dspark.models.shapes import random_model


class Args:
    out = "/tmp/graph-modes"
    device = "cuda"
    drafter = "dspark"
    max_prompt_tokens = 256
    max_tokens = 128
    shape = os.environ.get("SHAPE", "smollm2-135m")
    graph_padding_budget = 4.0


def main() -> None:
    loaded = random_model(Args.shape, torch.bfloat16, "cuda")
    engine = engine_for(loaded, Setting("none", 0), 16, Args)
    runner, events = engine.graphs, {}
    replay = runner._graph

    def timed(shape):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = replay(shape)
        end.record()
        events["last"] = (begin, end, shape)
        return out

    runner._graph = timed

    def step(query: int, context: int) -> tuple[float, float, object]:
        wall, _ = _dummy_step(engine, np.full(16, query), context, rng, [])
        begin, end, shape = events["last"]
        end.synchronize()
        return wall, begin.elapsed_time(end), shape

    if os.environ.get("SDPA") == "math":  # the math attention only, for comparison
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_flash_sdp(False)
    rng = np.random.default_rng(0)
    cases = [(q, c) for q in (4, 5) for c in (100, 200, 250, 300, 380)]
    times: dict = {case: [] for case in cases}
    shapes = {}
    with exact_shapes(engine.padded_runners()):
        for case in cases:
            step(*case)
        for _ in range(15):
            for index in rng.permutation(len(cases)):
                wall, device, shapes[cases[index]] = step(*cases[index])
                times[cases[index]].append((wall, device))
        print("query, context: wall ms, device ms (medians); device p10, p90; shape")
        for case in cases:
            t = np.asarray(times[case])
            print(
                f"  {case}: {np.median(t[:, 0]):.3f} {np.median(t[:, 1]):.3f}; "
                f"{np.percentile(t[:, 1], 10):.3f} {np.percentile(t[:, 1], 90):.3f}; "
                f"{shapes[case]}"
            )


if __name__ == "__main__":
    main()
