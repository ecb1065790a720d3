"""Step costs from a measured surface: the batch-aware cost model and the seed's 1-D tables.

A surface file (JSON) holds ``target`` rows ``{context_len, num_reqs, query_len, ms}`` —
one verify forward of ``num_reqs`` requests with ``query_len`` tokens each over
``context_len`` cached tokens each — and ``draft`` rows ``{context_len, num_reqs, ms}``
(one drafter block per request). ``dspark/data/h200_llama8b_cost_surface.json`` is such a
file, measured on an H200 for a Llama-3-8B shape; users bring their own in the same format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark.resources import H200_COST_SURFACE, load_json
from dspark.scheduling import CostTables, StepTiming, build_cost_tables, cost_curves, profile_sizes


def _interp_weights(grid: np.ndarray, value: float) -> tuple[int, int, float]:
    """Bracketing indices and weight for linear inter/extrapolation on an ascending grid."""
    if grid.shape[0] == 1:
        return 0, 0, 0.0
    hi = int(np.clip(np.searchsorted(grid, value), 1, grid.shape[0] - 1))
    lo = hi - 1
    return lo, hi, float((value - grid[lo]) / (grid[hi] - grid[lo]))


@dataclass(frozen=True)
class CostSurface:
    """Measured step costs on a grid: ``target_ms[context, num_reqs, query_len]``,
    ``draft_ms[context, num_reqs]``. Costs are made non-decreasing along query length."""

    contexts: np.ndarray  # [C] per-request context length
    num_reqs: np.ndarray  # [R]
    query_lens: np.ndarray  # [Q]
    target_ms: np.ndarray  # [C, R, Q]
    draft_ms: np.ndarray  # [C, R]
    name: str = "surface"

    @classmethod
    def from_json(cls, data: dict, name: str = "surface") -> CostSurface:
        for key in ("target", "draft"):
            if not isinstance(data.get(key), list) or not data[key]:
                raise ValueError(f"cost surface {name!r} needs a non-empty '{key}' list of rows")
        try:
            target = {
                (r["context_len"], r["num_reqs"], r["query_len"]): float(r["ms"])
                for r in data["target"]
            }
            draft = {(r["context_len"], r["num_reqs"]): float(r["ms"]) for r in data["draft"]}
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"cost surface {name!r}: target rows need context_len, num_reqs, query_len, ms "
                f"and draft rows context_len, num_reqs, ms ({error!r})"
            ) from None
        contexts = np.array(sorted({k[0] for k in target}), dtype=np.float64)
        num_reqs = np.array(sorted({k[1] for k in target}), dtype=np.float64)
        query_lens = np.array(sorted({k[2] for k in target}), dtype=np.float64)
        grid = np.full((len(contexts), len(num_reqs), len(query_lens)), np.nan)
        for (c, r, q), ms in target.items():
            grid[
                np.searchsorted(contexts, c),
                np.searchsorted(num_reqs, r),
                np.searchsorted(query_lens, q),
            ] = ms
        drafts = np.full((len(contexts), len(num_reqs)), np.nan)
        for (c, r), ms in draft.items():
            if c in contexts and r in num_reqs:
                drafts[np.searchsorted(contexts, c), np.searchsorted(num_reqs, r)] = ms
        for label, values in (("target", grid), ("draft", drafts)):
            if np.isnan(values).any():
                raise ValueError(
                    f"cost surface {name!r}: the {label} rows must cover the full grid of "
                    f"context_len x num_reqs{' x query_len' if label == 'target' else ''}"
                )
            if not np.isfinite(values).all() or (values < 0).any():
                raise ValueError(f"cost surface {name!r}: {label} costs must be finite and >= 0")
        return cls(
            contexts, num_reqs, query_lens, np.maximum.accumulate(grid, axis=2), drafts, name
        )

    @classmethod
    def load(cls, path: str | Path | None = None) -> CostSurface:
        """A surface file; ``None`` is the H200 surface shipped with dspark."""
        if path is None:
            return cls.from_json(load_json(H200_COST_SURFACE), "h200_llama8b")
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read cost surface {path}: {error}") from None
        return cls.from_json(data, path.stem)

    def target_curve(self, num_reqs: float, context_len: float) -> np.ndarray:
        """``[Q]`` target costs at the grid's query lengths for this (requests, context)."""
        c0, c1, wc = _interp_weights(self.contexts, context_len)
        r0, r1, wr = _interp_weights(self.num_reqs, num_reqs)
        by_reqs = self.target_ms[:, r0] * (1 - wr) + self.target_ms[:, r1] * wr  # [C, Q]
        curve = by_reqs[c0] * (1 - wc) + by_reqs[c1] * wc
        # Extrapolation (negative weights) can bend a curve down; costs never decrease.
        return np.maximum.accumulate(np.maximum(curve, 1e-3))

    def draft_cost(self, num_reqs: float, context_len: float) -> float:
        c0, c1, wc = _interp_weights(self.contexts, context_len)
        r0, r1, wr = _interp_weights(self.num_reqs, num_reqs)
        by_reqs = self.draft_ms[:, r0] * (1 - wr) + self.draft_ms[:, r1] * wr
        return max(0.0, float(by_reqs[c0] * (1 - wc) + by_reqs[c1] * wc))

    def target_cost(self, num_reqs: int, num_tokens: np.ndarray, context_len: float) -> np.ndarray:
        """Target forward cost of ``num_reqs`` requests holding ``num_tokens`` tokens in
        total (spread evenly), each over ``context_len`` cached tokens; linear in query
        length between grid points and beyond the last one."""
        curve = self.target_curve(num_reqs, context_len)
        query = np.asarray(num_tokens, dtype=np.float64) / num_reqs
        cost = np.interp(query, self.query_lens, curve)
        if self.query_lens.shape[0] > 1:
            slope = (curve[-1] - curve[-2]) / (self.query_lens[-1] - self.query_lens[-2])
            beyond = query > self.query_lens[-1]
            cost = np.where(beyond, curve[-1] + slope * (query - self.query_lens[-1]), cost)
        return cost


class SurfaceCostModel:
    """Batch-aware step cost: ``draft(num_reqs, ctx) + target(num_reqs, T + b, ctx)``,
    where ``ctx`` is the batch's mean context per request (``context_tokens / num_reqs``).
    Implements ``dspark.scheduling.StepCostModel``."""

    def __init__(self, surface: CostSurface, include_draft: bool = True) -> None:
        self.surface = surface
        self.include_draft = include_draft

    def step_costs_ms(
        self, num_reqs: int, num_tokens: int, max_drafts: int, context_tokens: int = 0
    ) -> np.ndarray:
        context = context_tokens / num_reqs if num_reqs else 0.0
        tokens = num_tokens + np.arange(max_drafts + 1)
        cost = self.surface.target_cost(num_reqs, tokens, context)
        if self.include_draft:
            cost += self.surface.draft_cost(num_reqs, context)
        return cost

    def step_ms(self, num_reqs: int, num_tokens: int, context_tokens: int) -> float:
        """Cost of one step with exactly ``num_tokens`` target tokens."""
        return float(self.step_costs_ms(num_reqs, num_tokens, 0, context_tokens)[0])


def vllm_capture_sizes(max_capture_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, of 16 after."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max_capture_size + 1, 16)]
    return [s for s in sizes if s <= max_capture_size]


def seed_tables_from_surface(
    surface: CostSurface,
    max_num_seqs: int = 256,
    max_num_tokens: int = 8192,
    capture_sizes: list[int] | None = None,
    profile_context: int = 8192,
) -> CostTables:
    """The seed's 1-D cost tables, profiled the way the seed profiles them: one dummy
    step per size, its tokens split over ``min(size, max_num_seqs)`` requests, every
    request at ``profile_context`` cached tokens; graph replays up to the capture limit."""
    capture_sizes = capture_sizes or vllm_capture_sizes()
    limit = capture_sizes[-1]
    samples = []
    for size in profile_sizes(capture_sizes, max_num_tokens):
        reqs = min(size, max_num_seqs)
        forward = float(surface.target_cost(reqs, np.array([size]), profile_context)[0])
        drafter = surface.draft_cost(reqs, profile_context)
        samples.append(StepTiming(reqs, size, forward, drafter, size <= limit))
    draft_curve, verify_curve = cost_curves(samples)
    return build_cost_tables(draft_curve, verify_curve, max_num_seqs, max_num_tokens, limit)
