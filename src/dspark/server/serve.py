"""Assemble the server: model, engine, runner and app."""

from __future__ import annotations

import logging
import os
import threading

import torch
from fastapi import FastAPI

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.llm import rank0_shard
from dspark.models.loader import DEFAULT_MODEL, load_model
from dspark.server.app import build_app
from dspark.server.cli import DEFAULT_MAX_BODY_BYTES
from dspark.server.prompts import PromptEncoder
from dspark.server.runner import EngineRunner

log = logging.getLogger("dspark.server")


def create_app(
    model: str | None = None,
    config: EngineConfig | None = None,
    max_pending: int = 256,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    grace_seconds: float = 30.0,
    served_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> tuple[FastAPI, EngineRunner]:
    """The app and its runner; ``api_key``: requests to /v1 need it as a bearer token."""
    config = config or EngineConfig()
    loaded = load_model(model, dtype=dtype, device=device, shard=rank0_shard(config))
    engine = LLMEngine(loaded, config)
    runner = EngineRunner(engine, max_pending)
    encoder = PromptEncoder(loaded.tokenizer, engine.max_model_len)
    name = served_name or (DEFAULT_MODEL if model is None else loaded.path.name)
    app = build_app(runner, name, encoder, grace_seconds, api_key, max_body_bytes)
    return app, runner


class GracefulServer:
    """uvicorn with a two-phase stop: refuse new requests and let those in flight finish
    (up to ``grace_seconds``; the rest end with an error event saying why), then close.
    A second SIGINT or SIGTERM exits at once."""

    def __init__(
        self,
        app: FastAPI,
        runner: EngineRunner,
        host: str,
        port: int,
        grace_seconds: float,
        log_level: str = "info",
    ) -> None:
        import uvicorn

        outer = self

        class _Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:  # SIGINT / SIGTERM
                if outer.is_stopping:
                    log.warning("second signal %d: exiting without waiting", sig)
                    os._exit(128 + sig)
                outer.is_stopping = True
                threading.Thread(target=outer.stop, daemon=True).start()

        self.is_stopping = False
        self.runner = runner
        self.grace_seconds = grace_seconds
        self.server = _Server(
            uvicorn.Config(
                app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5
            )
        )

    def run(self) -> None:
        self.server.run()

    def stop(self) -> None:
        self.runner.shutdown(self.grace_seconds)
        self.server.should_exit = True
