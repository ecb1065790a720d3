"""Request state inside the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from dspark.engine.kv_cache import BlockTable
from dspark.engine.sampling import SamplingParams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # rejected (e.g. prompt longer than the context)


class PromptTooLongError(ValueError):
    """A prompt that cannot fit the model's context; only that request fails."""


@dataclass(eq=False)  # identity: comparing field by field made `in self.running` O(len)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose keys/values are in the cache
    table: BlockTable = field(default_factory=BlockTable)
    slot: int | None = None  # index in the verifier's state while running
    finish_reason: FinishReason | None = None
    error: str | None = None
    generator: torch.Generator | None = None
    text: str = ""  # the decoded output, set when the request finishes
    stop_at: int | None = None  # where a stop string cut the text
    stop_token: int | None = None  # the EOS id that ended it (not in output_ids)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_rounds: int = 0  # decode steps that verified this request
    num_drafts_verified: int = 0
    num_drafts_accepted: int = 0
    num_preemptions: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_prefilling(self) -> bool:
        """Still computing the prompt (or recomputing after a preemption)."""
        return self.num_computed < self.num_tokens - 1
