"""Adaptive verification's decisions step by step on the CPU default (SmolLM2 + the
shipped drafter, held-out ShareGPT prompts), from a fresh engine with no warm-up: per
step the cost model's drafting depth (``model``), the gate's answer (``draft``, ``VETO``,
``probe`` or ``no``), the depth the step drafted, the tokens it emitted, its wall time in
ms, the drafter's price at depths 0..3 for one request (``draft_costs_by_depth``) and
the step's budget; then the gate's rates, the population's survival and the overheads
the cost model learnt beyond its profiled prices (``ObservedDraftCost.overhead_ms``).

    PYTHONPATH=src python scripts/gate_trace.py CONCURRENCY [TEMPERATURE TOKENS PROMPTS]

Defaults: greedy, 32 new tokens, max(4, CONCURRENCY) prompts.
"""

import argparse
import sys
import time

import numpy as np
import torch

from dspark.bench import sweep
from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def main() -> None:
    concurrency = int(sys.argv[1])
    temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    num_prompts = int(sys.argv[4]) if len(sys.argv) > 4 else max(4, concurrency)
    parser = argparse.ArgumentParser()
    sweep.add_cli_args(parser)
    args = parser.parse_args(
        ["--concurrency", str(concurrency), "--max-tokens", str(tokens), "--out", "/tmp/dt"]
    )
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    prompts = bench_prompts(loaded.tokenizer, args, num_prompts + 1)
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, args)
    gate, verifier = engine.gate, engine.verifier
    pays, should_draft, should_probe = verifier.drafting_pays, gate.should_draft, gate.should_probe
    current: dict[str, object] = {}

    def traced_pays(*a, **k):
        current["model"] = depth = pays(*a, **k)
        return depth

    def traced_draft(*a, **k):
        answer = should_draft(*a, **k)
        current["gate"] = "draft" if answer else "VETO"
        return answer

    def traced_probe(*a, **k):
        answer = should_probe(*a, **k)
        current["gate"] = "probe" if answer else "no"
        return answer

    verifier.drafting_pays = traced_pays
    gate.should_draft, gate.should_probe = traced_draft, traced_probe
    step, index = engine.step, [0]

    def traced_step():
        current.clear()
        generated, start = engine.stats.num_generated, time.perf_counter()
        out = step()
        wall = (time.perf_counter() - start) * 1e3
        priced = engine._priced_step
        prices = verifier.cost_model.draft_costs_by_depth(1, 7)[:4]
        budget = engine.stats.budgets[-1] if engine.stats.budgets else None
        print(
            index[0],
            current.get("model"),
            current.get("gate"),
            priced[2] if priced else None,
            engine.stats.num_generated - generated,
            f"{wall:.1f}",
            np.round(prices, 1).tolist(),
            budget,
            flush=True,
        )
        index[0] += 1
        return out

    engine.step = traced_step
    params = SamplingParams(temperature=temperature, max_tokens=tokens)
    closed_loop(engine, prompts[1:], params, concurrency)
    print("gate rates (drafted, undrafted) tok/ms:", gate.rates(concurrency))
    print(
        "population survival",
        np.round(verifier.population_survival, 3).tolist(),
        f"predictiveness {verifier.predictiveness:.3f}",
    )
    cost = verifier.cost_model
    print(
        f"learnt overhead at {concurrency} requests beyond the profiled price, ms: "
        f"undrafted {cost.overhead_ms(concurrency, 0):.1f}, drafted 1 deep "
        f"{cost.overhead_ms(concurrency, 1):.1f}, {cost.num_positions} deep "
        f"{cost.overhead_ms(concurrency, None):.1f}"
    )


if __name__ == "__main__":
    main()
