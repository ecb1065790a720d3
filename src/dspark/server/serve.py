"""Assemble the server: model, engine, runner and app."""

from __future__ import annotations

import threading

import torch
from fastapi import FastAPI

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.llm import rank0_shard
from dspark.models.loader import DEFAULT_MODEL, load_model
from dspark.server.app import build_app
from dspark.server.runner import EngineRunner


def create_app(
    model: str | None = None,
    config: EngineConfig | None = None,
    max_pending: int = 256,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    grace_seconds: float = 30.0,
    served_name: str | None = None,
) -> tuple[FastAPI, EngineRunner]:
    config = config or EngineConfig()
    loaded = load_model(model, dtype=dtype, device=device, shard=rank0_shard(config))
    engine = LLMEngine(loaded, config)
    runner = EngineRunner(engine, max_pending)
    tokenizer = loaded.tokenizer

    def chat_template(messages: list[dict]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    name = served_name or (DEFAULT_MODEL if model is None else loaded.path.name)
    app = build_app(runner, name, chat_template, tokenizer.encode, grace_seconds)
    return app, runner


class GracefulServer:
    """uvicorn with a two-phase stop: refuse new requests and let those in flight finish
    (up to ``grace_seconds``; the rest end with an error event saying why), then close."""

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

        runner_ref = runner

        class _Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:  # SIGINT / SIGTERM
                threading.Thread(target=self_outer.stop, daemon=True).start()

        self_outer = self
        self.runner = runner_ref
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
