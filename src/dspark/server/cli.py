"""``dspark serve``: an OpenAI-compatible HTTP server over the reference engine.

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with "stream": true for
server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus text).
"""

from __future__ import annotations

import argparse
import os

import torch

from dspark.engine.cli import add_tensor_parallel_arg
from dspark.engine.config import EngineConfig, SpecMode
from dspark.models.loader import cache_dir, resolve_dtype

API_KEY_ENV = "DSPARK_API_KEY"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--served-name", default=None, help="model id clients must send")
    parser.add_argument("--spec", choices=[m.value for m in SpecMode], default="none")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--kv-cache-tokens", type=int, default=65536)
    parser.add_argument(
        "--max-pending",
        type=int,
        default=256,
        help="requests queued or running before new ones get HTTP 429",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=30.0,
        help="on shutdown, how long in-flight requests may still run",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"clients must send 'Authorization: Bearer KEY' to /v1 (default: ${API_KEY_ENV}; "
        "unset: no key); /health and /metrics stay open",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger request bodies get HTTP 413",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    add_tensor_parallel_arg(parser)


def main(args: argparse.Namespace) -> None:
    from dspark.engine.heap import keep_heap_frozen
    from dspark.server.serve import GracefulServer, create_app

    dtype = resolve_dtype(args.dtype, args.device)
    tp = f"-tp{args.tensor_parallel_size}" if args.tensor_parallel_size > 1 else ""
    config = EngineConfig(
        spec=args.spec,
        num_drafts=args.k,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_tokens=args.kv_cache_tokens,
        profile_path=str(
            cache_dir() / f"profile-serve-{args.device}-{dtype}{tp}.json".replace("torch.", "")
        ),
        tensor_parallel_size=args.tensor_parallel_size,
    )
    app, runner = create_app(
        args.model,
        config,
        args.max_pending,
        args.device,
        dtype,
        args.grace_seconds,
        args.served_name,
        args.api_key or None,
        args.max_body_bytes,
    )
    server = GracefulServer(app, runner, args.host, args.port, args.grace_seconds)
    # The model, tokenizer, engine and server live as long as the process: no full
    # collection walks them again (dspark.engine.heap).
    keep_heap_frozen()
    server.run()
