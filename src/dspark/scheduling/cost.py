"""Step-cost models: what a step costs with ``b`` admitted drafts, for ``b = 0..cap``.

The budget only ever asks one question, so the interface is one method. The seed's
1-D tables implement it from profiled curves; a batch-aware model (request count,
token count and context length) implements the same method and plugs in unchanged.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

VERIFY_FLOOR_MS = 1e-6
"""Verify costs are floored above zero so that the gain/cost ratio is always defined."""

OVERHEAD_WINDOW = 16
"""Steps per request-count bucket (drafted and undrafted apart) behind a measured overhead."""


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

    def draft_cost_ms(self, num_reqs: int, depth: int | None = None) -> float:
        """The drafter's share of a step with ``num_reqs`` requests (paid whenever it runs,
        whatever the budget; the seed prices every ``depth`` as the full block)."""
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


def build_depth_costs(
    curves: Mapping[int, Sequence[tuple[int, float]]],
    num_positions: int,
    max_num_reqs: int,
    cudagraph_limit: int = 0,
) -> np.ndarray:
    """The drafter's cost by drafting depth: ``[num_positions + 1, max_num_reqs + 1]``.

    ``curves[d]`` is the profiled ``(num_reqs, ms)`` curve of drafting ``d`` positions per
    request; each becomes a dense row as the seed's draft table does (``build_cost_tables``).
    Depths between profiled ones interpolate linearly (a block drafter's pass is paid
    once, then each position adds one head over the batch), depths below the shallowest
    profiled one cost what it costs, and depths past the deepest one what that costs.
    A deeper draft never costs less. Row 0 (no drafting) is zero.
    """
    if num_positions < 1:
        raise ValueError(f"num_positions (K) must be positive, got {num_positions}")
    depths = sorted(int(d) for d in curves)
    if not depths or depths[0] < 1 or depths[-1] > num_positions:
        raise ValueError(
            f"curves must be keyed by drafting depths in 1..{num_positions}, got {depths}"
        )
    rows = np.stack(
        [
            np.maximum(
                _cost_table(
                    *_check_curve(f"curves[{d}]", curves[d]), max_num_reqs, cudagraph_limit
                ),
                0.0,
            )
            for d in depths
        ]
    )  # [len(depths), max_num_reqs + 1]
    table = np.zeros((num_positions + 1, max_num_reqs + 1))
    wanted = np.arange(1, num_positions + 1)
    for n in range(max_num_reqs + 1):
        table[1:, n] = np.interp(wanted, depths, rows[:, n])
    np.maximum.accumulate(table, axis=0, out=table)
    table.flags.writeable = False
    return table


class ObservedDraftCost:
    """A cost model that follows drafting depth and what steps really cost the engine.

    Start-up profiling times the target's forward and the drafter's proposal alone, at
    one context length; a real step also pays for what surrounds them (updating the
    drafter's context with the kept positions, verifying and emitting tokens, host work
    per request), which on a GPU can exceed the passes themselves. Two corrections, both
    from measurements:

    * ``record``: each drafted step's measured proposal time. The profiled drafter cost
      at ``n`` requests is scaled by an exponential average of measured / profiled at
      ``n`` (or at the nearest count measured), never below 1: the profile is a floor.
    * ``record_step``: each whole decoding step's wall time against the price above.
      What the price missed (the drafter's context update, verification, host work) is
      kept per power-of-two bucket of the request count, for undrafted and drafted
      steps apart, the drafted ones as a robust line in the drafting depth, and added
      to the drafter's share (``overhead_ms``; an undrafted step's shows as depth 0 of
      ``draft_costs_by_depth``). Until two depths are measured the line's slope is
      unknown, and depths not yet drafted are priced optimistically on both sides:
      deeper ones as the measured depth, shallower ones on the way from the undrafted
      steps' overhead (0 if unmeasured) up to it, in proportion to the depth. A depth
      priced too low is drafted and so measured; one priced too high would never be
      (flat pricing would charge what a new engine's first step, drafted the full block
      deep, missed to one-deep drafting as well, and could price drafting out of use).

    ``depth_ms`` (``build_depth_costs``) prices drafting ``d < K`` positions per request:
    the drafter's sequential heads stop at the deepest draft any request may verify, so
    a shallow step costs less, and ``AdaptiveVerifier.drafting_pays`` chooses the depth
    with the budget. Without it every depth costs the full block (the seed's model).
    Timings depend on no draft token, so decisions stay lossless.
    """

    def __init__(
        self,
        base: CostTables,
        decay: float = 0.8,
        depth_ms: np.ndarray | None = None,
        num_positions: int | None = None,
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if depth_ms is not None:
            depth_ms = np.asarray(depth_ms, dtype=np.float64)
            if depth_ms.ndim != 2 or depth_ms.shape[0] < 2 or depth_ms.shape[1] < 1:
                raise ValueError(
                    "depth_ms must be [K + 1, max_num_reqs + 1] (build_depth_costs), got "
                    f"shape {depth_ms.shape}"
                )
            if not np.isfinite(depth_ms).all() or (depth_ms < 0).any():
                raise ValueError("depth_ms must hold finite non-negative costs")
            num_positions = depth_ms.shape[0] - 1
        self.base = base
        self.decay = decay
        self.depth_ms = depth_ms
        self.num_positions = num_positions  # K: the depth of a full block (None: unknown)
        self._ratio: dict[int, float] = {}  # measured / profiled, by request count
        # By (request-count bucket, undrafted): recent (depth, ms the price missed), and
        # the (intercept, slope in the depth) they give.
        self._missed: dict[tuple[int, bool], deque] = {}
        self._overhead: dict[tuple[int, bool], tuple[float, float]] = {}
        # Drafted buckets whose window holds one depth so far: that depth.
        self._one_depth: dict[tuple[int, bool], int] = {}
        # Prices asked for since the last measurement, by (request count, depth): a
        # step's decisions ask for the same few several times (the depth, then the
        # budget: four calls of ``draft_cost_ms`` each), and each is a dozen calls of
        # its own. Every ``record`` and ``record_step`` clears it.
        self._prices: dict[tuple[int, int | None], float] = {}

    def _profiled(self, num_reqs: int, depth: int | None) -> float:
        table = self.depth_ms
        if depth is None or table is None:
            return self.base.draft_cost_ms(num_reqs)
        depth = min(max(int(depth), 0), table.shape[0] - 1)
        return float(table[depth, min(num_reqs, table.shape[1] - 1)])

    def record(self, num_reqs: int, drafting_ms: float, depth: int | None = None) -> None:
        """A drafted step of ``num_reqs`` requests took ``drafting_ms`` drafting ``depth``
        positions per request (None: the full block)."""
        if not math.isfinite(drafting_ms) or drafting_ms < 0:  # per step: no NumPy call
            raise ValueError(f"drafting_ms must be a finite non-negative time, got {drafting_ms}")
        self._prices.clear()
        ratio = drafting_ms / max(self._profiled(num_reqs, depth), 1e-9)
        old = self._ratio.get(num_reqs)
        self._ratio[num_reqs] = (
            ratio if old is None else self.decay * old + (1 - self.decay) * ratio
        )

    def _scale(self, num_reqs: int) -> float:
        """Measured over profiled drafting time at ``num_reqs`` (or the nearest count
        measured), never below 1."""
        if not self._ratio:
            return 1.0
        ratio = self._ratio.get(num_reqs)
        if ratio is None:
            ratio = self._ratio[min(self._ratio, key=lambda n: abs(n - num_reqs))]
        return max(1.0, ratio)

    def overhead_ms(self, num_reqs: int, depth: int | None) -> float:
        """What steps of about ``num_reqs`` requests drafted ``depth`` deep (0: undrafted,
        None: the full block) cost beyond their profiled price (0 until measured in any
        bucket)."""
        if depth == 0 or (depth is None and self.num_positions is None):
            # Undrafted, or the full block of an unknown depth: the line's intercept.
            fit = self._fit(num_reqs, depth == 0)
            return 0.0 if fit is None else fit[0]
        depth = self.num_positions if depth is None else depth
        return float(self._drafted_overhead(num_reqs, depth))

    def _drafted_overhead(self, num_reqs: int, depths):
        """What drafted steps of about ``num_reqs`` requests cost beyond their price, at
        ``depths`` (>= 1; a depth or an array of them): the bucket's line, or with one
        depth measured the optimistic extrapolation of the class doc."""
        key = self._fit_key(num_reqs, False)
        if key is None:
            return 0.0 * depths
        intercept, slope = self._overhead[key]
        measured = self._one_depth.get(key)
        if measured is None:
            return intercept + slope * depths
        undrafted = self._fit(num_reqs, True)
        start = 0.0 if undrafted is None else undrafted[0]
        if intercept <= start:
            return intercept + 0.0 * depths
        return start + (intercept - start) * np.minimum(depths, measured) / measured

    def _fit(self, num_reqs: int, undrafted: bool) -> tuple[float, float] | None:
        """The overhead line of ``num_reqs``'s bucket, or of the nearest bucket measured
        (a batch that shrank or grew into a new bucket starts from its neighbour's price,
        not from the profile's, which real steps never meet)."""
        key = self._fit_key(num_reqs, undrafted)
        return None if key is None else self._overhead[key]

    def _fit_key(self, num_reqs: int, undrafted: bool) -> tuple[int, bool] | None:
        bucket = int(num_reqs).bit_length()
        if (bucket, undrafted) in self._overhead:
            return bucket, undrafted
        measured = [b for b, u in self._overhead if u == undrafted]
        if not measured:
            return None
        return min(measured, key=lambda b: (abs(b - bucket), b)), undrafted

    def record_step(
        self,
        num_reqs: int,
        num_tokens: int,
        num_drafts: int,
        depth: int,
        wall_ms: float,
        context_tokens: int = 0,
        padded_tokens: int = 0,
    ) -> None:
        """A whole decoding step (``num_reqs`` requests, ``num_tokens`` non-draft tokens,
        ``num_drafts`` admitted drafts, drafted ``depth`` deep, 0: undrafted) took
        ``wall_ms``. What its profiled price missed feeds ``overhead_ms``: per request-count
        bucket, undrafted and drafted steps apart, a robust line in the depth through the
        last ``OVERHEAD_WINDOW`` steps. ``padded_tokens``: tokens its forward ran beyond its
        own captured size (a larger graph covered it, ``CaptureLedger``); the step is
        priced at the size it ran, so a transient cover is not learnt as drafting's price.
        """
        if not np.isfinite(wall_ms) or wall_ms < 0:
            raise ValueError(f"wall_ms must be a finite non-negative time, got {wall_ms}")
        if depth < 0 or num_drafts < 0 or (depth == 0 and num_drafts):
            raise ValueError(f"a step drafted {depth} deep cannot admit {num_drafts} drafts")
        if padded_tokens < 0:
            raise ValueError(f"padded_tokens must be >= 0, got {padded_tokens}")
        self._prices.clear()
        ran = num_drafts + padded_tokens  # tokens past the non-draft ones, padding included
        limit = getattr(self.base, "max_num_tokens", None)
        if limit is not None:
            ran = max(num_drafts, min(ran, limit - num_tokens))
        costs = self.base.step_costs_ms(num_reqs, num_tokens, ran, context_tokens)
        price = float(costs[ran]) - self.base.draft_cost_ms(num_reqs)
        if depth:
            price += self._profiled(num_reqs, depth) * self._scale(num_reqs)
        key = (int(num_reqs).bit_length(), depth == 0)
        window = self._missed.setdefault(key, deque(maxlen=OVERHEAD_WINDOW))
        window.append((depth, wall_ms - price))
        depths = _line_depths(window)
        self._overhead[key] = _line_through(depths)
        if depth:
            if len(depths) == 1:
                self._one_depth[key] = next(iter(depths))
            else:
                self._one_depth.pop(key, None)

    def overhead_lines(self) -> dict[str, tuple[float, float]]:
        """What the measured steps taught, for reports: per request-count bucket and kind
        ("drafted 16+": drafted steps of 16-31 requests), the line's (intercept ms, ms a
        depth) that ``overhead_ms`` reads."""
        return {
            f"{'undrafted' if undrafted else 'drafted'} {1 << (bucket - 1)}+": line
            for (bucket, undrafted), line in sorted(self._overhead.items())
        }

    def draft_cost_ms(self, num_reqs: int, depth: int | None = None) -> float:
        """The drafter's share of a step with ``num_reqs`` requests drafting ``depth``
        positions each (None: the full block), measured overheads included."""
        key = (num_reqs, depth)
        price = self._prices.get(key)
        if price is None:
            profiled = self._profiled(num_reqs, depth) * self._scale(num_reqs)
            price = self._prices[key] = profiled + self.overhead_ms(num_reqs, depth)
        return price

    def draft_costs_by_depth(self, num_reqs: int, num_positions: int) -> np.ndarray:
        """``[num_positions + 1]``: ``draft_cost_ms(num_reqs, d)`` for ``d = 1..K``, and
        at 0 what an undrafted step costs beyond its profiled price."""
        if self.depth_ms is None:
            costs = np.full(num_positions + 1, self._profiled(num_reqs, None))
        else:
            table = self.depth_ms
            depths = np.minimum(np.arange(num_positions + 1), table.shape[0] - 1)
            costs = table[depths, min(num_reqs, table.shape[1] - 1)].copy()
        costs *= self._scale(num_reqs)
        costs[0] = 0.0
        costs[1:] += self._drafted_overhead(num_reqs, np.arange(1, num_positions + 1))
        undrafted = self._fit(num_reqs, True)
        if undrafted is not None:
            costs[0] += undrafted[0]
        return costs

    def step_costs_ms(
        self, num_reqs: int, num_tokens: int, max_drafts: int, context_tokens: int = 0
    ) -> np.ndarray:
        costs = self.base.step_costs_ms(num_reqs, num_tokens, max_drafts, context_tokens)
        extra = self.draft_cost_ms(num_reqs) - self.base.draft_cost_ms(num_reqs)
        return costs + extra if extra else costs


LINE_MIN_STEPS = 3
"""Steps a drafting depth needs in the window to shape the overhead line, once another
depth has as many (``_line_depths``): the median of three resists one stray step."""


def _line_depths(points: deque) -> dict[int, list[float]]:
    """The values of ``(depth, ms)`` points by depth, less the depths seen fewer than
    ``LINE_MIN_STEPS`` times when another was seen that often: a depth seen once (or
    twice: a median of two is their mean) otherwise sets the line's slope wherever its
    step lands, and a depth priced too high is not drafted again to correct it: one stray
    step of a rare depth can steepen the line enough to keep a run drafting shallow. A
    depth left out is priced from the others, optimistically where they are one
    (``ObservedDraftCost``), so it is drafted and measured again. Until some depth has
    that many steps, every depth counts."""
    by_depth: dict[int, list[float]] = {}
    for depth, value in points:
        by_depth.setdefault(depth, []).append(value)
    if len(by_depth) > 1 and any(len(v) >= LINE_MIN_STEPS for v in by_depth.values()):
        by_depth = {d: v for d, v in by_depth.items() if len(v) >= LINE_MIN_STEPS}
    return by_depth


def _depth_line(points: deque) -> tuple[float, float]:
    """(intercept, slope) of a line through ``(depth, ms)`` points that an outlier does
    not drag (a step that paid a one-off allocation, a stray host stall): each depth's
    median (depths seen fewer than ``LINE_MIN_STEPS`` times left out where another was
    seen that often, ``_line_depths``), then Siegel's repeated median over those (per
    depth, the median slope to the others; the slope is the median of those, and never
    negative) and the median intercept; slope 0 when one depth was seen. A few dozen
    floats: plain Python."""
    return _line_through(_line_depths(points))


def _line_through(by_depth: dict[int, list[float]]) -> tuple[float, float]:
    """``_depth_line`` of the values ``_line_depths`` kept."""
    medians = sorted((d, statistics.median(values)) for d, values in by_depth.items())
    if len(medians) == 1:
        return medians[0][1], 0.0
    slope = statistics.median(
        statistics.median((v2 - v1) / (d2 - d1) for d2, v2 in medians if d2 != d1)
        for d1, v1 in medians
    )
    # A deeper draft never costs less (noisy steps can suggest it, and a falling line
    # would make the deepest drafts look cheapest): no slope below 0.
    slope = max(slope, 0.0)
    return statistics.median(v - slope * d for d, v in medians), slope
