"""OpenAI request bodies (validated strictly: no type coercion) and response bodies."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from dspark.engine.sampling import SamplingParams

MAX_STOP_STRINGS = 4
# Stop strings are searched in the decoded text on the engine thread at every token, so
# their size is bounded: all of them together, in characters.
MAX_STOP_CHARS = 1024
# Temperatures below this decode greedily: dividing float32 logits by ~1e-38 overflows
# to inf and sampling turns to noise long before temperature 0 (vLLM uses the same cut).
GREEDY_TEMPERATURE = 1e-5
# torch.Generator.manual_seed's range.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
# What ``developer`` means to a chat template that predates it: the system turn.
TEMPLATE_ROLES = {"developer": "system"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Request(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)  # extension
    ignore_eos: bool = False  # extension (as in vLLM): generate past EOS up to max_tokens
    stop: Any = None  # a string or a list of strings; checked by ``_stop_strings``
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=0.0, le=0.0)
    frequency_penalty: float | None = Field(default=None, ge=0.0, le=0.0)
    logprobs: bool | int | None = Field(default=None)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: Any) -> list[str]:
        stops = [value] if isinstance(value, str) else value
        if stops is None:
            return []
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("stop must be a string or a list of strings")
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP_STRINGS} non-empty strings")
        if sum(len(s) for s in stops) > MAX_STOP_CHARS:
            raise ValueError(f"stop strings may hold {MAX_STOP_CHARS} characters in all")
        return stops

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("n other than 1 is not supported: this server returns one choice")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value:
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters; ``max_tokens`` is the resolved limit."""
        temperature = 1.0 if self.temperature is None else self.temperature
        return SamplingParams(
            temperature=0.0 if temperature < GREEDY_TEMPERATURE else temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            max_tokens=max_tokens,
            stop=tuple(self.stop or ()),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: Any  # a string, or a list of one string
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        elif isinstance(value, list):
            raise ValueError("send one prompt per request")
        if not isinstance(value, str):
            raise ValueError("prompt must be a string (or a list of one string)")
        return value

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, value, info: ValidationInfo):
        if value:
            raise ValueError(f"{info.field_name} is not supported")
        return value


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any  # a string or a list of text parts; ``_text`` makes it a string
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: Any) -> str:
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("content must be a string or a list of content parts")
        texts = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(
                    f"content parts of type {kind!r} are not supported; send 'text' parts"
                )
            if not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
                raise ValueError("a text part is {'type': 'text', 'text': <string>}")
            texts.append(part["text"])
        return "\n".join(texts)  # as vLLM joins them

    def for_template(self) -> dict:
        return {"role": TEMPLATE_ROLES.get(self.role, self.role), "content": self.content}


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    request_id: str,
    model: str,
    text: str,
    finish: str | None,
    use: dict | None,
    chunk: bool = False,
) -> dict:
    body = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }
    if use is not None or not chunk:
        body["usage"] = use
    return body


def chat_body(request_id: str, model: str, text: str, finish: str | None, use: dict | None) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        ],
        "usage": use,
    }


def chat_chunk(
    request_id: str, model: str, delta: dict, finish: str | None, use: dict | None = None
) -> dict:
    body = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if use is not None:
        body["usage"] = use
    return body
