"""What ``dspark bench`` reports: the table, the comparisons, bench.json and bench.png.

``report`` prints the table and writes the files; ``compare`` gives each level's
verdicts (adaptive against the best fixed K, no speculation and plain adaptive), with
``paired_ratios`` over the repeats (and over those with the host at full speed,
``FULL_SPEED`` of ``fastest_probe``); ``plot`` draws throughput against load and
against per-user speed.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import torch

from dspark.bench.build import Replay
from dspark.bench.provenance import source_digest
from dspark.figures import save_figure


def report(
    rows: list[dict],
    args,
    dtype,
    drafter_name: str | None,
    replay: Replay | None = None,
    stopped: dict | None = None,
) -> None:
    """The table, the comparisons, ``bench.json`` and ``bench.png``. ``stopped``: a run
    a signal cut short (``main``), reported from the repeats it finished; the JSON says
    so."""
    out = Path(args.out)
    if args.device.startswith("cuda"):
        device = torch.cuda.get_device_name()
    else:
        device = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
    header = (
        f"{'conc':>4} {'setting':>16} {'tok/s':>9} {'user tok/s':>10} {'TPOT p50':>9} "
        f"{'TPOT p99':>9} {'accept':>6} {'verify':>6} {'step':>8} {'sched%':>6} {'capt':>9} "
        f"{'cover':>5} {'fill':>4}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['concurrency']:>4} {row['label']:>16} {row['tok_s']:>9.1f} "
            f"{row['per_user_tok_s']:>10.1f} {row['tpot_p50_ms']:>8.1f}ms "
            f"{row['tpot_p99_ms']:>8.1f}ms {row['acceptance_length']:>6.2f} "
            f"{row['verified_per_round']:>6.2f} {row['step_ms']:>6.1f}ms "
            f"{100 * row['schedule_share']:>6.2f} {row['capture_steps']:>3.0f}/"
            f"{row['capture_s']:>4.2f}s {row['covered_steps']:>5.0f} "
            f"{row.get('filled_steps', 0):>4.0f}"
        )
    verdicts = compare(rows)
    for line in verdicts:
        print(line)
    collected = [r for r in rows if any(r["gc_full_runs"])]
    for row in collected:  # a full collection pauses whichever step triggers it
        print(
            f"[dspark] c{row['concurrency']} {row['label']}: full garbage collections "
            f"while measuring, by repeat: {row['gc_full_runs']} (median "
            f"{1e3 * row['gc_full_s']:.1f} ms; heap "
            f"{'frozen' if row['heap_frozen'] else 'not frozen'})"
        )
    model = args.model or "SmolLM2-135M-Instruct"
    acceptance = "computed (target verifies the drafts)"
    if replay is not None:
        model = f"{args.shape} shape, random weights"
        acceptance = f"REPLAYED from {replay.trace.source}"
        print(f"[dspark] acceptance in this table is {acceptance}")
    payload = {
        "device": device,
        "model": model,
        "acceptance": acceptance,
        "dtype": str(dtype),
        "torch": torch.__version__,
        "source_digest": source_digest(),  # the code that ran (dspark.bench.provenance)
        "dataset": args.dataset,
        "drafter": f"{args.drafter} ({drafter_name})",
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        # Time-sliced (``--slice-ms``): each repeat a window of every engine's own time.
        "slice_ms": args.slice_ms,
        "window_s": args.window_s if args.slice_ms else None,
        # A run a signal stopped: by which, and how many finished runs the rows leave out
        # (a row's ``tok_s_runs`` has one entry per repeat it holds).
        "stopped": stopped,
        "rows": rows,
        "summary": verdicts,
    }
    (out / "bench.json").write_text(json.dumps(payload, indent=1))
    title = f"{model}, {args.dataset}, {device}, {dtype}"
    if replay is not None:
        title += f"\nacceptance REPLAYED: {replay.trace.source}"
    plot(rows, out / "bench.png", title)
    digest = payload["source_digest"]
    print(f"[dspark] wrote {out}/bench.json and bench.png (source digest {digest})")


def compare(rows: list[dict]) -> list[str]:
    """Per level: adaptive against the best fixed K and against no speculation (each
    adaptive variant in turn, and each ``--variant`` against plain adaptive)."""
    lines = []
    for concurrency in sorted({r["concurrency"] for r in rows}):
        level = [r for r in rows if r["concurrency"] == concurrency]
        variants = [r for r in level if r["spec"] == "adaptive"]
        # Plain adaptive (no tag) first: every variant is compared with it.
        variants.sort(key=lambda r: bool(r["label"].partition(" ")[2]))
        fixed = [r for r in level if r["spec"] == "fixed"]
        baseline = next((r for r in level if r["spec"] == "none"), None)
        fastest = fastest_probe(level)
        for adaptive in variants:
            tag = adaptive["label"].partition(" ")[2]  # a variant's tag
            name = f"adaptive {tag}" if tag else "adaptive"
            parts = [f"concurrency {concurrency}: {name} {adaptive['tok_s']:.1f} tok/s"]
            if fixed:
                best = max(fixed, key=lambda r: r["tok_s"])
                parts.append(
                    f"{adaptive['tok_s'] / best['tok_s']:.3f}x best fixed ({best['label']})"
                    + paired_ratios(adaptive, best, fastest)
                )
            if baseline:
                parts.append(
                    f"{adaptive['tok_s'] / baseline['tok_s']:.3f}x no spec"
                    + paired_ratios(adaptive, baseline, fastest)
                )
            if adaptive is not variants[0] and not variants[0]["label"].partition(" ")[2]:
                parts.append(
                    f"{adaptive['tok_s'] / variants[0]['tok_s']:.3f}x {variants[0]['label']}"
                    + paired_ratios(adaptive, variants[0], fastest)
                )
            lines.append(", ".join(parts))
    return lines


FULL_SPEED = 1.25
"""A run had the host at full speed when both its probes (``host_probe_ms``) read at most
this factor above the fastest probe of its level: hosts can switch between two distinct
speeds, and a run slowed at either end may have run slow."""


def paired_ratios(row: dict, baseline: dict, fastest: float | None = None) -> str:
    """`` [paired: median m, min-max]`` of ``row``'s tok/s over ``baseline``'s within each
    repeat (``tok_s_runs`` in repeat order), or nothing with a single repeat. Given the
    level's fastest host probe, also the median over the repeats whose two runs both had
    the host at full speed (``FULL_SPEED``), when some but not all did."""
    runs, base = row.get("tok_s_runs", []), baseline.get("tok_s_runs", [])
    if len(runs) < 2 or len(runs) != len(base):
        return ""
    ratios = np.divide(runs, base)
    text = (
        f" [paired over {len(ratios)} repeats: median {np.median(ratios):.3f}, "
        f"{ratios.min():.3f}-{ratios.max():.3f}"
    )
    probes, base_probes = row.get("probe_ms_runs"), baseline.get("probe_ms_runs")
    if fastest and probes and base_probes and len(probes) == len(base_probes) == len(runs):
        limit = FULL_SPEED * fastest
        full = [
            ratio
            for ratio, mine, theirs in zip(ratios, probes, base_probes, strict=True)
            if max(mine) <= limit and max(theirs) <= limit
        ]
        if 0 < len(full) < len(ratios):
            text += f"; host at full speed in both: median {np.median(full):.3f} over {len(full)}"
    return text + "]"


def fastest_probe(rows: list[dict]) -> float | None:
    """The fastest host probe over ``rows``' runs (None where none was taken)."""
    readings = [min(p) for r in rows for p in r.get("probe_ms_runs", []) if min(p) > 0]
    return min(readings) if readings else None


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        series = sorted((r for r in rows if r["label"] == label), key=lambda r: r["concurrency"])
        style = dict(marker="o", lw=2.5 if label.startswith("adaptive") else 1.2)
        if label == "no spec":
            style.update(color="black", ls="--")
        x = [r["concurrency"] for r in series]
        left.plot(x, [r["tok_s"] for r in series], label=label, **style)
        user = [r["per_user_tok_s"] for r in series]
        right.plot(user, [r["tok_s"] for r in series], label=label, **style)
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrency (requests in flight)")
    left.set_ylabel("aggregate tok/s")
    left.set_title(f"throughput vs load ({title})", fontsize=9)
    right.set_xlabel("per-user tok/s (median 1/TPOT)")
    right.set_ylabel("aggregate tok/s")
    right.set_title("throughput vs per-user speed", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
