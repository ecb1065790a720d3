"""Host time of adaptive verification's decisions per engine step at a given concurrency.

A tiny random-weight target (the model's own time is irrelevant here) runs in the engine
with the replayed SmolLM2 acceptance trace and a measured cost profile (default: the
H200 8B-shape profile at 256 requests), so the gate, budget and allocation take the
decisions they take on the GPU. Prints the median microseconds per step that
``EngineStats.schedule_ms`` records (batch arrays + gate + record + budget + allocation)
for each allocation mode.

    python scripts/schedule_overhead.py 256 [docs/results/bench/h200/profile_llama3-8b_c256.json]
"""

import sys
import time

import numpy as np
import torch

from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model

PROFILE = "docs/results/bench/h200/profile_llama3-8b_c256.json"


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    path = sys.argv[2] if len(sys.argv) > 2 else PROFILE
    torch.manual_seed(0)
    loaded = random_model("tiny", torch.float32)
    draft_model = random_draft_model(loaded)
    tables = EngineProfile.load(path).tables
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 40000, int(n)).tolist() for n in rng.integers(20, 200, concurrency)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for allocation in ("host", "device"):
        config = EngineConfig(
            spec="adaptive",
            num_drafts=7,
            max_num_seqs=concurrency,
            max_num_batched_tokens=tables.verify_ms.shape[0] - 1,
            kv_cache_tokens=concurrency * 260,
            allocation=allocation,
        )
        inner = DSparkDrafter(draft_model, concurrency * 280, 16, use_draft_vocab=False)
        engine = LLMEngine(loaded, config, ReplayDrafter(inner, AcceptanceTrace.load()), tables)
        for prompt in prompts:
            engine.add_request(prompt, params)
        while any(r.is_prefilling for r in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        engine.stats.__init__()
        start = time.perf_counter()
        steps = 0
        while engine.has_unfinished() and steps < 30:
            engine.step()
            steps += 1
        wall = (time.perf_counter() - start) * 1e3 / steps
        per_step = sum(engine.stats.schedule_ms) / steps * 1e3
        print(
            f"{concurrency} requests, allocation={allocation}: {per_step:.0f} us of scheduling "
            f"per step (median call {np.median(engine.stats.schedule_ms) * 1e3:.0f} us), "
            f"mean budget {np.mean(engine.stats.budgets):.0f}, step wall {wall:.1f} ms here"
        )


if __name__ == "__main__":
    main()
