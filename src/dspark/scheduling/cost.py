"""Step-cost models: what a step costs with ``b`` admitted drafts, for ``b = 0..cap``.

The budget only ever asks one question, so the interface is one method. The seed's
1-D tables implement it from profiled curves; a batch-aware model (request count,
token count and context length) implements the same method and plugs in unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

VERIFY_FLOOR_MS = 1e-6
"""Verify costs are floored above zero so that the gain/cost ratio is always defined."""


@runtime_checkable
class StepCostModel(Protocol):
    """Prices one engine step (drafter + target forward) in milliseconds."""

    def step_costs_ms(
        self, num_reqs: int, num_tokens: int, max_drafts: int, context_tokens: int = 0
    ) -> np.ndarray:
        """Cost of the step with ``num_tokens + b`` target tokens, for ``b = 0..max_drafts``.

        ``num_tokens`` counts the batch's non-draft tokens (decode tokens and prompt
        chunks) and ``context_tokens`` the tokens already in the KV cache over the batch.
        Returns a float64 array of length ``max_drafts + 1``, non-decreasing and positive.
        """
        ...


@dataclass(frozen=True, slots=True)
class CostTables:
    """The seed's cost model: draft cost by request count, verify cost by token count."""

    draft_ms: np.ndarray  # [max_num_reqs + 1]
    verify_ms: np.ndarray  # [max_num_tokens + 1]

    def step_costs_ms(
        self, num_reqs: int, num_tokens: int, max_drafts: int, context_tokens: int = 0
    ) -> np.ndarray:
        end = num_tokens + max_drafts + 1
        if num_reqs >= self.draft_ms.shape[0] or end > self.verify_ms.shape[0]:
            raise ValueError(
                f"step of {num_reqs} requests and up to {end - 1} tokens is outside the cost "
                f"tables (max_num_reqs={self.draft_ms.shape[0] - 1}, "
                f"max_num_tokens={self.verify_ms.shape[0] - 1}); rebuild them larger"
            )
        return self.draft_ms[num_reqs] + self.verify_ms[num_tokens:end]

    def draft_cost_ms(self, num_reqs: int) -> float:
        """The drafter's share of a step with ``num_reqs`` requests (paid whenever it runs,
        whatever the budget)."""
        return float(self.draft_ms[min(num_reqs, self.draft_ms.shape[0] - 1)])

    @property
    def max_num_reqs(self) -> int:
        return self.draft_ms.shape[0] - 1

    @property
    def max_num_tokens(self) -> int:
        return self.verify_ms.shape[0] - 1


def _check_curve(name: str, curve: Sequence[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    points = np.asarray(curve, dtype=np.float64)
    if points.size == 0:
        raise ValueError(
            f"{name} is empty: adaptive verification needs profiled step costs. Profile the "
            "engine first, or turn adaptive verification off (--spec fixed)."
        )
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"{name} must be a list of (size, ms) pairs, got shape {points.shape}")
    if not np.isfinite(points).all():
        raise ValueError(f"{name} must hold finite sizes and costs, got {curve!r}")
    sizes, costs = points.T
    if (sizes < 0).any() or not np.array_equal(sizes, np.round(sizes)):
        raise ValueError(f"{name} sizes must be non-negative integers, got {sizes.tolist()}")
    if (np.diff(sizes) <= 0).any():
        raise ValueError(f"{name} sizes must be strictly ascending, got {sizes.tolist()}")
    if (costs < 0).any():
        raise ValueError(f"{name} costs must be non-negative, got {costs.tolist()}")
    return sizes, costs


def _cost_table(sizes: np.ndarray, costs: np.ndarray, limit: int, graph_limit: int) -> np.ndarray:
    costs = np.maximum.accumulate(costs)  # a larger step never costs less
    wanted = np.arange(limit + 1)
    # Up to the graph limit a step pads to the next captured size: a step function.
    table = costs[np.minimum(np.searchsorted(sizes, wanted, side="left"), len(sizes) - 1)]
    if graph_limit:
        # Past it nothing pads, so interpolate, but only between points that are past it
        # too: losing graphs is a real cliff, never blended across.
        smooth = wanted > graph_limit
        above = sizes > graph_limit
        if smooth.any() and above.any():
            table[smooth] = np.interp(wanted[smooth], sizes[above], costs[above])
    if len(sizes) > 1:
        beyond = wanted > sizes[-1]
        slope = (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2])
        table[beyond] = costs[-1] + slope * (wanted[beyond] - sizes[-1])
    return table


def build_cost_tables(
    draft_curve: Sequence[tuple[int, float]],
    verify_curve: Sequence[tuple[int, float]],
    max_num_reqs: int,
    max_num_tokens: int,
    cudagraph_limit: int = 0,
) -> CostTables:
    """Dense cost tables from profiled ``(size, ms)`` curves.

    Costs are made non-decreasing (running max). At or below ``cudagraph_limit`` a size
    costs what the smallest profiled size at or above it costs; above the limit costs
    are interpolated between points that are themselves above it; past the last point
    they extend linearly with the last two points' slope. Draft costs are floored at 0
    and verify costs at ``VERIFY_FLOOR_MS``.
    """
    if max_num_reqs < 0 or max_num_tokens < 0 or cudagraph_limit < 0:
        raise ValueError(
            "max_num_reqs, max_num_tokens and cudagraph_limit must be non-negative, got "
            f"{max_num_reqs}, {max_num_tokens}, {cudagraph_limit}"
        )
    draft_sizes, draft_costs = _check_curve("draft_curve", draft_curve)
    verify_sizes, verify_costs = _check_curve("verify_curve", verify_curve)
    draft = np.maximum(_cost_table(draft_sizes, draft_costs, max_num_reqs, cudagraph_limit), 0.0)
    verify = np.maximum(
        _cost_table(verify_sizes, verify_costs, max_num_tokens, cudagraph_limit), VERIFY_FLOOR_MS
    )
    draft.flags.writeable = False
    verify.flags.writeable = False
    return CostTables(draft_ms=draft, verify_ms=verify)


class ObservedDraftCost:
    """A cost model whose drafter share follows what drafting really costs the engine.

    Start-up profiling times the drafter's block pass alone; a real step also pays for
    what surrounds it (updating the drafter's context with the kept positions, sampling
    the drafts, host work per request), which on a GPU can exceed the pass itself. Each
    drafted step reports its measured drafting time with ``record``; the drafter's cost
    at ``n`` requests is then the larger of the profiled one and an exponential average
    of the measurements at ``n`` (or, for a count never measured, the profiled cost
    scaled by the ratio measured at the nearest count). Verify costs are the base
    model's. Timings depend on no draft token, so decisions stay lossless.
    """

    def __init__(self, base: CostTables, decay: float = 0.8) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.base = base
        self.decay = decay
        self._observed: dict[int, float] = {}
        self.version = 0  # changes with every measurement (plans priced before are stale)

    def record(self, num_reqs: int, drafting_ms: float) -> None:
        if not np.isfinite(drafting_ms) or drafting_ms < 0:
            raise ValueError(f"drafting_ms must be a finite non-negative time, got {drafting_ms}")
        self.version += 1
        old = self._observed.get(num_reqs)
        self._observed[num_reqs] = (
            drafting_ms if old is None else self.decay * old + (1 - self.decay) * drafting_ms
        )

    def draft_cost_ms(self, num_reqs: int) -> float:
        profiled = self.base.draft_cost_ms(num_reqs)
        observed = self._observed.get(num_reqs)
        if observed is None and self._observed:
            nearest = min(self._observed, key=lambda n: abs(n - num_reqs))
            scale = self._observed[nearest] / max(self.base.draft_cost_ms(nearest), 1e-9)
            observed = profiled * scale
        return profiled if observed is None else max(profiled, observed)

    def step_costs_ms(
        self, num_reqs: int, num_tokens: int, max_drafts: int, context_tokens: int = 0
    ) -> np.ndarray:
        costs = self.base.step_costs_ms(num_reqs, num_tokens, max_drafts, context_tokens)
        extra = self.draft_cost_ms(num_reqs) - self.base.draft_cost_ms(num_reqs)
        return costs + extra if extra else costs
