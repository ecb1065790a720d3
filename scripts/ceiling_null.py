"""How often ``DepthCeiling`` moves when every ceiling is equally fast (a true tie).

Synthetic steps at 16 requests: the cost model wants 5-7 deep; each request accepts
Binomial(depth, 0.5) drafts and the wall grows with the expected tokens, so tokens per
ms do not depend on the ceiling. 200 seeded searches of 3,000 decisions each, the
defaults (``DepthCeiling(7)``). A move here is a false alarm; harmless where ceilings
tie, it is what a search costs where they nearly do.

    PYTHONPATH=src python scripts/ceiling_null.py
"""

import numpy as np

from dspark.scheduling.ceiling import DepthCeiling


def main() -> None:
    moves, final = [], []
    for seed in range(200):
        rng = np.random.default_rng(seed)
        ceiling = DepthCeiling(7)
        requests = 16
        for _ in range(3000):
            depth, arm = ceiling.decide(requests, int(rng.integers(5, 8)))
            if arm is None:
                continue
            tokens = requests + int(rng.binomial(depth, 0.5, size=requests).sum())
            wall = 0.3 * requests * (1 + 0.5 * depth) * (1 + 0.03 * rng.standard_normal())
            ceiling.record(arm, tokens, wall)
        moves.append(ceiling.moves)
        final.append(ceiling.ceilings()[requests])
    moves = np.array(moves)
    print(f"searches that moved at least once: {np.mean(moves > 0):.3f} (of {len(moves)})")
    print(f"moves per search: {moves.mean():.3f}")
    print("final ceilings 1..7:", np.bincount(final, minlength=8)[1:].tolist())


if __name__ == "__main__":
    main()
