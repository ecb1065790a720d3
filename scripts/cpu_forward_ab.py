"""The target forward of a fixed-K engine against an adaptive one's, in one process.

SmolLM2 on this CPU, one request verifying two tokens (a one-deep step), the two engines'
``forward`` (through the start-up profiler's dummy step) alternating, 30 rounds; prints
each engine's median and quartiles in ms (the first four rounds dropped). In step traces
adaptive's one-deep steps took 3-6 ms longer in their forward than K = 1's (docs/bench/cpu.md,
session 23); alone, as here, they do not.

    PYTHONPATH=src python scripts/cpu_forward_ab.py
"""

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.profiling import _dummy_step
from dspark.models.loader import load_model


def main() -> None:
    torch.manual_seed(0)
    loaded = load_model(None, device="cpu", dtype=torch.float32)
    engines = {
        "K=1": LLMEngine(loaded, EngineConfig(spec="fixed", num_drafts=1)),
        "adaptive": LLMEngine(loaded, EngineConfig(spec="adaptive")),
    }
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(30):
        order = list(engines) if round_ % 2 else list(engines)[::-1]
        for name in order:
            ms, _ = _dummy_step(engines[name], np.array([2]), 128, rng, [])
            times[name].append(ms)
    for name, values in times.items():
        kept = values[4:]
        quartiles = np.percentile(kept, [25, 75])
        print(
            f"{name:9s} median {np.median(kept):6.2f} ms "
            f"(quartiles {quartiles[0]:.2f}-{quartiles[1]:.2f})"
        )


if __name__ == "__main__":
    main()
