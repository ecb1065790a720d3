"""Why adaptive drafts where it should not: its drafting decisions on this CPU, with the
prices behind them, next to the startup profile they come from.

    python scripts/cpu_depth_pricing.py [CONCURRENCY] [TOKENS]

SmolLM2 with its shipped drafter on the CPU, closed loop at ``CONCURRENCY`` (4) as
``dspark bench --full-warmup`` runs it (``2 x CONCURRENCY`` measured requests of
``TOKENS``, 48). Prints the profile's median forward time per (requests, target tokens)
and the seed-style verify price the budget reads (a running maximum over sizes), then
the measured run's decisions counted by (depth, prompt chunk in the step, requests),
and, for steps drafted one deep, what each depth was priced at: the tokens per ms
expected at depths 0..K (``depth_rates``), the verify price at 0 and at the cap, and
the drafter's price by depth (learnt overheads included; index 0: an undrafted step's).
"""

from __future__ import annotations

import collections
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

import dspark.scheduling.verifier as verifier_module
from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.profiling import EngineProfile
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


class Args:  # what engine_for and bench_prompts read
    out = "/tmp/cpu-depth-pricing"
    device = "cpu"
    drafter = "auto"
    max_prompt_tokens = 256
    max_tokens = 48
    shape = None
    prompts = None
    dataset = "sharegpt"
    graph_padding_budget = 8.0
    model = None


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    Args.max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    loaded = load_model(None, dtype=torch.float32, device="cpu")
    count = 2 * concurrency
    prompts = bench_prompts(loaded.tokenizer, Args, 2 * count)
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, Args)
    decisions: list[dict] = []
    rates_of = verifier_module.depth_rates

    def priced(survival, verify_ms, num_sampling, draft_ms):
        rates = rates_of(survival, verify_ms, num_sampling, draft_ms)
        decisions.append(
            {
                "requests": survival.shape[0],
                "rates": np.round(rates, 4).tolist(),
                "verify_0": round(float(verify_ms[0]), 1),
                "verify_cap": round(float(verify_ms[-1]), 1),
                "drafter": np.round(draft_ms, 1).tolist(),
            }
        )
        return rates

    verifier_module.depth_rates = priced
    drafting_pays = engine.verifier.drafting_pays

    def decided(slots, num_drafts, num_non_draft, num_sampling, context_tokens=0):
        depth = drafting_pays(slots, num_drafts, num_non_draft, num_sampling, context_tokens)
        if decisions:
            mixed = int(np.sum(num_non_draft)) != len(slots)
            decisions[-1].update(depth=depth, mixed=mixed, limits=np.asarray(num_drafts).tolist())
        return depth

    engine.verifier.drafting_pays = decided
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    closed_loop(engine, prompts[:count], params, concurrency)  # the full warm-up
    decisions.clear()
    engine.stats.__init__()
    finished, seconds = closed_loop(engine, prompts[count:], params, concurrency)
    tokens = sum(len(r.output_ids) for r in finished)
    profile_path = Path(Args.out) / "profiles" / f"profile-model-c{concurrency}-k7-cpu.json"
    profile = EngineProfile.load(profile_path)
    by_size = collections.defaultdict(list)
    for sample in profile.samples:
        by_size[(sample.num_reqs, sample.num_target_tokens)].append(sample.forward_ms)
    print("profile: median forward ms by (requests, target tokens), and the running maximum")
    running = 0.0
    for key in sorted(by_size, key=lambda k: k[1]):
        median = statistics.median(by_size[key])
        running = max(running, median)
        print(f"  {key}: {median:7.1f}   price {running:7.1f}")
    depths = [engine.stats.depth_steps[d] for d in range(8)]
    print(
        f"measured run: {tokens / seconds:.1f} tok/s, steps by depth {depths}, "
        f"gate vetoes {engine.stats.gate_vetoes}"
    )
    run = decisions
    counts = collections.Counter((d.get("depth"), d.get("mixed"), d["requests"]) for d in run)
    print("decisions (depth, prompt chunk, requests): count")
    for key, number in counts.most_common():
        print(f"  {key}: {number}")
    print("steps drafted one deep, as priced:")
    for d in [d for d in run if d.get("depth") == 1][:8]:
        print("  ", d)


if __name__ == "__main__":
    main()
