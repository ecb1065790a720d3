"""Does NumPy's BLAS work just before a target forward slow that forward on this CPU?

SmolLM2 on the CPU, a fixed K = 1 engine's forward of one request verifying two tokens
(through the start-up profiler's dummy step), each preceded by one NumPy operation, the
operations in a fresh random order every round; prints the median forward (ms) after
each, the first max(2, ROUNDS // 13) rounds dropped. Operations: none, dot16
(three dot products of 16 floats, as ``AdaptiveVerifier.record`` takes), ones (a 64 x 7
matrix-vector product, as the plan's shrink takes), mm200 (a 200 x 200 product), lstsq
(a 64 x 7 least squares), ufunc (the first two as ufunc reductions, no BLAS). Run with
``OPENBLAS_NUM_THREADS=1`` to see what OpenBLAS's own threads cost.

    PYTHONPATH=src python scripts/cpu_blas_threads.py [ROUNDS] [OPERATION ...]
"""

import sys

import numpy as np
import torch

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.profiling import _dummy_step
from dspark.models.loader import load_model


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    torch.manual_seed(0)
    loaded = load_model(None, device="cpu", dtype=torch.float32)
    engine = LLMEngine(loaded, EngineConfig(spec="fixed", num_drafts=1))
    rng = np.random.default_rng(0)
    x, a, m = rng.random(16), rng.random((64, 7)), rng.random((200, 200))
    every = {
        "none": lambda: None,
        "dot16": lambda: (x @ x, x @ x, x @ x),
        "ones": lambda: np.ones(64) @ a,
        "mm200": lambda: m @ m,
        "lstsq": lambda: np.linalg.lstsq(a, x[:7].repeat(10)[:64], rcond=None),
        "ufunc": lambda: (np.add.reduce(x * x), np.add.reduce(a, axis=0)),
    }
    names = sys.argv[2:] or ["none", "dot16", "ones", "mm200", "lstsq"]
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in rng.permutation(names):
            every[name]()
            ms, _ = _dummy_step(engine, np.array([2]), 128, rng, [])
            times[name].append(ms)
    dropped = max(2, rounds // 13)
    for name, values in times.items():
        print(f"{name:6s} forward median {np.median(values[dropped:]):6.2f} ms")


if __name__ == "__main__":
    main()
