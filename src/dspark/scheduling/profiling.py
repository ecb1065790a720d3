"""Start-up profiling: which batch sizes to time, and how samples become cost curves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Curve = list[tuple[int, float]]

PROFILE_REPLAYS = 5
"""Replays per profiled size; the curves take the median, so one slow replay is harmless."""


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One timed engine step (a dummy profiling run or a real step)."""

    num_reqs: int
    num_target_tokens: int
    forward_ms: float
    drafter_ms: float
    full_cudagraph: bool

    def __post_init__(self) -> None:
        if self.num_reqs < 0 or self.num_target_tokens < 0:
            raise ValueError(
                "StepTiming sizes must be non-negative, got "
                f"num_reqs={self.num_reqs}, num_target_tokens={self.num_target_tokens}"
            )
        if not (np.isfinite(self.forward_ms) and np.isfinite(self.drafter_ms)):
            raise ValueError(
                "StepTiming times must be finite, got "
                f"forward_ms={self.forward_ms}, drafter_ms={self.drafter_ms}"
            )


def profile_sizes(capture_sizes: Sequence[int], max_num_tokens: int) -> list[int]:
    """Token counts to profile: every capture size, then the tail past the capture limit.

    The tail starts at 1.5x the largest capture size and doubles up to ``max_num_tokens``
    (always included), because real steps run there without graphs and linear
    extrapolation from the captured range underestimates them.
    """
    sizes = [int(s) for s in capture_sizes]
    if any(s <= 0 for s in sizes):
        raise ValueError(f"capture_sizes must be positive, got {sizes}")
    if sizes != sorted(sizes):
        raise ValueError(f"capture_sizes must be ascending, got {sizes}")
    if max_num_tokens <= 0:
        raise ValueError(f"max_num_tokens must be positive, got {max_num_tokens}")
    tail: set[int] = set()
    if sizes:
        size = sizes[-1]
        tail.add(min(size + size // 2, max_num_tokens))
        while size < max_num_tokens:
            size = min(size * 2, max_num_tokens)
            tail.add(size)
    return sorted(set(sizes) | tail)


def median_curve(points: Iterable[tuple[int, float]]) -> Curve:
    grouped: defaultdict[int, list[float]] = defaultdict(list)
    for size, ms in points:
        grouped[size].append(ms)
    return [(size, float(np.median(ms))) for size, ms in sorted(grouped.items())]


def cost_curves(samples: Iterable[StepTiming]) -> tuple[Curve, Curve]:
    """Per-size median curves ``(draft_curve, verify_curve)`` from profiling samples.

    The draft curve is keyed by request count and uses graph-replay samples only: eager
    target steps leave launch gaps that inflate the drafter's timings. The verify curve is
    keyed by target token count and uses every sample.
    """
    samples = list(samples)
    draft = median_curve((s.num_reqs, s.drafter_ms) for s in samples if s.full_cudagraph)
    verify = median_curve((s.num_target_tokens, s.forward_ms) for s in samples)
    if not draft or not verify:
        missing = "draft (no full-graph samples)" if not draft else "verify (no samples)"
        raise ValueError(
            f"profiling produced an empty {missing} cost curve, so adaptive verification "
            "cannot price a step. Profile with graph capture enabled, or turn adaptive "
            "verification off (--spec fixed) to verify a fixed number of drafts."
        )
    return draft, verify
