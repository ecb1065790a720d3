"""How fast this machine runs, step by step, against the start-up profile.

Runs adaptive verification on the embedded SmolLM2 at ``CONC`` (default 1; 16 requests
per user of 48 tokens) and logs every step the cost model learns from: its target
forward's time over that forward's profiled price (the time scale
``EngineConfig.normalise_speed`` reads steps at), and per 20 steps the medians of the
drafted steps' non-forward time and of the undrafted steps' wall time.

    PYTHONPATH=src python scripts/cpu_machine_phase.py [CONC]
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

conc = int(sys.argv[1]) if len(sys.argv) > 1 else 1
parser = argparse.ArgumentParser()
sweep.add_cli_args(parser)
args = parser.parse_args(
    ["--device", "cpu", "--max-tokens", "48", "--out", "/tmp/pc1", "--prompts", ".gpu/prompts.npz"]
)
loaded = load_model(None, torch.float32, "cpu")
prompts = bench_prompts(loaded.tokenizer, args, 16 * conc)
engine = engine_for(loaded, Setting("adaptive", 7), conc, args)
cm = engine.verifier.cost_model
log = []
orig = cm.record_step


def rec(num_reqs, num_tokens, num_drafts, depth, wall_ms, context=0, **kwargs):
    costs = cm.base.step_costs_ms(num_reqs, num_tokens, num_drafts, context)
    fwd_price = float(costs[num_drafts]) - cm.base.draft_cost_ms(num_reqs)
    log.append(
        (time.perf_counter(), depth, wall_ms, engine.stats.forward_ms[-1], fwd_price, num_drafts)
    )
    return orig(num_reqs, num_tokens, num_drafts, depth, wall_ms, context, **kwargs)


cm.record_step = rec
params = SamplingParams(temperature=0.0, max_tokens=48)
closed_loop(engine, prompts, params, conc)
a = np.array(log)
t0 = a[0, 0]
phase = a[:, 3] / a[:, 4]
print(
    "steps",
    len(a),
    "phase (forward/profiled) quartiles",
    np.round(np.percentile(phase, [10, 25, 50, 75, 90]), 3),
)
# rolling medians in windows of 20 steps


def median(values: np.ndarray) -> float:
    return float(np.median(values)) if len(values) else float("nan")


for i in range(0, len(a), 20):
    w = a[i : i + 20]
    drafted, undrafted = w[w[:, 1] > 0], w[w[:, 1] == 0]
    print(
        f"t={w[0, 0] - t0:6.1f}s scale {median(w[:, 3] / w[:, 4]):.3f}  "
        f"drafted n={len(drafted):2d} wall-fwd {median(drafted[:, 2] - drafted[:, 3]):6.2f} "
        f"fwd {median(drafted[:, 3]):6.2f} | undrafted n={len(undrafted):2d} "
        f"wall {median(undrafted[:, 2]):6.2f} fwd {median(undrafted[:, 3]):6.2f}"
    )
