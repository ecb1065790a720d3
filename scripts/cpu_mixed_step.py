"""What a step with a prompt chunk costs on this CPU, with and without speculation.

    PYTHONPATH=src python scripts/cpu_mixed_step.py

SmolLM2 (fp32, two threads), four requests decoding; then, alternately, a plain decode
step and a step that also computes a new request's prompt of 31 or 62 tokens. Adaptive
verification runs with its gate forced never to draft, so both engines compute the same
tokens. Three rounds, the engines' order alternating; prints each step's median wall.
"""

import time

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def main() -> None:
    torch.set_num_threads(2)
    loaded = load_model(None, torch.float32, "cpu")
    rng = np.random.default_rng(0)
    walls: dict[tuple[str, str], list[float]] = {}
    for round_ in range(3):
        order = ("none", "adaptive") if round_ % 2 == 0 else ("adaptive", "none")
        for spec in order:
            config = EngineConfig(
                spec=spec, num_drafts=7, max_num_seqs=8, max_num_batched_tokens=512
            )
            engine = LLMEngine(loaded, config)
            if engine.gate is not None:
                engine.gate.should_draft = lambda num_reqs, mixed=False: False
                engine.gate.should_probe = lambda num_reqs, mixed=False: False
            params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
            for i in range(4):
                engine.add_request(list(range(100 + 7 * i, 140 + 7 * i)), params)
            for _ in range(5):
                engine.step()
            one_token = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
            for _ in range(4):
                for kind in ("4 decodes", "+ 31-token prompt", "+ 62-token prompt"):
                    if kind != "4 decodes":
                        length = int(kind.split("-")[0][2:])
                        engine.add_request(rng.integers(200, 5000, length).tolist(), one_token)
                    start = time.perf_counter()
                    engine.step()
                    walls.setdefault((spec, kind), []).append((time.perf_counter() - start) * 1e3)
                    engine.step()  # the one-token request finishes; the batch is back to 4
    for (spec, kind), values in sorted(walls.items()):
        print(f"{spec:>9} {kind:<18} median {np.median(values):6.1f} ms over {len(values)} steps")


if __name__ == "__main__":
    main()
