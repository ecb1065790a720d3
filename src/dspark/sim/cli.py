"""``dspark simulate``: every verification policy side by side, on measured step costs.

Runs a closed-loop decode simulation for each domain x context x concurrency point and
every policy (no speculation, fixed K = 1..7, the seed's adaptive policy with its 1-D
cost tables, ours with the batch-aware cost surface, and an ideal-information reference),
then prints a summary and writes sim.json, sim_table.txt and three PNG plots. Bring your
own step costs with --surface (a JSON file in the format of dspark/data's H200 surface).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.sim.acceptance import DOMAINS
from dspark.sim.report import checks, format_checks, save, summary_table
from dspark.sim.sweep import POLICY_NAMES, SweepConfig, run_sweep


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    d = SweepConfig()
    parser.add_argument("--domains", nargs="+", default=list(d.domains), choices=DOMAINS)
    parser.add_argument(
        "--contexts",
        nargs="+",
        type=int,
        default=list(d.contexts),
        help="prompt tokens cached when a request starts decoding",
    )
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(d.concurrency))
    parser.add_argument("--policies", nargs="+", default=list(d.policies), choices=POLICY_NAMES)
    parser.add_argument("--steps", type=int, default=d.num_steps, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=d.warmup_steps)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--surface",
        default=d.surface,
        help="cost-surface JSON (default: the measured H200 surface)",
    )
    parser.add_argument(
        "--sharegpt",
        action="store_true",
        help="prompt/output lengths from ShareGPT instead of --contexts",
    )
    parser.add_argument(
        "--output-len", nargs=2, type=int, default=list(d.output_len), metavar=("LOW", "HIGH")
    )
    parser.add_argument(
        "--conf-bias",
        type=float,
        default=d.conf_bias,
        help="logit bias of the drafter's confidences (0: calibrated)",
    )
    parser.add_argument(
        "--conf-noise",
        type=float,
        default=d.conf_noise,
        help="logit noise of the drafter's confidences (0: calibrated)",
    )
    parser.add_argument(
        "--no-calibration-study",
        action="store_true",
        help="skip the runs of 'ours' under miscalibrated confidences",
    )
    parser.add_argument("--jobs", type=int, default=d.jobs, help="worker processes")
    parser.add_argument("--out-dir", type=Path, default=d.out_dir)


def main(args: argparse.Namespace) -> None:
    config = SweepConfig(
        domains=tuple(args.domains),
        contexts=tuple(args.contexts),
        concurrency=tuple(args.concurrency),
        policies=tuple(args.policies),
        num_steps=args.steps,
        warmup_steps=args.warmup,
        seed=args.seed,
        surface=args.surface,
        sharegpt=args.sharegpt,
        output_len=tuple(args.output_len),
        conf_bias=args.conf_bias,
        conf_noise=args.conf_noise,
        calibration_study=not args.no_calibration_study,
        jobs=args.jobs,
        out_dir=args.out_dir,
    )
    result = run_sweep(config)
    print(summary_table(result))
    print()
    print(format_checks(checks(result)))
    paths = save(result)
    print(
        f"\n{len(result.runs)} runs in {result.seconds:.0f} s; wrote " + ", ".join(map(str, paths))
    )
