"""The reference engine: continuous batching and speculative decoding on a real model."""

from dspark.engine.config import AdaptiveConfig, EngineConfig, SpecMode
from dspark.engine.distributed import TensorParallelError
from dspark.engine.engine import LLMEngine
from dspark.engine.llm import LLM, RequestOutput
from dspark.engine.request import FinishReason, PromptTooLongError
from dspark.engine.sampling import SamplingParams
from dspark.engine.speculative import Drafter, NgramDrafter, OnlineAcceptance, Proposal
from dspark.engine.stats import EngineStats

__all__ = [
    "LLM",
    "AdaptiveConfig",
    "Drafter",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "LLMEngine",
    "NgramDrafter",
    "OnlineAcceptance",
    "PromptTooLongError",
    "Proposal",
    "RequestOutput",
    "SamplingParams",
    "SpecMode",
    "TensorParallelError",
]
