"""What the adaptive cost model learns at one request on this CPU, request by request.

Runs the embedded SmolLM2 with its drafter as ``dspark bench`` configures adaptive at
concurrency 1 (12 requests of 48 tokens, in three groups of four) and prints, after each
group, the drafter's measured/profiled ratio, the overhead lines per request-count bucket
(undrafted and drafted apart), the price of every drafting depth and the medians of what
each window's steps missed by depth. ``NORMALISE=on`` runs with
``EngineConfig.normalise_speed`` on (step times read at the profile's speed).

    PYTHONPATH=src python scripts/cpu_price_windows.py
"""

import argparse
import os

import numpy as np
import torch

from dspark.bench import sweep
from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model

parser = argparse.ArgumentParser()
sweep.add_cli_args(parser)
args = parser.parse_args(
    ["--device", "cpu", "--max-tokens", "48", "--out", "/tmp/pc1", "--prompts", ".gpu/prompts.npz"]
)
loaded = load_model(None, torch.float32, "cpu")
prompts = bench_prompts(loaded.tokenizer, args, 12)
mode = os.environ.get("NORMALISE", "off")
engine = engine_for(loaded, Setting("adaptive", 7, mode, (("normalise_speed", mode),)), 1, args)
cm = engine.verifier.cost_model
print("profiled depth_ms[:, 1]:", np.round(cm.depth_ms[:, 1], 3).tolist())
print(
    "base draft_cost(1):",
    cm.base.draft_cost_ms(1),
    "verify T=1..8:",
    np.round(cm.base.step_costs_ms(1, 1, 7), 2).tolist(),
)
params = SamplingParams(temperature=0.0, max_tokens=48)
for i in range(3):
    closed_loop(engine, prompts[4 * i : 4 * i + 4], params, 1)
    print(
        f"after {4 * (i + 1)} requests: ratio",
        {k: round(v, 3) for k, v in cm._ratio.items()},
        "overhead",
        {k: tuple(round(x, 3) for x in v) for k, v in cm._overhead.items()},
        "one_depth",
        cm._one_depth,
        "by depth",
        np.round(cm.draft_costs_by_depth(1, 7), 2).tolist(),
    )
    for key, window in cm._missed.items():
        arr = np.array(window)
        print(
            "  window",
            key,
            "n",
            len(arr),
            "depths",
            sorted(set(arr[:, 0].astype(int).tolist())),
            "median missed by depth",
            {int(d): round(float(np.median(arr[arr[:, 0] == d, 1])), 2) for d in set(arr[:, 0])},
        )
print(
    "drafter_ms median",
    np.median(engine.stats.drafter_ms),
    "forward median",
    np.median(engine.stats.forward_ms),
)
