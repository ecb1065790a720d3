"""What an adaptive step that does not draft costs the host, against no speculation.

    python scripts/undrafted_overhead.py [REQUESTS] [TOKENS]

Runs SmolLM2 on this CPU with no speculation and with adaptive verification whose gate
never drafts (and never probes), the look-ahead on as on a GPU, and prints per-step
medians of the engine's host phases: the draft phase (deciding not to draft) and apply
(verification bookkeeping, held-back drafter upkeep). On a GPU these phases are not
hidden behind the forward, so their difference is what an undrafted adaptive step pays
over a step without speculation (about 13% of a SmolLM2 step at 4 requests on an H200).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def main() -> None:
    num_reqs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    torch.set_num_threads(2)
    loaded = load_model(None, torch.float32, "cpu")
    prompts = [list(range(100 + 7 * i, 140 + 7 * i)) for i in range(num_reqs)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for spec in ("none", "adaptive"):
        config = EngineConfig(
            spec=spec,
            num_drafts=7,
            max_num_seqs=num_reqs,
            max_num_batched_tokens=256,  # start-up profiling up to here: quick on a CPU
            lookahead="on",
            cuda_graphs="on",
        )
        engine = LLMEngine(loaded, config)
        if engine.gate is not None:
            engine.gate.should_draft = lambda num_reqs, mixed=False: False
            engine.gate.should_probe = lambda num_reqs, mixed=False: False
        for prompt in prompts:
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
        stats = engine.stats
        print(
            f"{spec:>8}: {stats.num_steps} steps ({stats.undrafted_steps} undrafted), per-step "
            f"medians: draft phase {np.median(stats.draft_phase_ms):.3f} ms, apply "
            f"{np.median(stats.apply_ms):.3f} ms"
        )


if __name__ == "__main__":
    main()
