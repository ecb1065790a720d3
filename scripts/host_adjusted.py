"""Adaptive against the best fixed K, read at one host speed: ``bench.json`` runs fitted
as log(tok/s) = setting + slope · log(host probe).

The H200's host runs each engine run at its own speed (``dspark bench``'s host probe, a
fixed piece of Python and NumPy work timed before and after every run: 0.40-0.48 ms or
0.64-1.00 ms), which moves a SmolLM2 run's tok/s by 10% and more. The paired ratios
compare runs whatever their speeds, and the verdicts' "host at full speed in both" pairs
use only the few pairs whose probes were both fast. This fit uses every run: per level,
least squares of each run's log tok/s on one constant per setting and the log of the
run's mean probe (before and after), so each setting's constant is its log tok/s at one
common host speed; the ratio of adaptive's constant to the best fixed K's is printed with
its standard error, beside the plain ratio of medians. The probe is taken around the
run, not during it, so it explains only part of the spread (the fit's residual is
printed too).

    .venv/bin/python scripts/host_adjusted.py docs/results/bench/h200/session31/*/bench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def fit_level(rows: list[dict]) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """(constants per row, their covariance, slope, residual sd), or None when a row
    lacks per-run probes or there are too few runs to fit."""
    design, target = [], []
    for i, row in enumerate(rows):
        probes, rates = row.get("probe_ms_runs"), row.get("tok_s_runs")
        if not probes or not rates or len(probes) != len(rates):
            return None
        for probe, rate in zip(probes, rates, strict=True):
            onehot = [0.0] * len(rows)
            onehot[i] = 1.0
            design.append([*onehot, float(np.log(np.mean(probe)))])
            target.append(float(np.log(rate)))
    x, y = np.array(design), np.array(target)
    if x.shape[0] <= x.shape[1]:
        return None
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    residual = y - x @ coef
    variance = float(residual @ residual) / (x.shape[0] - x.shape[1])
    cov = variance * np.linalg.inv(x.T @ x)
    return coef[:-1], cov[:-1, :-1], float(coef[-1]), variance**0.5


def report(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    levels: dict[int, list[dict]] = {}
    for row in data["rows"]:
        levels.setdefault(row["concurrency"], []).append(row)
    lines = []
    for concurrency, rows in sorted(levels.items()):
        labels = [row["label"] for row in rows]
        fixed = [i for i, label in enumerate(labels) if label.startswith("K=")]
        fitted = fit_level(rows)
        if not fixed or fitted is None:
            continue
        constants, cov, slope, spread = fitted
        medians = [float(np.median(row["tok_s_runs"])) for row in rows]
        for a, label in enumerate(labels):
            if not label.startswith("adaptive"):
                continue
            best = max(fixed, key=lambda i: constants[i])
            plain = max(fixed, key=lambda i: medians[i])
            diff = constants[a] - constants[best]
            error = (cov[a, a] + cov[best, best] - 2 * cov[a, best]) ** 0.5
            lines.append(
                f"{path.parent.name:>24} c{concurrency:<4} {label:<22} medians "
                f"{medians[a] / medians[plain]:.3f}x {labels[plain]:<4}  at one host speed "
                f"{np.exp(diff):.3f}x {labels[best]:<4} (+-{error:.3f})  slope {slope:+.2f}, "
                f"residual sd {spread:.3f}"
            )
    return lines


def main() -> None:
    for name in sys.argv[1:]:
        print("\n".join(report(Path(name))))


if __name__ == "__main__":
    main()
