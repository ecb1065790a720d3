"""How noisy the learnt overhead line's slope is (``ObservedDraftCost``'s window).

    PYTHONPATH=src python scripts/slope_noise.py

Synthetic drafted steps whose price misses by ``1 + 0.1 * depth`` ms plus Gaussian noise
(sigma 0.3 or 0.5 ms: a SmolLM2 step on an H200 varies about that much), depths 2-5
drawn in runs (each step keeps the last depth with probability 0.7), optionally a host
that runs 1.5 ms slower in stretches of 150 steps during which deeper depths are drawn
more often (the two confounded). Prints the 10th, 50th and 90th percentile of the slope
the engine's line learns (``_line_through`` over the last ``OVERHEAD_WINDOW`` steps, and
over 64), and how often it exceeds 0.5 ms a depth (true: 0.1).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from dspark.scheduling.cost import OVERHEAD_WINDOW, _line_depths, _line_through


def learnt_slopes(rng, sigma: float, window: int, confounded: bool, steps: int = 3000):
    depth, slow, points, slopes = 3, False, deque(maxlen=window), []
    for step in range(steps):
        if step % 150 == 0:
            slow = confounded and rng.random() < 0.5
        if rng.random() < 0.3:
            weights = [0.1, 0.3, 0.4, 0.2] if slow else [0.2, 0.45, 0.3, 0.05]
            depth = int(rng.choice([2, 3, 4, 5], p=weights))
        missed = 1.0 + 0.1 * depth + (1.5 if slow else 0.0) + rng.normal(0.0, sigma)
        points.append((depth, missed))
        if step >= 64:
            slopes.append(_line_through(_line_depths(points))[1])
    return np.array(slopes)


def main() -> None:
    print("sigma  confounded  window  slope p10/p50/p90 (ms a depth)  share > 0.5")
    for confounded in (False, True):
        for sigma in (0.3, 0.5):
            for window in (OVERHEAD_WINDOW, 64):
                slopes = learnt_slopes(np.random.default_rng(1), sigma, window, confounded)
                p10, p50, p90 = np.percentile(slopes, [10, 50, 90])
                print(
                    f"{sigma:5.1f}  {confounded!s:>10}  {window:6d}  "
                    f"{p10:.2f} / {p50:.2f} / {p90:.2f}{'':17}{(slopes > 0.5).mean():.3f}"
                )


if __name__ == "__main__":
    main()
