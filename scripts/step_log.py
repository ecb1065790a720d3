"""Where two settings' step times part, from a bench run's ``steps.json`` (``dspark bench
--step-log``): per level and setting, the steps by kind (decodes alone or with a prompt
chunk; drafting depth; eager, replayed or covered forward; capture), each kind's count
and mean time and phases, and then, against a reference setting, how much of the
difference in mean step time comes from how often each kind ran and how much from what
each kind cost.

    PYTHONPATH=src python scripts/step_log.py DIR/steps.json[.gz] [REFERENCE_LABEL]

REFERENCE_LABEL defaults to the first fixed K in the file. Times are the engine's own,
inside ``LLMEngine.step`` (the closed loop's work between steps is not in them), pooled
over the repeats (windows) of each setting.
"""

import gzip
import json
import sys
from collections import defaultdict

import numpy as np

PHASES = (
    "draft_ms",
    "before_ms",
    "shape_ms",
    "decide_ms",
    "plan_ms",
    "sync_ms",
    "propose_ms",
    "schedule_ms",
    "forward_ms",
    "apply_ms",
    "flush_ms",
)


def kind(step: dict) -> str:
    """A step's kind: mixed or decode, depth, and how its forward ran."""
    if step["captured"]:
        return "capture"
    batch = "mixed" if step["chunk_tokens"] else "decode"
    run = "eager" if not step["graph_tokens"] else ("covered" if step["covered"] else "graph")
    settled = "s" if step.get("settled") else ""  # older logs lack the field
    return f"{batch} d{step['depth']}{settled} {run}"


def load(path: str) -> dict:
    """(concurrency, label) -> list of step dicts, pooled over repeats, in the file's
    order of settings."""
    pooled = defaultdict(list)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as file:
        runs = json.load(file)
    for run in runs:
        fields = run["fields"]
        for row in run["steps"]:
            pooled[run["concurrency"], run["label"]].append(dict(zip(fields, row, strict=True)))
    return pooled


def table(label: str, steps: list[dict]) -> dict:
    groups = defaultdict(list)
    for step in steps:
        groups[kind(step)].append(step)
    total = len(steps)
    wall = np.array([s["wall_ms"] for s in steps])
    emitted = sum(s["emitted"] for s in steps)
    print(
        f"\n  {label}: {total} steps, mean {wall.mean():.3f} ms (median {np.median(wall):.3f}),"
        f" {emitted / wall.sum():.2f} tokens/ms inside steps, {emitted / total:.2f} tokens a step"
    )
    print(
        f"  {'kind':<22}{'steps':>6}{'share':>7}{'mean':>8}{'p50':>8}"
        + "".join(f"{p.removesuffix('_ms'):>9}" for p in PHASES)
        + f"{'tokens':>8}{'emit':>7}"
    )
    summary = {}
    for name in sorted(groups, key=lambda g: -len(groups[g])):
        rows = groups[name]
        times = np.array([s["wall_ms"] for s in rows])
        phases = [np.mean([s.get(p, np.nan) for s in rows]) for p in PHASES]  # older logs lack some
        summary[name] = (len(rows) / total, times.mean())
        print(
            f"  {name:<22}{len(rows):>6}{len(rows) / total:>7.1%}{times.mean():>8.3f}"
            f"{np.median(times):>8.3f}"
            + "".join(f"{p:>9.3f}" for p in phases)
            + f"{np.mean([s['tokens'] for s in rows]):>8.1f}"
            + f"{np.mean([s['emitted'] for s in rows]):>7.1f}"
        )
    return summary


def decompose(reference: dict, other: dict) -> None:
    """Mean step time difference = sum over kinds of (share change x reference cost) +
    (other's share x cost change); kinds one side lacks count wholly as share."""
    kinds = set(reference) | set(other)
    mix = cost = 0.0
    lines = []
    for name in kinds:
        share_r, cost_r = reference.get(name, (0.0, 0.0))
        share_o, cost_o = other.get(name, (0.0, 0.0))
        if name not in reference:
            part_mix, part_cost = share_o * cost_o, 0.0
        elif name not in other:
            part_mix, part_cost = -share_r * cost_r, 0.0
        else:
            part_mix, part_cost = (share_o - share_r) * cost_r, share_o * (cost_o - cost_r)
        mix += part_mix
        cost += part_cost
        lines.append((abs(part_mix) + abs(part_cost), name, part_mix, part_cost))
    print(f"    from how often each kind ran: {mix:+.3f} ms; from what each cost: {cost:+.3f} ms")
    for _, name, part_mix, part_cost in sorted(lines, reverse=True)[:8]:
        print(f"      {name:<22} mix {part_mix:+.3f}  cost {part_cost:+.3f}")


def main() -> None:
    pooled = load(sys.argv[1])
    labels = list(dict.fromkeys(label for _, label in pooled))  # the file's order
    reference = (
        sys.argv[2]
        if len(sys.argv) > 2
        else next((lb for lb in labels if lb.startswith("K=")), labels[0])
    )
    for level in sorted({c for c, _ in pooled}):
        print(f"\n=== concurrency {level}")
        summaries = {}
        for label in labels:
            if (level, label) in pooled:
                summaries[label] = table(label, pooled[level, label])
        ref = summaries.get(reference)
        if ref is None:
            continue
        for label, summary in summaries.items():
            if label == reference:
                continue
            ref_mean = sum(share * c for share, c in ref.values())
            mean = sum(share * c for share, c in summary.values())
            print(f"\n  {label} against {reference}: {mean - ref_mean:+.3f} ms a step")
            decompose(ref, summary)


if __name__ == "__main__":
    main()
