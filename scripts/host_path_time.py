"""Host time of adaptive verification between the proposal and the forward, on this CPU.

The tiny shape with random weights and replayed published chat acceptance, adaptive at
K = 7, closed loop at CONCURRENCY, with the look-ahead on as on a GPU (so the budget
not planned ahead is planned while the drafter runs) and the throughput gate off. Its
cost model prices the drafter at 0.01 ms, so that steps draft (the tiny drafter costs
more than the tiny target). Prints the median host time of each phase per step; the
sum of the first three is what a step spends on the host between its proposal and its
forward, where a device would wait.

    PYTHONPATH=src python3 scripts/host_path_time.py [CONCURRENCY]
"""

import dataclasses
import sys
import time

import numpy as np
import torch

from dspark.bench.sweep import Replay, Setting, closed_loop, engine_for
from dspark.engine.engine import LLMEngine
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model


class Args:
    out = "/tmp/host-path-time"
    device = "cpu"
    drafter = "auto"
    max_prompt_tokens = 256
    max_tokens = 64
    shape = "tiny"
    graph_padding_budget = 4.0


def host_path_engine(concurrency: int, **fields) -> tuple[LLMEngine, list[list[int]]]:
    """The engine this script times (``fields`` override its ``EngineConfig``) and six
    times ``concurrency`` random prompts for it."""
    torch.manual_seed(0)
    loaded = random_model(Args.shape, torch.float32, "cpu")
    replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve("published:chat"))
    rng = np.random.default_rng(0)  # random prompts: the tiny shape has no tokenizer
    vocab = loaded.config.vocab_size
    prompts = [
        rng.integers(3, vocab, int(n)).tolist() for n in rng.integers(16, 200, 6 * concurrency)
    ]
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, Args, replay)
    if fields:
        engine.config = dataclasses.replace(engine.config, **fields)
    engine.lookahead = True
    engine.gate = None
    cost = engine.verifier.cost_model
    cost.draft_costs_by_depth = lambda num_reqs, k: np.r_[0.0, np.full(k, 0.01)]
    cost.draft_cost_ms = lambda num_reqs, depth=None: 0.01
    return engine, prompts


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    engine, prompts = host_path_engine(concurrency)
    phases = ("_batch_shape", "_drafting_depth", "_admit_adaptively", "_look_ahead")
    times: dict[str, list[float]] = {name: [] for name in phases}
    for name in phases:
        method = getattr(engine, name)

        def timed(*args, _method=method, _name=name, **kwargs):
            start = time.perf_counter()
            result = _method(*args, **kwargs)
            times[_name].append(time.perf_counter() - start)
            return result

        setattr(engine, name, timed)
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    closed_loop(engine, prompts[:concurrency], params, concurrency)  # warm-up
    for values in times.values():
        values.clear()
    engine.stats.__init__()
    closed_loop(engine, prompts[concurrency:], params, concurrency)
    for name, values in times.items():
        print(f"{name:18s} {len(values):4d} calls, median {np.median(values) * 1e6:7.1f} us")
    path = sum(np.median(times[name]) for name in phases[:3]) * 1e6
    stats = engine.stats
    print(
        f"between proposal and forward: {path:.1f} us a step (median sums); budgets planned "
        f"ahead {stats.lookahead_plans}, while drafting "
        f"{getattr(stats, 'drafting_plans', 0)}, from shares "
        f"{getattr(stats, 'share_plans', 0)}, of "
        f"{len(stats.budgets)}"
    )


if __name__ == "__main__":
    main()
