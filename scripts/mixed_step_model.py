"""Steps that admit prompts, priced by a saved GPU profile: budgets taken from the
look-ahead's shares against budgets planned on the step's own batch.

    PYTHONPATH=<tree>/src python scripts/mixed_step_model.py PROFILE.json CONCURRENCY \
        REQUESTS PROMPTS.npz [--offset N] [FIELD=VALUE ...]

A closed loop of REQUESTS real prompts (``train`` rows of a ``dspark.train.data`` file
from row N, 0 by default; 128 tokens each) at CONCURRENCY through
``depth_decisions.frozen_engine`` (a tiny random target on this CPU, acceptance replayed
from ``published:chat``, the profile's prices frozen, the look-ahead on as on a GPU;
extra ``EngineConfig`` fields from the command line). Every step is priced as the
profile prices it: the target's table at the step's packed token count (the captured
size it pads to) plus the drafter's price at its depth and batch. Printed per kind of
step (decode-only, with a prompt chunk): steps, modelled ms, tokens emitted, tokens per
modelled ms, and how the budgets of steps with a prompt chunk were planned. It says what
the budget rule does to those steps by the profile's own prices, not what they cost on a GPU.
"""

import sys
import time
from collections import Counter

import numpy as np
import torch
from depth_decisions import config_field, frozen_engine  # this directory

from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace
from dspark.engine.sampling import SamplingParams


def main() -> None:
    profile = EngineProfile.load(sys.argv[1])
    concurrency, num_requests = int(sys.argv[2]), int(sys.argv[3])
    data = np.load(sys.argv[4])
    rest = sys.argv[5:]
    offset = 0
    if rest[:1] == ["--offset"]:
        offset, rest = int(rest[1]), rest[2:]
    fields = dict(config_field(*arg.split("=", 1)) for arg in rest)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    trace = AcceptanceTrace.resolve("published:chat")
    engine = frozen_engine(profile, concurrency, trace, 262144, 262144, **fields)
    engine.lookahead = True  # as on a GPU
    tables, depth_ms = profile.tables, profile.depth_costs()

    ends = np.cumsum(data["train_lengths"])
    rows = slice(offset, offset + num_requests)
    prompts = [
        data["train_flat"][end - n : end].tolist()
        for end, n in zip(ends[rows], data["train_lengths"][rows], strict=True)
    ]
    packed: list[int] = []
    original_forward = engine.forward

    def forward(tables_, num_cached, num_query, tokens):
        packed.append(int(np.sum(num_query)))
        return original_forward(tables_, num_cached, num_query, tokens)

    engine.forward = forward
    kinds: dict[str, list[float]] = {"decode-only": [0, 0.0, 0], "with a prompt chunk": [0, 0.0, 0]}
    sources: Counter = Counter()
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    pending = prompts[::-1]
    live, start = [], time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and sum(not r.is_finished for r in live) < concurrency:
            live.append(engine.add_request(pending.pop(), params))
        stats = engine.stats
        before = (
            stats.num_generated,
            stats.drafting_plans,
            getattr(stats, "share_plans", 0),  # older trees have none
            Counter(stats.depth_steps),
            getattr(stats, "recut_plans", 0),
        )
        num_running = len(engine.scheduler.running)
        del packed[:]
        engine.step()
        if not packed:
            continue
        priced = engine._priced_step
        num_reqs, num_tokens = (priced[0], priced[1]) if priced else (num_running, num_running)
        depth = next((d for d, n in stats.depth_steps.items() if n != before[3].get(d, 0)), 0)
        cost = float(tables.verify_ms[packed[0]])
        if depth and depth_ms is not None:
            cost += float(depth_ms[depth][num_reqs])
        mixed = num_tokens != num_reqs
        kind = kinds["with a prompt chunk" if mixed else "decode-only"]
        kind[0] += 1
        kind[1] += cost
        kind[2] += stats.num_generated - before[0]
        if mixed and depth:
            sources["planned on the batch"] += stats.drafting_plans - before[1]
            sources["shares"] += getattr(stats, "share_plans", 0) - before[2]
            sources["recut ahead"] += getattr(stats, "recut_plans", 0) - before[4]
    for name, (steps, ms, tokens) in kinds.items():
        print(
            f"{name:20s} steps {steps:4d}  modelled {ms:8.1f} ms  tokens {tokens:6d}  "
            f"{tokens / max(ms, 1e-9):6.3f} tokens/ms"
        )
    total_ms = sum(k[1] for k in kinds.values())
    total_tokens = sum(k[2] for k in kinds.values())
    print(
        f"{'all':20s} steps {sum(k[0] for k in kinds.values()):4d}  modelled {total_ms:8.1f} ms"
        f"  tokens {total_tokens:6d}  {total_tokens / total_ms:6.3f} tokens/ms"
    )
    print("drafted steps with a prompt chunk, budget:", dict(sources))
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
