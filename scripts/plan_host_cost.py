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

import dataclasses
import sys
import time

import numpy as np
import torch
from host_path_time import Args  # this directory

from dspark.bench.sweep import Replay, Setting, closed_loop, engine_for
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model


def main() -> None:
    concurrency, mode = int(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    loaded = random_model(Args.shape, torch.float32, "cpu")
    replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve("published:chat"))
    rng = np.random.default_rng(0)  # random prompts: the tiny shape has no tokenizer
    vocab = loaded.config.vocab_size
    prompts = [
        rng.integers(3, vocab, int(n)).tolist() for n in rng.integers(16, 200, 6 * concurrency)
    ]
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, Args, replay)
    engine.config = dataclasses.replace(engine.config, lookahead_shares=mode)
    engine.lookahead = True
    engine.gate = None
    cost = engine.verifier.cost_model
    cost.draft_costs_by_depth = lambda num_reqs, k: np.r_[0.0, np.full(k, 0.01)]
    cost.draft_cost_ms = lambda num_reqs, depth=None: 0.01
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
