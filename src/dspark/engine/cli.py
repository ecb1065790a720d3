"""``dspark generate``: generate text for one prompt with the reference engine.

Prints the generated text on stdout and a stats line (tokens/s, acceptance length,
verified tokens per step) on stderr. The chat template is applied for instruct models
(turn it off with --raw).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from dspark.engine.config import EngineConfig, SpecMode
from dspark.engine.llm import LLM
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import cache_dir, resolve_dtype


def add_tensor_parallel_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="split the target over N ranks, one process each (started and stopped here)",
    )


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    parser.add_argument(
        "--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--spec", choices=[m.value for m in SpecMode], default="adaptive")
    parser.add_argument("--k", type=int, default=4, help="drafts proposed per step")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="default: bfloat16 on CUDA, float32 on CPU",
    )
    add_tensor_parallel_arg(parser)


def main(args: argparse.Namespace) -> None:
    dtype = resolve_dtype(args.dtype, args.device)
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    # Adaptive verification profiles once per model, device and dtype; later runs read it.
    tp = args.tensor_parallel_size
    parallel = f"-tp{tp}" if tp > 1 else ""
    name = f"profile-{args.model or 'default'}-{args.device}-{dtype}{parallel}.json"
    name = name.replace("/", "_")
    config = EngineConfig(
        spec=args.spec,
        num_drafts=args.k,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        kv_cache_tokens=16384,
        profile_path=str(cache_dir() / name),
        tensor_parallel_size=tp,
    )
    with LLM(args.model, dtype=dtype, device=args.device, config=config) as llm:
        start = time.perf_counter()
        [output] = llm.generate([args.prompt], params, use_chat_template=not args.raw)
        seconds = time.perf_counter() - start
    if output.error:
        raise ValueError(output.error)
    print(output.text)
    stats = llm.engine.stats
    spec = f"spec={args.spec}"
    if args.spec != "none":
        spec += (
            f" k={args.k}, acceptance length {stats.acceptance_length:.2f}, "
            f"verified tokens/step {stats.verified_per_step:.2f}"
        )
    print(
        f"[dspark] {len(output.token_ids)} tokens in {seconds:.2f} s "
        f"({len(output.token_ids) / seconds:.1f} tok/s), {spec}, finish={output.finish_reason}",
        file=sys.stderr,
    )
