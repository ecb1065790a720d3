"""``LLM``: the batch API over the engine (``generate``), and what it returns."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.request import FinishReason, Request
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model
from dspark.models.parallel import TensorShard


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    error: str | None = None
    ttft_s: float | None = None  # time to first token
    latency_s: float | None = None
    num_rounds: int = 0  # decode rounds that verified drafts
    num_drafts_verified: int = 0
    num_drafts_accepted: int = 0

    @classmethod
    def from_request(cls, request: Request) -> RequestOutput:
        def since_arrival(t: float | None) -> float | None:
            return None if t is None else t - request.arrival

        return cls(
            request.request_id,
            request.prompt_ids,
            list(request.output_ids),
            request.text,
            request.finish_reason.value if request.finish_reason else "",
            request.error,
            since_arrival(request.first_token_time),
            since_arrival(request.finish_time),
            request.num_rounds,
            request.num_drafts_verified,
            request.num_drafts_accepted,
        )

    @classmethod
    def failed(cls, request_id: str, error: str) -> RequestOutput:
        return cls(request_id, [], [], "", FinishReason.ERROR.value, error)


def chat_ids(tokenizer, message: str) -> list[int]:
    """Token ids of one user message under the tokenizer's chat template."""
    return conversation_ids(tokenizer, [{"role": "user", "content": message}])


def conversation_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation (role/content dicts) under the tokenizer's chat
    template, ending with the prompt for the assistant's next turn."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def rank0_shard(config: EngineConfig) -> TensorShard | None:
    """The part of the target this process loads: rank 0's under tensor parallelism."""
    size = config.tensor_parallel_size
    return TensorShard(0, size) if size > 1 else None


class LLM:
    """Load a model (default: SmolLM2-135M-Instruct) and generate for many prompts."""

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        config: EngineConfig | None = None,
        tensor_parallel_size: int | None = None,
        **engine_kwargs,
    ) -> None:
        """``tensor_parallel_size``: ranks to split the target over (one process each,
        started and stopped by the engine); None keeps ``config``'s (default 1)."""
        config = config or EngineConfig()
        if tensor_parallel_size is not None:
            config = dataclasses.replace(config, tensor_parallel_size=tensor_parallel_size)
        loaded = load_model(model, dtype=dtype, device=device, shard=rank0_shard(config))
        self.engine = LLMEngine(loaded, config, **engine_kwargs)
        self.tokenizer = loaded.tokenizer

    def close(self) -> None:
        """Stop the engine's worker processes (tensor parallelism); idempotent."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def chat_prompt(self, message: str) -> list[int]:
        """Token ids of one user message under the model's chat template."""
        return chat_ids(self.tokenizer, message)

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_chat_template: bool = False,
        progress: bool = False,
    ) -> list[RequestOutput]:
        """Outputs in prompt order. A prompt that cannot run (too long) gets an output with
        ``finish_reason == "error"``; the others are unaffected."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        outputs: dict[str, RequestOutput] = {}
        order = []
        for prompt, p in zip(prompts, params, strict=True):
            if use_chat_template and isinstance(prompt, str):
                prompt = self.chat_prompt(prompt)
            request_id = f"gen-{time.monotonic_ns()}-{len(order)}"
            order.append(request_id)
            try:
                self.engine.add_request(prompt, p, request_id)
            except ValueError as error:
                outputs[request_id] = RequestOutput.failed(request_id, str(error))
        bar = tqdm(total=len(order), desc="generate", disable=not progress)
        bar.update(len(outputs))
        while self.engine.has_unfinished():
            for request in self.engine.step():
                if request.is_finished and request.request_id in order:
                    outputs[request.request_id] = RequestOutput.from_request(request)
                    bar.update()
        bar.close()
        for request_id in order:
            self.engine.requests.pop(request_id, None)
        return [outputs[r] for r in order]
