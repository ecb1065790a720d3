"""Sampling parameters and the target distribution they define."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples. ``temperature == 0`` is greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature > 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[N, V]`` probabilities after temperature, top-k and top-p (float32 logits in)."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = nucleus(probs, params.top_p)
    return probs


def nucleus(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """``probs`` ``[N, V]`` cut to the smallest prefix, by descending probability, whose
    mass reaches ``top_p`` (a float, or ``[N, 1]`` per row), renormalised; the top token
    always stays."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return kept / kept.sum(-1, keepdim=True)


def same_distribution_groups(params: Sequence[SamplingParams]) -> list[list[int]]:
    """Indices into ``params`` grouped by what ``target_probs`` reads (temperature,
    top-k, top-p), in first-seen order: each group's rows share one ``target_probs``
    call."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.temperature, p.top_k, p.top_p), []).append(i)
    return list(groups.values())


def request_uniforms(
    generator: torch.Generator | None, count: int, device: torch.device
) -> torch.Tensor:
    """``count`` float64 uniforms in [0, 1) from a request's own generator (drawn on the
    generator's device; the default one without), on ``device``. Float64: no 2^-24 grid
    on acceptance tests and inverse-CDF draws."""
    where = device if generator is None else generator.device
    return torch.rand(count, generator=generator, dtype=torch.float64, device=where).to(device)


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``[rows]`` column indices, row ``r`` drawn from ``probs[r]`` (non-negative, any
    positive total) with ``uniforms[r]`` in [0, 1): the first column whose running sum
    exceeds the uniform times the row's total. A uniform below 1 keeps the draw below the
    total, so it never lands on a column of probability zero."""
    cumulative = probs.double().cumsum(dim=-1)  # float64: no drift over a vocabulary
    threshold = uniforms.double().view(-1, 1) * cumulative[:, -1:]
    index = torch.searchsorted(cumulative, threshold, right=True).squeeze(1)
    return index.clamp_(max=probs.shape[-1] - 1)
