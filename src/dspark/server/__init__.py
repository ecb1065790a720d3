"""The OpenAI-compatible server: FastAPI app, engine thread, metrics."""

from dspark.server.runner import EngineRunner, QueueFullError, ShuttingDownError
from dspark.server.serve import create_app

__all__ = ["EngineRunner", "QueueFullError", "ShuttingDownError", "create_app"]
