"""The reference engine: continuous batching and speculative decoding on a real model."""

from dspark.engine.engine import EngineConfig, EngineStats, LLMEngine, SpecMode
from dspark.engine.llm import LLM, RequestOutput
from dspark.engine.request import FinishReason, PromptTooLongError
from dspark.engine.sampling import SamplingParams
from dspark.engine.speculative import Drafter, NgramDrafter, OnlineAcceptance, Proposal

__all__ = [
    "LLM",
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
]
