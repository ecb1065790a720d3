"""The README's headline plot: adaptive verification against the best fixed K (and against
no speculation, where the run has it) per concurrency level, one line per machine and
target, from the ``bench.json`` files of the current runs.

    python scripts/plot_headline.py [--out docs/results/headline.png]

Each series is a folder of per-level runs (``cLEVEL/bench.json``) or one ``bench.json``
holding several levels. Writes the PNG and, beside it, ``headline.txt`` with the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
SERIES = {
    "H200, Llama-3-8B shape (acceptance replayed)": RESULTS / "h200" / "8b_levels",
    "H100, Llama-3-8B shape (acceptance replayed)": RESULTS / "h100" / "8b_levels",
    "H100, SmolLM2-135M + shipped drafter": RESULTS / "h100" / "smollm2_levels",
    "2-core CPU, SmolLM2-135M + shipped drafter": RESULTS / "cpu" / "main_job",
}


def level_ratios(rows: list[dict]) -> dict[int, dict]:
    """Per level: adaptive tok/s over the best fixed K's and over no speculation's."""
    out = {}
    for c in sorted({r["concurrency"] for r in rows}):
        at = {r["label"]: r["tok_s"] for r in rows if r["concurrency"] == c}
        fixed = {k: v for k, v in at.items() if k.startswith("K=")}
        adaptive = at.get("adaptive≤7")  # the defaults; variants carry a tag after a space
        if adaptive is None or not fixed:
            continue
        best = max(fixed, key=fixed.get)
        out[c] = {
            "best_fixed": best,
            "over_best": adaptive / fixed[best],
            "over_none": adaptive / at["no spec"] if "no spec" in at else None,
        }
    return out


def load_series(path: Path) -> dict[int, dict]:
    rows = []
    for bench in sorted(path.glob("**/bench.json")):
        rows += json.loads(bench.read_text())["rows"]
    return level_ratios(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "headline.png")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import matplotlib.pyplot as plt

    from dspark.figures import save_figure

    fig, (best_ax, none_ax) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    lines = [f"{'series':<48} {'level':>5}  {'best K':>6}  {'/best K':>7}  {'/no spec':>8}"]
    for name, path in SERIES.items():
        ratios = load_series(path)
        if not ratios:
            continue
        levels = list(ratios)
        best_ax.plot(levels, [ratios[c]["over_best"] for c in levels], marker="o", label=name)
        spec = [c for c in levels if ratios[c]["over_none"] is not None]
        if spec:
            none_ax.plot(spec, [ratios[c]["over_none"] for c in spec], marker="o", label=name)
        for c in levels:
            r = ratios[c]
            none = f"{r['over_none']:.3f}" if r["over_none"] is not None else "-"
            lines.append(
                f"{name:<48} {c:>5}  {r['best_fixed']:>6}  {r['over_best']:>7.3f}  {none:>8}"
            )
    for ax, title in ((best_ax, "adaptive / best fixed K"), (none_ax, "adaptive / no speculation")):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_title(title)
    best_ax.set_ylabel("throughput ratio (tok/s)")
    best_ax.legend(fontsize=7)
    save_figure(fig, args.out)
    text = "\n".join(lines)
    args.out.with_suffix(".txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
