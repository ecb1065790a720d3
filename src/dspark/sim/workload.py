"""Closed-loop workloads: each request's domain, context length and output length."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

CHARS_PER_TOKEN = 4.0  # ShareGPT lengths are text; about four characters a token


@dataclass(frozen=True)
class RequestSpec:
    domain: str
    context_len: int  # tokens in the KV cache when decoding starts (the prompt)
    output_len: int  # tokens to generate


@dataclass(frozen=True)
class Workload:
    """Requests drawn i.i.d.: domain from ``domains``; lengths fixed/uniform or ShareGPT."""

    domains: tuple[str, ...] = ("chat",)
    context_len: int = 1024
    output_len: tuple[int, int] = (128, 512)  # uniform, inclusive
    sharegpt: bool = False  # take (prompt, output) lengths from ShareGPT instead
    max_output_len: int = 1024

    def __post_init__(self) -> None:
        low, high = self.output_len
        if not 1 <= low <= high <= self.max_output_len:
            raise ValueError(
                f"output_len must satisfy 1 <= low <= high <= {self.max_output_len}, "
                f"got {self.output_len}"
            )
        if self.context_len < 0:
            raise ValueError(f"context_len must be non-negative, got {self.context_len}")
        if not self.domains:
            raise ValueError("a workload needs at least one domain")

    def request(self, rng: np.random.Generator) -> RequestSpec:
        domain = self.domains[int(rng.integers(len(self.domains)))]
        if self.sharegpt:
            prompt_tokens, output_tokens = _sharegpt_lengths()
            i = int(rng.integers(len(prompt_tokens)))
            output = int(np.clip(output_tokens[i], 1, self.max_output_len))
            return RequestSpec(domain, int(prompt_tokens[i]), output)
        low, high = self.output_len
        return RequestSpec(domain, self.context_len, int(rng.integers(low, high + 1)))


@lru_cache(maxsize=1)
def _sharegpt_lengths() -> tuple[np.ndarray, np.ndarray]:
    from dspark.datasets import sharegpt_conversations

    pairs = sharegpt_conversations()
    prompts = np.array([max(1, round(len(p.prompt) / CHARS_PER_TOKEN)) for p in pairs])
    outputs = np.array([max(1, round(len(p.response) / CHARS_PER_TOKEN)) for p in pairs])
    return prompts, outputs
