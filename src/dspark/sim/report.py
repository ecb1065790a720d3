"""Tables, checks, JSON and plots for a simulator sweep."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dspark.figures import save_figure
from dspark.sim.simulator import RunResult
from dspark.sim.sweep import POLICY_NAMES, SweepResult

Point = tuple[str, int, int]  # domain, context, concurrency


def _main_runs(result: SweepResult) -> dict[Point, dict[str, RunResult]]:
    """Runs at the sweep's own calibration, by point and policy."""
    cfg = result.config
    points: dict[Point, dict[str, RunResult]] = defaultdict(dict)
    for run in result.runs:
        lab = run.labels
        if (lab["conf_bias"], lab["conf_noise"]) == (cfg.conf_bias, cfg.conf_noise):
            points[(lab["domain"], lab["context"], run.concurrency)][run.policy] = run
    return dict(points)


def _best_fixed(runs: dict[str, RunResult]) -> RunResult | None:
    fixed = [r for name, r in runs.items() if name.startswith("fixed-")]
    return max(fixed, key=lambda r: r.throughput_tok_s) if fixed else None


def summary_table(result: SweepResult) -> str:
    points = _main_runs(result)
    lines = []
    header = (
        f"{'domain':6} {'ctx':>5} {'conc':>4} | {'no-spec':>8} {'best fixed':>13} {'seed':>8} "
        f"{'ours':>8} {'ideal':>8} | {'ours/fixK':>9} {'ours/seed':>9} {'ours/ideal':>10}"
    )
    lines += [header, "-" * len(header)]

    def ratio(a: RunResult | None, b: RunResult | None) -> str:
        return f"{a.throughput_tok_s / b.throughput_tok_s:9.3f}" if a and b else f"{'-':>9}"

    for (domain, context, conc), runs in sorted(points.items()):
        tok = {name: f"{r.throughput_tok_s:.0f}" for name, r in runs.items()}
        best = _best_fixed(runs)
        best_text = f"{best.throughput_tok_s:8.0f} (K={best.policy[6:]})" if best else f"{'-':>13}"
        ours = runs.get("ours")
        lines.append(
            f"{domain:6} {context:5d} {conc:4d} | {tok.get('no-spec', '-'):>8} {best_text:>13} "
            f"{tok.get('seed', '-'):>8} {tok.get('ours', '-'):>8} {tok.get('ideal', '-'):>8} | "
            f"{ratio(ours, best)} {ratio(ours, runs.get('seed'))} "
            f"{ratio(ours, runs.get('ideal')):>10}"
        )
    return "\n".join(lines)


def full_table(result: SweepResult) -> str:
    header = (
        f"{'domain':6} {'ctx':>5} {'bias':>5} {'noise':>5} {'conc':>4} {'policy':8} "
        f"{'tok/s':>8} {'user tok/s':>10} {'TPOT p50':>8} {'TPOT p99':>8} "
        f"{'verified':>8} {'tau':>5} {'step ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in result.runs:
        lab = r.labels
        lines.append(
            f"{lab['domain']:6} {lab['context']:5d} {lab['conf_bias']:5.1f} "
            f"{lab['conf_noise']:5.1f} {r.concurrency:4d} {r.policy:8} "
            f"{r.throughput_tok_s:8.0f} {r.per_user_tok_s:10.1f} "
            f"{r.tpot_p50_ms:8.2f} {r.tpot_p99_ms:8.2f} {r.verified_per_step:8.2f} "
            f"{r.acceptance_length:5.2f} {r.mean_step_ms:8.2f}"
        )
    return "\n".join(lines)


def checks(result: SweepResult) -> dict[str, object]:
    """The headline comparisons, from the sweep: ours against the best fixed K, the seed
    and the ideal policy, and what miscalibrated confidences cost ours."""
    points = _main_runs(result)
    out: dict[str, object] = {}
    vs_fixed = [
        (runs["ours"].throughput_tok_s / _best_fixed(runs).throughput_tok_s, p)
        for p, runs in points.items()
        if "ours" in runs and _best_fixed(runs)
    ]
    if vs_fixed:
        worst, where = min(vs_fixed)
        out["ours_vs_best_fixed_min"] = {"ratio": worst, "at": where}
    vs_seed = {
        p: runs["ours"].throughput_tok_s / runs["seed"].throughput_tok_s
        for p, runs in points.items()
        if "ours" in runs and "seed" in runs
    }
    if vs_seed:
        out["ours_vs_seed_chat_1k_conc_ge_128"] = {
            str(p[2]): r
            for p, r in sorted(vs_seed.items())
            if p[0] == "chat" and p[1] == 1024 and p[2] >= 128
        }
        out["ours_vs_seed_max"] = max((r, p) for p, r in vs_seed.items())
    vs_ideal = [
        (runs["ours"].throughput_tok_s / runs["ideal"].throughput_tok_s, p)
        for p, runs in points.items()
        if "ours" in runs and "ideal" in runs
    ]
    if vs_ideal:
        worst, where = min(vs_ideal)
        out["ours_vs_ideal_min"] = {"ratio": worst, "at": where}
    calibrated = {
        (r.labels["domain"], r.labels["context"], r.concurrency): r.throughput_tok_s
        for r in result.runs
        if r.policy == "ours" and r.labels["conf_bias"] == 0.0 and r.labels["conf_noise"] == 0.0
    }
    costs: dict[str, list[float]] = defaultdict(list)
    for r in result.runs:
        key = (r.labels["domain"], r.labels["context"], r.concurrency)
        if (
            r.policy == "ours"
            and key in calibrated
            and (r.labels["conf_bias"], r.labels["conf_noise"]) != (0.0, 0.0)
        ):
            costs[f"bias={r.labels['conf_bias']:+.1f} noise={r.labels['conf_noise']:.1f}"].append(
                r.throughput_tok_s / calibrated[key]
            )
    out["miscalibration_ours_relative"] = {
        level: {"min": float(np.min(v)), "mean": float(np.mean(v))} for level, v in costs.items()
    }
    return out


def format_checks(found: dict[str, object]) -> str:
    lines = []
    if "ours_vs_best_fixed_min" in found:
        f = found["ours_vs_best_fixed_min"]
        lines.append(f"ours / best fixed K, lowest over all points: {f['ratio']:.3f} at {f['at']}")
    if "ours_vs_seed_chat_1k_conc_ge_128" in found:
        pairs = ", ".join(
            f"{c}: {r:.3f}" for c, r in found["ours_vs_seed_chat_1k_conc_ge_128"].items()
        )
        lines.append(f"ours / seed, chat at 1k context, concurrency >= 128: {pairs}")
        ratio, where = found["ours_vs_seed_max"]
        lines.append(f"ours / seed, largest anywhere: {ratio:.3f} at {where}")
    if "ours_vs_ideal_min" in found:
        f = found["ours_vs_ideal_min"]
        lines.append(f"ours / ideal, lowest over all points: {f['ratio']:.3f} at {f['at']}")
    for level, v in found.get("miscalibration_ours_relative", {}).items():
        lines.append(
            f"ours with {level}: {v['mean']:.3f} of calibrated on average, {v['min']:.3f} at worst"
        )
    return "\n".join(lines)


def save(result: SweepResult) -> list[Path]:
    out = result.config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    config = {**asdict(result.config), "out_dir": str(result.config.out_dir)}
    payload = {
        "config": config,
        "seconds": result.seconds,
        "checks": _jsonable(checks(result)),
        "runs": [r.to_dict() for r in result.runs],
    }
    paths = [out / "sim.json", out / "sim_table.txt"]
    paths[0].write_text(json.dumps(payload, indent=1))
    paths[1].write_text(summary_table(result) + "\n\n" + full_table(result) + "\n")
    paths += _plot(result, out)
    return paths


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _style(policy: str) -> dict:
    if policy.startswith("fixed-"):
        import matplotlib

        k = int(policy[6:])
        return {
            "color": matplotlib.colormaps["viridis"](0.1 + 0.12 * (k - 1)),
            "lw": 1.0,
            "alpha": 0.75,
        }
    return {
        "no-spec": {"color": "grey", "ls": "--", "lw": 1.2},
        "seed": {"color": "tab:orange", "lw": 2.0},
        "ours": {"color": "tab:blue", "lw": 2.5},
        "ideal": {"color": "black", "ls": ":", "lw": 1.5},
    }[policy]


def _plot(result: SweepResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    points = _main_runs(result)
    domains = sorted({p[0] for p in points})
    contexts = sorted({p[1] for p in points})
    paths = []
    for kind in ("throughput", "relative", "pareto"):
        fig, axes = plt.subplots(
            len(contexts),
            len(domains),
            squeeze=False,
            figsize=(4.2 * len(domains), 3.4 * len(contexts)),
        )
        for i, context in enumerate(contexts):
            for j, domain in enumerate(domains):
                ax = axes[i][j]
                series = sorted(
                    (p[2], runs) for p, runs in points.items() if p[:2] == (domain, context)
                )
                concs = [c for c, _ in series]
                for policy in POLICY_NAMES:
                    rows = [
                        (c, runs[policy], _best_fixed(runs)) for c, runs in series if policy in runs
                    ]
                    if not rows:
                        continue
                    if kind == "throughput":
                        x, y = [c for c, _, _ in rows], [r.throughput_tok_s for _, r, _ in rows]
                    elif kind == "relative":
                        x = [c for c, _, _ in rows]
                        y = [r.throughput_tok_s / b.throughput_tok_s for _, r, b in rows]
                    else:
                        x, y = (
                            [r.per_user_tok_s for _, r, _ in rows],
                            [r.throughput_tok_s for _, r, _ in rows],
                        )
                    ax.plot(x, y, marker="o", ms=2.5, label=policy, **_style(policy))
                ax.set_title(f"{domain}, context {context}", fontsize=9)
                ax.grid(True, alpha=0.3)
                if kind == "pareto":
                    ax.set_xscale("log")
                    ax.set_yscale("log")
                    ax.xaxis.set_minor_formatter(NullFormatter())
                    ax.yaxis.set_minor_formatter(NullFormatter())
                    ax.set_xlabel("per-user tok/s")
                    ax.set_ylabel("aggregate tok/s")
                else:
                    ax.set_xscale("log", base=2)
                    ax.set_xticks(concs, [str(c) for c in concs], fontsize=7)
                    ax.set_xlabel("concurrency")
                    if kind == "throughput":
                        ax.set_yscale("log")
                        ax.yaxis.set_minor_formatter(NullFormatter())
                        ax.set_ylabel("aggregate tok/s")
                    else:
                        ax.set_ylabel("tok/s / best fixed K")
                        ax.set_ylim(0.5, 1.15)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center right", fontsize=7)
        surface = result.runs[0].labels["surface"] if result.runs else ""
        fig.suptitle(f"dspark simulate — {kind} ({surface} surface)", fontsize=10)
        fig.tight_layout(rect=(0, 0, 0.9, 1))
        path = out / f"sim_{kind}.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
