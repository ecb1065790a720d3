"""Milliseconds per product with a few rows on this CPU: ``F.linear`` against
``dspark.models.llama.linear`` (``weight @ x.T`` for 2-16 rows), for SmolLM2's LM head
(49,152 x 576) and its fused gate/up projection (3,072 x 576); median of 30 calls.

    python scripts/cpu_small_rows.py
"""

import time

import numpy as np
import torch
import torch.nn.functional as F

from dspark.models.llama import linear


def median_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'weight':>12} {'rows':>4} {'F.linear':>9} {'linear':>9}")
    for out_features in (49152, 3072):
        weight = torch.randn(out_features, 576)
        for rows in (1, 2, 3, 4, 8, 16):
            x = torch.randn(rows, 576)
            plain = median_ms(lambda: F.linear(x, weight))  # noqa: B023
            ours = median_ms(lambda: linear(x, weight))  # noqa: B023
            print(f"{out_features:>6} x 576 {rows:>4} {plain:>8.2f} {ours:>9.2f}")


if __name__ == "__main__":
    main()
