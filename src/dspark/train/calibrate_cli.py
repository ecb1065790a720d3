"""``dspark calibrate``: sequential temperature scaling of a drafter's confidences.

The drafter decodes held-out ShareGPT prompts in the engine with a fixed K; every round
that verified all K drafts gives the raw confidences and how many drafts were accepted,
which is exactly what the scheduler sees. (Rounds start where the previous one stopped,
often right after a rejection, so they are harder than positions drawn uniformly.)
Temperatures are fitted left to right on the calibration split
(``dspark.train.calibration``); ECE and AUROC of the survival at each position are
reported before and after on the separate evaluation split. The temperatures go into
the drafter's drafter.json; the report (JSON) and one reliability diagram per position
(PNG) go to --report (default DRAFTER/calibration).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dspark.models.drafter import read_drafter_config, write_calibration
from dspark.models.loader import load_model, resolve_dtype
from dspark.train.calibration import (
    calibration_report,
    fit_sequential_temperatures,
    plot_reliability,
)
from dspark.train.data import load_prompts, sharegpt_prompts
from dspark.train.evaluate import full_rounds, run_engine


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter", required=True, help="drafter directory (updated in place)")
    parser.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument(
        "--prompts", default=None, help="tokenised prompt splits (python -m dspark.train.data)"
    )
    parser.add_argument("--num-prompts", type=int, default=160, help="per held-out split")
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--report", default=None, help="report directory")
    parser.add_argument(
        "--no-shift", action="store_true", help="temperatures only (plain STS, no shifts)"
    )
    parser.add_argument(
        "--rounds", default=None, help="refit from the rounds.npz of an earlier run (no decoding)"
    )


def logits_of(probabilities: np.ndarray) -> np.ndarray:
    p = np.clip(probabilities.astype(np.float64), 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def collect_rounds(args: argparse.Namespace, k: int) -> tuple[dict, str]:
    """Engine rounds (raw confidence logits, accepted drafts) per held-out split."""
    dtype = resolve_dtype(args.dtype, args.device)
    loaded = load_model(args.model, dtype=dtype, device=args.device)
    given = load_prompts(args.prompts) if args.prompts else {}
    rounds = {}
    for split in ("calib", "eval"):
        prompts = given.get(split) or sharegpt_prompts(
            loaded.tokenizer, split, args.max_prompt_tokens, args.num_prompts
        )
        prompts = [p for p in prompts if len(p) <= args.max_prompt_tokens][: args.num_prompts]
        engine = run_engine(
            loaded,
            args.drafter,
            prompts,
            args.temperature,
            k,
            args.concurrency,
            args.max_tokens,
            raw_confidences=True,
        )
        confidences, accepted = full_rounds(engine, k)
        rounds[split] = (logits_of(confidences), accepted)
        print(f"[dspark] {split}: {len(accepted)} rounds from {len(prompts)} prompts")
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    source = f"engine rounds, K={k}, temperature {args.temperature:g}, {device}, {dtype}"
    return rounds, source


def main(args: argparse.Namespace) -> None:
    config, _ = read_drafter_config(args.drafter)
    if not config.confidence_head:
        raise ValueError(f"{args.drafter} has no confidence head to calibrate")
    k = config.block_size
    report_dir = Path(args.report) if args.report else Path(args.drafter) / "calibration"
    report_dir.mkdir(parents=True, exist_ok=True)
    if args.rounds:
        with np.load(args.rounds) as saved:
            rounds = {s: (saved[f"{s}_logits"], saved[f"{s}_accepted"]) for s in ("calib", "eval")}
            source = str(saved["source"])
    else:
        rounds, source = collect_rounds(args, k)
        np.savez_compressed(
            report_dir / "rounds.npz",
            source=source,
            **{
                f"{s}_{name}": r[i]
                for s, r in rounds.items()
                for i, name in enumerate(("logits", "accepted"))
            },
        )
    temperatures, shifts = fit_sequential_temperatures(*rounds["calib"], shift=not args.no_shift)
    report = {
        "temperatures": [round(float(t), 4) for t in temperatures],
        "shifts": [round(float(b), 4) for b in shifts],
        "bins": 15,
        "held_out": {
            "before": calibration_report(*rounds["eval"], None),
            "after": calibration_report(*rounds["eval"], temperatures, shifts),
        },
        "calibration_set": {
            "before": calibration_report(*rounds["calib"], None),
            "after": calibration_report(*rounds["calib"], temperatures, shifts),
        },
        "rounds": source,
    }
    (report_dir / "calibration.json").write_text(json.dumps(report, indent=1))
    plot_reliability(*rounds["eval"], temperatures, shifts, report_dir, "held-out survival")
    write_calibration(args.drafter, list(temperatures), list(shifts), report)
    before, after = report["held_out"]["before"], report["held_out"]["after"]
    print(f"temperatures  {np.round(temperatures, 3).tolist()}")
    print(f"shifts        {np.round(shifts, 3).tolist()}")
    print(f"{'position':>8} {'ECE raw':>8} {'ECE cal':>8} {'AUROC':>7} {'survival':>9}")
    for i in range(k):
        print(
            f"{i + 1:>8} {before['ece'][i]:>8.4f} {after['ece'][i]:>8.4f} "
            f"{after['auroc'][i]:>7.3f} {after['observed_rate'][i]:>9.3f}"
        )
    print(f"[dspark] {after['rounds']} held-out rounds; wrote {report_dir} and the temperatures")
