"""Host time of the budgets planned in the step under each ``lookahead_shares`` mode.

    PYTHONPATH=src python3 scripts/plan_host_cost.py CONCURRENCY all|decode|off

``host_path_time.py``'s engine (the tiny shape, random weights, replayed published chat
acceptance, adaptive at K = 7, the look-ahead on as on a GPU, the gate off, the drafter
priced near zero so that steps draft) through a closed loop at CONCURRENCY, with
``EngineConfig.lookahead_shares`` set as given. Every budget not taken from the look-ahead
(planned ahead, or its shares) is planned in the step, while the drafter runs
(``LLMEngine._plan_budget``); with "decode" a step with a prompt chunk instead cuts the
look-ahead's ranking again at its own prices (``LLMEngine._shared_budget``, "recut").
This times both and counts the steps, so that what a mode adds to a launch-bound
target's host path can be read off: plans and recuts, their median host time on this
CPU and their sum over the steps.
"""

import sys
import time

import numpy as np
from host_path_time import Args, host_path_engine  # this directory

from dspark.bench.sweep import closed_loop
from dspark.engine.sampling import SamplingParams


def main() -> None:
    concurrency, mode = int(sys.argv[1]), sys.argv[2]
    engine, prompts = host_path_engine(concurrency, lookahead_shares=mode)
    times: list[float] = []
    plan_budget = engine._plan_budget

    def timed(*args, **kwargs):
        start = time.perf_counter()
        budget = plan_budget(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return budget

    engine._plan_budget = timed
    recuts: list[float] = []
    shared_budget = engine._shared_budget

    def timed_shares(*args, **kwargs):
        start = time.perf_counter()
        shared = shared_budget(*args, **kwargs)
        if shared is not None and shared[1] == "recut":
            recuts.append(time.perf_counter() - start)
        return shared

    engine._shared_budget = timed_shares
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    closed_loop(engine, prompts[:concurrency], params, concurrency)  # warm-up
    times.clear()
    recuts.clear()
    engine.stats.__init__()
    first = engine._step_index
    closed_loop(engine, prompts[concurrency:], params, concurrency)
    steps = engine._step_index - first
    stats = engine.stats
    median = np.median(times) * 1e6 if times else 0.0
    recut = np.median(recuts) * 1e6 if recuts else 0.0
    print(
        f"{concurrency} requests, lookahead_shares={mode}: {steps} steps; budgets planned in "
        f"the step {len(times)} (median {median:.1f} us, {sum(times) * 1e6 / steps:.1f} us a "
        f"step), recut {len(recuts)} (median {recut:.1f} us, "
        f"{sum(recuts) * 1e6 / steps:.1f} us a step), from shares {stats.share_plans}, "
        f"planned ahead {stats.lookahead_plans}"
    )


if __name__ == "__main__":
    main()
