"""Target models: a Llama-family decoder in plain PyTorch and its loaders."""

from dspark.models.config import ModelConfig
from dspark.models.llama import AttentionBatch, LlamaModel
from dspark.models.loader import DEFAULT_MODEL, LoadedModel, load_model

__all__ = [
    "DEFAULT_MODEL",
    "AttentionBatch",
    "LlamaModel",
    "LoadedModel",
    "ModelConfig",
    "load_model",
]
