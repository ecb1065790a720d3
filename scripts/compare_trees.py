"""Compare two source trees of dspark on this machine, in one run.

    python scripts/compare_trees.py OLD [NEW] [--rounds 3] [--out DIR] [-- BENCH ARGS]

OLD and NEW are git refs (checked out into temporary worktrees) or directories holding a
``src/dspark``; NEW defaults to the working tree. Two checks:

- **Decisions** (``--decisions``, quick): each tree's adaptive engine runs the same
  deterministic workload (a random-weight target, acceptance replayed from the shipped
  trace and the published chat rates, fixed prices, no throughput gate), look-ahead off
  and on, padded steps off and on; every step's budget, every round and every output
  must be equal.
- **Throughput** (the default): ``dspark bench`` (the main job unless BENCH ARGS say
  otherwise) run by each tree in turn, ``--rounds`` times in the order OLD NEW NEW OLD
  ..., so that a drift of the machine's speed hits both alike. Prints each setting's
  tok/s per tree, the new/old ratio of medians and the range of the per-round ratios;
  writes ``compare.json`` and ``compare.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

DECISIONS = r"""
import hashlib, json, sys
import numpy as np, torch
from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import LLMEngine
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model

ADAPTIVE = ("throughput_gate", "lookahead", "settle", "fill_padding", "defer_upkeep")
try:  # the engine settings as this tree spells them
    from dspark.engine.config import AdaptiveConfig, EngineConfig

    def config(**kw):
        adaptive = {k: kw.pop(k) for k in list(kw) if k in ADAPTIVE}
        return EngineConfig(**kw, adaptive=AdaptiveConfig(**adaptive))
except ImportError:
    from dspark.engine.engine import EngineConfig as config

class FixedPrices:
    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 8.0 + 0.1 * num_tokens + 0.4 * np.arange(max_drafts + 1) + self.draft_cost_ms(0)
    def draft_cost_ms(self, num_reqs, depth=None):
        return 0.5 + 0.2 * (7 if depth is None else depth)

target = random_model("tiny", torch.float32)
draft_model = random_draft_model(target)
out = {}
for lookahead in ("off", "on"):
    for graphs in ("off", "on"):
        for trace in ("shipped", "published:chat"):
            shipped = trace == "shipped"
            rounds = AcceptanceTrace.load() if shipped else AcceptanceTrace.resolve(trace)
            engine = LLMEngine(
                target,
                config(kv_cache_tokens=4096, spec="adaptive", num_drafts=7, max_num_seqs=4,
                       max_num_batched_tokens=28, throughput_gate=False, lookahead=lookahead,
                       cuda_graphs=graphs),
                drafter=ReplayDrafter(DSparkDrafter(draft_model, 8192, 16), rounds, seed=1),
                cost_model=FixedPrices(),
            )
            engine.round_log = []
            requests = [
                engine.add_request(
                    list(range(3 + i, 15 + 2 * i)),
                    SamplingParams(temperature=0.0, max_tokens=12 + 5 * i, ignore_eos=True),
                )
                for i in range(16)
            ]
            steps = 0
            while engine.has_unfinished():
                engine.step()
                steps += 1
                running = [r for r in requests if not r.is_finished and r.output_ids]
                if steps % 9 == 0 and len(running) > 1:  # a client goes away mid-decode
                    engine.abort(running[0].request_id)
            stats = engine.stats
            out[f"lookahead={lookahead} cuda_graphs={graphs} trace={trace}"] = {
                "budgets": [int(b) for b in stats.budgets],
                "depths": {str(d): n for d, n in sorted(stats.depth_steps.items())},
                "rounds": [[int(a), int(b)] for _, a, b in engine.round_log],
                "outputs": hashlib.sha1(
                    json.dumps([r.output_ids for r in requests]).encode()
                ).hexdigest(),
                "taken ahead": [stats.lookahead_hits, stats.lookahead_reused, stats.lookahead_plans,
                                stats.drafting_plans, stats.share_plans, stats.recut_plans],
            }
json.dump(out, sys.stdout)
"""


def tree_of(ref: str, scratch: Path) -> Path:
    """A directory holding ``src/dspark`` for ``ref``: the path itself, or a worktree."""
    path = Path(ref)
    if (path / "src" / "dspark").is_dir():
        return path.resolve()
    target = scratch / ref.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(target), ref],
        check=True,
        capture_output=True,
    )
    return target


def run_in(tree: Path, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run([sys.executable, *args], env=env, cwd=tree, check=True, **kwargs)


def compare_decisions(trees: dict[str, Path]) -> bool:
    logs = {}
    for label, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        done = subprocess.run(
            [sys.executable, "-c", DECISIONS], env=env, cwd=tree, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"{label} ({tree}) failed:\n{done.stderr[-3000:]}")
        logs[label] = json.loads(done.stdout)
    old, new = logs.values()
    same = True
    for case in old:
        equal = old[case] == new.get(case)
        same &= equal
        steps = len(old[case]["budgets"])
        print(f"{case:<50} {'same' if equal else 'DIFFERENT'} ({steps} budgets)")
    return same


def compare_throughput(trees: dict[str, Path], rounds: int, out: Path, bench: list[str]) -> None:
    labels = list(trees)
    order = []
    for i in range(rounds):
        order += labels if i % 2 == 0 else labels[::-1]
    runs: dict[str, list[list[dict]]] = {label: [] for label in labels}
    for i, label in enumerate(order):
        run_dir = out / "runs" / f"{i:02d}_{label}"
        print(f"run {i + 1}/{len(order)}: {label} ({trees[label]})", flush=True)
        run_in(trees[label], ["-m", "dspark.cli", "bench", *bench, "--out", str(run_dir)])
        runs[label].append(json.loads((run_dir / "bench.json").read_text())["rows"])
    keys = [(row["concurrency"], row["label"]) for row in runs[labels[0]][0]]
    table, lines = [], []
    header = f"{'level':>5} {'setting':<12} {labels[0]:>10} {labels[1]:>10}  new/old  per round"
    lines.append(header)
    for key in keys:
        per = {
            label: [
                next(r["tok_s"] for r in rows if (r["concurrency"], r["label"]) == key)
                for rows in runs[label]
            ]
            for label in labels
        }
        old, new = (np.array(per[label]) for label in labels)
        ratio = float(np.median(new) / np.median(old))
        paired = new / old
        table.append(
            {"concurrency": key[0], "label": key[1], **per, "ratio": ratio, "paired": list(paired)}
        )
        lines.append(
            f"{key[0]:>5} {key[1]:<12} {np.median(old):>10.2f} {np.median(new):>10.2f}  "
            f"{ratio:6.3f}  {paired.min():.3f}-{paired.max():.3f}"
        )
    text = "\n".join(lines)
    print(text)
    trees_json = {label: str(tree) for label, tree in trees.items()}
    payload = {"trees": trees_json, "order": order, "bench_args": bench, "rows": table}
    (out / "compare.json").write_text(json.dumps(payload, indent=1))
    (out / "compare.txt").write_text(text + "\n")
    plot(table, labels, out / "compare.png")


def plot(table: list[dict], labels: list[str], path: Path) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    import matplotlib.pyplot as plt

    from dspark.figures import save_figure

    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = [f"{row['label']} @{row['concurrency']}" for row in table]
    for i, row in enumerate(table):
        ax.scatter([i] * len(row["paired"]), row["paired"], color="tab:blue", s=12)
        ax.scatter([i], [row["ratio"]], color="black", marker="_", s=200)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"tok/s {labels[1]} / {labels[0]}")
    ax.set_title("per round (dots) and ratio of medians (bars)")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new", nargs="?", default=str(ROOT))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("compare-results"))
    parser.add_argument("--decisions", action="store_true", help="compare decisions only")
    args, bench = parser.parse_known_args()
    bench = [a for a in bench if a != "--"]
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"old": tree_of(args.old, Path(scratch)), "new": tree_of(args.new, Path(scratch))}
        try:
            if args.decisions:
                sys.exit(0 if compare_decisions(trees) else 1)
            args.out.mkdir(parents=True, exist_ok=True)
            compare_throughput(
                trees, args.rounds, args.out.resolve(), bench
            )  # runs write from their own tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


if __name__ == "__main__":
    main()
