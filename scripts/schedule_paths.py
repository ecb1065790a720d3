"""Where adaptive verification's host time goes, method by method, on this CPU.

The tiny shape (random weights, replayed published chat acceptance) at CONCURRENCY
requests, closed loop, the look-ahead on as on a GPU. ``FORCE=4`` drafts every step 4 deep
(the cost model still decides, then is overruled; no throughput gate), which takes the
paths the H200 takes with SmolLM2 at 64: most steps recut the look-ahead's ranking for a
step with a prompt chunk and cut the budget. Prints the mean time a step spends in each
wrapped method (nested methods count in their callers too; the look-ahead, drafting_pays,
record and record_step run during the forward on a GPU).

    FORCE=4 PYTHONPATH=src python scripts/schedule_paths.py [CONCURRENCY [MAX_TOKENS]]

Session 40 (FORCE=4, 64 64): 93 steps, 62 recut, 89 budget cuts; on the critical path
_admit_adaptively 153 us a call (_shared_budget 82, recut 77, allocate_drafts 110),
_batch_shape 27, _drafting_depth 27, _reuses 20. These in-engine times are inflated on
this 2-core VM: allocate_drafts on the same [64, 4] rows takes 13.6 us alone (timeit);
torch's worker threads still spin on the cores after each forward.
"""

import collections
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(os.path.dirname(os.path.abspath(__file__))))
from host_path_time import Args  # the same tiny-shape engine settings

import dspark.engine.engine as engine_module
from dspark.bench.sweep import Replay, Setting, closed_loop, engine_for
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model

ENGINE_METHODS = (
    "_drafting_depth",
    "_admit_adaptively",
    "_shared_budget",
    "_reuses",
    "_batch_shape",
    "_look_ahead",
    "_plan_budget",
    "_filled_budget",
    "_relax_pending",
)
VERIFIER_METHODS = ("recut", "plan", "drafting_pays", "plan_shares", "plan_ranking", "record")
COST_METHODS = ("step_costs_ms", "draft_cost_ms", "draft_costs_by_depth", "record_step")


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    torch.manual_seed(0)
    loaded = random_model(Args.shape, torch.float32, "cpu")
    replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve("published:chat"))
    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 200, 4 * concurrency)
    prompts = [rng.integers(3, loaded.config.vocab_size, int(n)).tolist() for n in lengths]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, Args, replay)
    engine.lookahead = True
    if os.environ.get("FORCE"):
        forced, decide = int(os.environ["FORCE"]), engine.verifier.drafting_pays
        engine.gate = None

        def overruled(*args, **kwargs):
            decide(*args, **kwargs)  # its time and its side effects (probe_depth) stay
            return forced

        engine.verifier.drafting_pays = overruled
    closed_loop(engine, prompts[:concurrency], params, concurrency)
    engine.stats.__init__()
    totals: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    def wrap(owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                totals[label] += (time.perf_counter() - start) * 1e3
                calls[label] += 1

        setattr(owner, name, timed)

    wrap(engine_module, "allocate_drafts", "allocate_drafts")
    for name in ENGINE_METHODS:
        wrap(engine, name, name)
    for name in VERIFIER_METHODS:
        wrap(engine.verifier, name, "verifier." + name)
    for name in COST_METHODS:
        wrap(engine.verifier.cost_model, name, "cost." + name)
    closed_loop(engine, prompts[concurrency:], params, concurrency)
    stats = engine.stats
    steps = stats.num_steps
    lookahead_us = sum(stats.lookahead_ms) / steps * 1e3
    print(
        f"{concurrency} requests: {steps} steps; look-ahead {lookahead_us:.0f} us a step; "
        f"hits {stats.lookahead_hits}, reused {stats.lookahead_reused}, planned "
        f"{stats.lookahead_plans}, shares {stats.share_plans}, recut {stats.recut_plans}, "
        f"budget cuts {stats.budget_cuts}"
    )
    for label in sorted(totals, key=lambda name: -totals[name]):
        per_step, per_call = totals[label] / steps * 1e3, totals[label] / calls[label] * 1e3
        print(f"  {label:28s} {per_step:8.1f} us a step {calls[label]:6d} calls {per_call:8.1f} us")


if __name__ == "__main__":
    main()
