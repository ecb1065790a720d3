"""Milliseconds per product with a few rows on this CPU: ``F.linear`` against
``weight @ x.T`` (two of what ``dspark.ops.linear.linear`` chooses between for 1-64 rows; one
row runs as itself twice through ``weight @ x.T``, as ``linear`` does).

Two tables. First, SmolLM2's LM head (49,152 x 576) and fused gate/up projection
(3,072 x 576) alone, median of 30 calls (the gate/up weight then sits in cache). Then a
sweep over SmolLM2-135M-shaped random weights (30 layers of fused q/k/v, o, fused
gate/up and down, then the LM head: 533 MB in fp32), which reads every weight from
memory as a forward does, median of 9 sweeps: the figure ``tune_small_rows`` measures
at an engine's start-up on the model's own weights.

    python scripts/cpu_small_rows.py
"""

import time

import numpy as np
import torch
import torch.nn.functional as F


def median_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 1:  # a one-column product is a GEMV: doubled, as ``linear`` runs it
        return torch.mm(weight, torch.cat((x, x)).t())[:, :1].t()
    return torch.mm(weight, x.t()).t()


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'weight':>12} {'rows':>4} {'F.linear':>9} {'w @ x.T':>9}")
    for out_features in (49152, 3072):
        weight = torch.randn(out_features, 576)
        for rows in (1, 2, 3, 4, 8, 16):
            x = torch.randn(rows, 576)
            plain = median_ms(lambda: F.linear(x, weight))  # noqa: B023
            ours = median_ms(lambda: transposed(x, weight))  # noqa: B023
            print(f"{out_features:>6} x 576 {rows:>4} {plain:>8.2f} {ours:>9.2f}")
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    weights = [torch.randn(*shape) for _ in range(30) for shape in shapes]
    weights.append(torch.randn(49152, 576))
    print("a forward's products over SmolLM2-shaped weights, ms")
    print(f"{'rows':>4} {'F.linear':>9} {'w @ x.T':>9}")
    for rows in (*range(1, 11), 12, 16, 20, 24, 32, 48, 64, 96, 128):
        inputs = {n: torch.randn(rows, n) for n in (576, 1536)}
        times = []
        for product in (F.linear, transposed):

            def sweep(product=product, inputs=inputs):
                for weight in weights:
                    product(inputs[weight.shape[1]], weight)

            times.append(median_ms(sweep, repeats=9))
        print(f"{rows:>4} {times[0]:>9.2f} {times[1]:>9.2f}")


if __name__ == "__main__":
    main()
