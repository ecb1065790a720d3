"""Calibration of the drafter's confidences: sequential temperature scaling (STS).

The scheduler multiplies the per-position confidences into survival probabilities
(the chance that drafts 1..k are all accepted), so that product is what must be
calibrated. STS goes left to right: with positions 1..k-1 fixed, it picks the
temperature of position k that minimises the expected calibration error (ECE) of the
survival at k against the observed survival. A temperature only stretches logits around
zero, so it cannot remove a constant over-confidence (a head that predicts more
acceptance than its drafts get); with ``shift=True`` each position also gets a shift,
z / T_k + b_k, searched jointly on a grid (sequential Platt scaling). NumPy only.
"""

from __future__ import annotations

import numpy as np

from dspark.figures import save_figure

DEFAULT_BINS = 15
TEMPERATURE_GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 241))
SHIFT_GRID = np.linspace(-2.0, 2.0, 81)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def observed_survival(accepted: np.ndarray, k: int) -> np.ndarray:
    """``[N, K]``: whether drafts 1..k+1 were all accepted, per round."""
    return np.asarray(accepted)[:, None] >= np.arange(1, k + 1)[None, :]


def predicted_survival(
    logits: np.ndarray, temperatures: np.ndarray | None = None, shifts: np.ndarray | None = None
) -> np.ndarray:
    """``[N, K]`` cumulative products of the (scaled and shifted) confidences."""
    logits = np.asarray(logits, dtype=np.float64)
    k = logits.shape[1]
    if temperatures is not None:
        logits = logits / np.asarray(temperatures, dtype=np.float64)[None, :k]
    if shifts is not None:
        logits = logits + np.asarray(shifts, dtype=np.float64)[None, :k]
    return np.cumprod(sigmoid(logits), axis=1)


def ece(predicted: np.ndarray, observed: np.ndarray, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error with equal-width bins: Σ_b (n_b / N)·|mean p − rate|."""
    predicted = np.asarray(predicted, dtype=np.float64)
    observed = np.asarray(observed, dtype=np.float64)
    if predicted.size == 0:
        return 0.0
    which = np.minimum((predicted * bins).astype(np.int64), bins - 1)
    gap = np.bincount(which, predicted - observed, minlength=bins)
    return float(np.abs(gap).sum() / predicted.size)


def ece_columns(predicted: np.ndarray, observed: np.ndarray, bins: int = DEFAULT_BINS):
    """``ece`` of every column of ``predicted [N, G]`` against one ``observed [N]``."""
    n, columns = predicted.shape
    which = np.minimum((predicted * bins).astype(np.int64), bins - 1)
    which += np.arange(columns)[None, :] * bins
    gap = np.bincount(
        which.ravel(), (predicted - observed[:, None]).ravel(), minlength=columns * bins
    )
    return np.abs(gap.reshape(columns, bins)).sum(axis=1) / n


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half); NaN with one class."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size)
    sorted_scores = scores[order]
    # Average ranks over ties.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = 0.5 * (start + end - 1) + 1.0
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def fit_sequential_temperatures(
    logits: np.ndarray,  # [N, K] raw confidence logits
    accepted: np.ndarray,  # [N] accepted drafts per round (all K verified)
    grid: np.ndarray = TEMPERATURE_GRID,
    bins: int = DEFAULT_BINS,
    shift: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-position temperatures and shifts (zeros without ``shift``), chosen left to
    right (module docstring)."""
    logits = np.asarray(logits, dtype=np.float64)
    n, k = logits.shape
    if n == 0:
        raise ValueError("no rounds to calibrate on")
    observed = observed_survival(accepted, k)
    temperatures, shifts = np.ones(k), np.zeros(k)
    survival = np.ones(n)
    offsets = SHIFT_GRID if shift else np.zeros(1)
    for position in range(k):
        best, best_error = None, np.inf
        for offset in offsets:
            candidates = survival[:, None] * sigmoid(logits[:, position, None] / grid + offset)
            errors = ece_columns(candidates, observed[:, position].astype(np.float64), bins)
            j = int(np.argmin(errors))
            if errors[j] < best_error - 1e-12:
                best, best_error = (grid[j], offset), errors[j]
        temperatures[position], shifts[position] = best
        survival = survival * sigmoid(logits[:, position] / best[0] + best[1])
    return temperatures, shifts


def calibration_report(
    logits: np.ndarray,
    accepted: np.ndarray,
    temperatures: np.ndarray | None,
    shifts: np.ndarray | None = None,
) -> dict:
    """ECE and AUROC of the survival at each position."""
    k = logits.shape[1]
    predicted = predicted_survival(logits, temperatures, shifts)
    observed = observed_survival(accepted, k)
    return {
        "ece": [round(ece(predicted[:, i], observed[:, i]), 5) for i in range(k)],
        "auroc": [round(auroc(predicted[:, i], observed[:, i]), 4) for i in range(k)],
        "mean_predicted": [round(float(predicted[:, i].mean()), 4) for i in range(k)],
        "observed_rate": [round(float(observed[:, i].mean()), 4) for i in range(k)],
        "rounds": int(logits.shape[0]),
    }


def reliability_curve(
    predicted: np.ndarray, observed: np.ndarray, bins: int = DEFAULT_BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per non-empty bin: mean prediction, observed rate, count."""
    which = np.minimum((np.asarray(predicted) * bins).astype(np.int64), bins - 1)
    counts = np.bincount(which, minlength=bins)
    mean_p = np.bincount(which, predicted, minlength=bins)
    rate = np.bincount(which, np.asarray(observed, dtype=float), minlength=bins)
    keep = counts > 0
    return mean_p[keep] / counts[keep], rate[keep] / counts[keep], counts[keep]


def plot_reliability(
    logits: np.ndarray,
    accepted: np.ndarray,
    temperatures: np.ndarray,
    shifts: np.ndarray | None,
    directory,
    title: str,
) -> list[str]:
    """One reliability diagram per position (before and after), as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    k = logits.shape[1]
    before = predicted_survival(logits)
    after = predicted_survival(logits, temperatures, shifts)
    observed = observed_survival(accepted, k)
    paths = []
    for position in range(k):
        fig, ax = plt.subplots(figsize=(4.2, 4.2))
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect")
        for label, predicted, colour in (
            ("raw", before, "tab:red"),
            ("calibrated", after, "tab:blue"),
        ):
            p, rate, _ = reliability_curve(predicted[:, position], observed[:, position])
            error = ece(predicted[:, position], observed[:, position])
            ax.plot(p, rate, marker="o", color=colour, label=f"{label} (ECE {error:.3f})")
        ax.set_xlabel("predicted survival")
        ax.set_ylabel("observed survival")
        ax.set_title(f"{title}: position {position + 1}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        path = directory / f"reliability_pos{position + 1}.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths
