"""When ``DepthCeiling`` would move at SmolLM2's H200 acceptance, by the price of a depth.

Synthetic steps of 16 requests, each request accepting a prefix of its drafts with the
per-position survival session 39 measured for SmolLM2 + its drafter at 16 on the H200
(``learnt_runs[0].population_survival`` in ``s39_c16/bench.json``), the cost model
wanting 1-7 deep (mostly deep), walls ``5.4 + MS * depth`` ms with 3% noise. For each
price of a depth (0.1 ms: K = 3 against K = 4 there; 0.45: adaptive's deep steps
against K = 4), six seeded searches of 1,000 steps: the ceiling each ended on and the
step by which it first moved below 7, next to the ceiling the prices make best.

    PYTHONPATH=src python scripts/ceiling_sim.py
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.scheduling.test_ceiling import best_ceiling, drive

from dspark.scheduling.ceiling import DepthCeiling

SURVIVAL = np.array([0.417, 0.183, 0.090, 0.044, 0.030, 0.019, 0.013])  # s39_c16


def main() -> None:
    conditional = list(SURVIVAL / np.concatenate([[1.0], SURVIVAL[:-1]]))
    for ms in (0.1, 0.25, 0.45):
        best, rates = best_ceiling(conditional, ms, base_ms=5.4, num_reqs=16)
        ended = []
        for seed in range(6):
            ceiling, first = DepthCeiling(7), None
            for chunk in range(10):
                drive(ceiling, 100, 16, conditional, ms, seed=seed * 100 + chunk, base_ms=5.4)
                if first is None and ceiling.ceilings()[16] < 7:
                    first = (chunk + 1) * 100
            ended.append((ceiling.ceilings()[16], first))
        relative = ", ".join(f"{r / rates[-1]:.3f}" for r in rates)
        print(f"{ms} ms a depth: best ceiling {best} (rate by ceiling 1..7 over 7's: {relative})")
        print("  ended on (ceiling, first moved by step):", ended)


if __name__ == "__main__":
    main()
