"""The ``dspark`` command line: one subcommand per job, each owning its arguments."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module with add_cli_args/main, one-line help)
SUBCOMMANDS = {
    "bench": ("dspark.bench.sweep", "no spec vs fixed K vs adaptive across concurrency"),
    "bench-scheduler": ("dspark.bench.scheduler", "time the per-step scheduling decisions"),
    "simulate": ("dspark.sim.cli", "compare verification policies on measured step costs"),
    "generate": ("dspark.engine.cli", "generate text for a prompt with the reference engine"),
    "bench-engine": ("dspark.bench.engine", "time the reference engine (and transformers)"),
    "roofline": ("dspark.bench.roofline", "step time by kernel class against the hardware bound"),
    "serve": ("dspark.server.cli", "an OpenAI-compatible HTTP server over the engine"),
    "bench-serve": ("dspark.bench.load", "load-test the server with streaming clients"),
    "distill": ("dspark.train.distill", "distillation data: the target answers chat turns"),
    "train-drafter": ("dspark.train.cli", "train a DSpark drafter by self-distillation"),
    "calibrate": ("dspark.train.calibrate_cli", "fit per-position confidence temperatures"),
    "eval-drafter": ("dspark.train.evaluate", "acceptance of drafters on held-out prompts"),
    "draft-vocab": ("dspark.train.draft_vocab", "keep the drafter's most frequent tokens"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_cli_args(sub)
        sub.set_defaults(handler=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except ValueError as error:
        print(f"dspark {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
