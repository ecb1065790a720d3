"""What a drafter's capacity costs: its K-deep proposal against the target's verify step,
for drafters of several shapes (random weights: the time does not depend on them).

    PYTHONPATH=src python scripts/drafter_cost.py --layers 2 3 5 --intermediate 1024 1536 \
        --concurrency 1 16 --out docs/results/drafter/capacity/cpu

Each drafter is built for the target (default SmolLM2-135M-Instruct, or --shape), given
the shipped drafter's reduced vocabulary where it has one, and timed through the engine's
own runner (``dspark.bench.roofline.StepTimer``). Prints a table, writes cost.json and
cost.png: the drafter's share of a speculative round is drafter / (drafter + verify).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from dspark.bench.roofline import StepTimer
from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.shipped import find_drafter
from dspark.figures import save_figure
from dspark.models.drafter import (
    DRAFT_VOCAB_FILE,
    DrafterConfig,
    DraftModel,
    count_parameters,
    save_drafter,
)
from dspark.models.loader import load_model, resolve_dtype
from dspark.models.shapes import random_model
from dspark.ops.linear import cpu_name
from dspark.train.trainer import init_drafter


def build(loaded, layers: int, intermediate: int, k: int, directory: Path) -> int:
    """A random drafter of this shape saved under ``directory``; returns its parameters."""
    config = DrafterConfig.for_target(
        loaded.config, num_layers=layers, intermediate_size=intermediate, block_size=k
    )
    drafter = DraftModel(config)
    init_drafter(drafter, seed=0)
    save_drafter(drafter, directory, {"kind": "random, for timing"})
    shipped = find_drafter(loaded.config)
    if shipped is not None and (shipped / DRAFT_VOCAB_FILE).is_file():
        shutil.copy(shipped / DRAFT_VOCAB_FILE, directory / DRAFT_VOCAB_FILE)
    return count_parameters(drafter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="target (default SmolLM2)")
    parser.add_argument("--shape", default=None, help="a named shape with random weights")
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--intermediate", type=int, nargs="+", default=[1024])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--k", type=int, default=7, help="drafts per proposal")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--out", type=Path, default=Path("results/drafter_cost"))
    args = parser.parse_args()
    dtype = resolve_dtype(args.dtype, args.device)
    if args.shape:
        loaded = random_model(args.shape, dtype, torch.device(args.device))
    else:
        loaded = load_model(args.model, dtype, args.device)
    largest, query = max(args.concurrency), args.k + 1
    room = 16 * -(-(args.context + 2 * query + 1) // 16)
    config = EngineConfig(
        max_num_seqs=largest,
        max_num_batched_tokens=max(2048, largest * query),
        kv_cache_tokens=largest * room,
        max_model_len=room,
        spec="fixed",
        num_drafts=args.k,
    )
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        shapes = [(n, i) for n in args.layers for i in args.intermediate]
        for layers, intermediate in shapes:
            directory = Path(scratch) / f"l{layers}-i{intermediate}"
            params = build(loaded, layers, intermediate, args.k, directory)
            engine = LLMEngine(loaded, replace(config, drafter=str(directory)))
            timer = StepTimer(engine)
            for num_reqs in sorted(args.concurrency):
                verify = timer.time(num_reqs, query, args.context, args.repeats)
                draft = timer.drafter_ms(
                    engine.drafter, num_reqs, args.k, args.context, args.repeats
                )
                verify_ms, draft_ms = statistics.median(verify), statistics.median(draft)
                rows.append(
                    {
                        "layers": layers,
                        "intermediate": intermediate,
                        "params_m": round(params / 1e6, 2),
                        "bf16_mib": round(params * 2 / 2**20, 1),
                        "requests": num_reqs,
                        "verify_ms": verify_ms,
                        "drafter_ms": draft_ms,
                        "share": draft_ms / (draft_ms + verify_ms),
                        "verify_runs": verify,
                        "drafter_runs": draft,
                    }
                )
                r = rows[-1]
                print(
                    f"layers {layers} MLP {intermediate} ({r['params_m']} M, {r['bf16_mib']} "
                    f"MiB): {num_reqs:>3} requests  verify {verify_ms:7.2f} ms  drafter "
                    f"{draft_ms:7.2f} ms  share {r['share']:.1%}",
                    flush=True,
                )
            engine.close()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_name()
    payload = {
        "device": device,
        "machine": platform.platform(),
        "torch": torch.__version__,
        "target": args.shape or str(loaded.path.name),
        "dtype": str(dtype),
        "k": args.k,
        "context": args.context,
        "rows": rows,
    }
    (args.out / "cost.json").write_text(json.dumps(payload, indent=1))
    plot(rows, args.out / "cost.png", f"{payload['target']} on {device}, K = {args.k}")


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    levels = sorted({r["requests"] for r in rows})
    shapes = sorted({(r["layers"], r["intermediate"]) for r in rows})
    width = 0.8 / len(shapes)
    for j, (layers, intermediate) in enumerate(shapes):
        shares = [
            next(
                r["share"]
                for r in rows
                if r["requests"] == c
                and r["layers"] == layers
                and r["intermediate"] == intermediate
            )
            for c in levels
        ]
        xs = [i + j * width for i in range(len(levels))]
        ax.bar(xs, [100 * s for s in shares], width, label=f"{layers} layers, MLP {intermediate}")
    ax.set_xticks([i + width * (len(shapes) - 1) / 2 for i in range(len(levels))])
    ax.set_xticklabels([f"{c} requests" for c in levels])
    ax.set_ylabel("drafter's share of a round (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    main()
