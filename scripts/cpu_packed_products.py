"""A forward's products over SmolLM2-135M-shaped random weights on this CPU, by row count,
through each product ``dspark.ops.linear`` can take: ``F.linear``, ``weight @ x.T`` (one
row run as two, the result copied row-major up to ``ROW_MAJOR_MAX_ROWS``, as ``linear``
runs it) and oneDNN's product over weights packed once (one row run as two).

The weights are 30 layers of fused q/k/v, o, fused gate/up and down, then the LM head
(533 MB in fp32), so every sweep reads them from memory as a step does. Per row count
the three products take turns, ``--rounds`` rounds; the table quotes each one's median
sweep in ms and writes it as JSON to ``--out``.

    PYTHONPATH=src .venv/bin/python scripts/cpu_packed_products.py --out DIR [--rows 16 32]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dspark.ops.linear import ROW_MAJOR_MAX_ROWS, packed_product, packing_available

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)


def transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat((x, x.new_zeros(1, x.shape[1])))
    out = torch.mm(weight, x.t())[:, :rows].t()
    return out.contiguous() if rows <= ROW_MAJOR_MAX_ROWS else out


def packed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat((x, x.new_zeros(1, x.shape[1])))
    return packed_product(x, weight)[:rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="row counts")
    args = parser.parse_args()
    if not packing_available():
        raise SystemExit("this torch has no oneDNN packed products")
    torch.manual_seed(0)
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    weights = [torch.randn(*shape) for _ in range(30) for shape in shapes]
    weights.append(torch.randn(49152, 576))
    products = {"F.linear": F.linear, "w @ x.T": transposed, "packed": packed}
    rows_ms: dict[int, dict[str, float]] = {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per forward")
    print(f"{'rows':>4} " + " ".join(f"{name:>9}" for name in products))
    with torch.inference_mode():
        for w in weights:
            packed_product(torch.zeros(2, w.shape[1]), w)  # pack once, outside the timing
        for rows in args.rows:
            inputs = {n: torch.randn(rows, n) for n in (576, 1536)}
            times: dict[str, list[float]] = {name: [] for name in products}
            for _ in range(args.rounds + 1):  # the first round warms up, not kept
                for name, product in products.items():
                    start = time.perf_counter()
                    for w in weights:
                        product(inputs[w.shape[1]], w)
                    times[name].append((time.perf_counter() - start) * 1e3)
            rows_ms[rows] = {name: float(np.median(t[1:])) for name, t in times.items()}
            print(f"{rows:>4} " + " ".join(f"{rows_ms[rows][n]:>9.1f}" for n in products))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"torch": torch.__version__, "threads": torch.get_num_threads()}
        record["rounds"], record["ms"] = args.rounds, rows_ms
        (args.out / "packed_products.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
