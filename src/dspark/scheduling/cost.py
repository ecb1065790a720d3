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

TIME_SCALE_LIMITS = (0.25, 4.0)
"""Bounds on one step's time scale (its forward's time over the forward's profiled price,
``ObservedDraftCost.record_step``): a step outside them is read at the bound."""


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
      (flat pricing let a new engine's first step, drafted the full block deep, price
      one-deep drafting out of use on this CPU at temperature 1: 28 ms missed at depth
      7 was charged to depth 1 as well, and the engine stopped drafting).

      ``slope_memory``: a bucket whose window held two depths or more has measured a
      slope; when its window later holds one depth again (the engine settled on it),
      shallower depths are priced from that depth's level down the last slope measured,
      never below the ramp above, instead of by the ramp alone. The ramp prices
      shallower drafts as nearly free where the drafter's pass costs about the same at
      any depth: the SmolLM2 shape on an H200 at 256 requests (session 31, acceptance
      replayed), drafting held 3 deep, priced drafting 1 and 2 deep 4.2 and 2.1 ms
      below 3 deep (in a 29 ms step); left to choose, it went back to 1 or 2 deep in
      runs of 3-6 steps between runs at 3-5 (a depth seen fewer than
      ``LINE_MIN_STEPS`` times stays priced by the ramp), and its full-batch steps 1
      and 2 deep emitted 15.0 and 16.3 tokens a ms against 16.8 at 3 deep. Deeper
      depths stay priced as the measured one (optimistic), so a slope measured too
      steep is still corrected by drafting deeper. Off by default: SmolLM2 + the shipped
      drafter on an H200 (session 31, four or five interleaved repeats per level) ran
      without it 1.003x, 1.074x, 0.954x and 1.023x as fast as with it at 256, 64, 16
      and 1 requests, no consistent difference beside the host's own speed changes.

    Machine speed (``record_step``'s ``forward_ms``): a machine whose speed wanders (a
    shared CPU: this 2-core VM's forward at one request runs 0.65-1.3x its profiled time
    from one second to the next) makes the two windows above disagree: drafted steps
    mostly measured in a slow phase and undrafted ones in a fast one price drafting
    several milliseconds too high, the engine stops drafting, and the undrafted window
    then learns the slow phase while the drafted one keeps it. Given the step's target
    forward time, the step's wall time is read at the profile's speed (divided by the
    forward's time over its profiled price, the step's time scale) before the difference is
    taken, and so is each proposal's time (at the latest step's scale): what the windows
    keep is then in the profile's milliseconds whatever the phase they were measured in,
    and prices of drafting and not drafting move together. (Every price is then in the
    profile's milliseconds; a common scale changes no decision.) The cost: a step's
    forward then counts at exactly its profiled price, so a profile that misprices what
    the forward's draft tokens add is no longer corrected by the windows, which learn
    only the rest of the step.

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
        overhead_fit: str = "line",
        key_row_ms: float = 0.0,
        slope_memory: bool = False,
        slope_noise: bool = False,
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if overhead_fit not in ("line", "depth"):
            raise ValueError(f"overhead_fit must be 'line' or 'depth', got {overhead_fit!r}")
        if not (math.isfinite(key_row_ms) and key_row_ms >= 0.0):
            raise ValueError(f"key_row_ms must be a finite time >= 0, got {key_row_ms}")
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
        # Drafted buckets' last slope measured through two depths or more (class doc,
        # ``slope_memory``).
        self.slope_memory = slope_memory
        # Each drafted line's slope less its standard error (``_shrunk_slope``); off here,
        # on in the engine by default (``EngineConfig.overhead_slope_noise``).
        self.slope_noise = slope_noise
        self._slopes: dict[tuple[int, bool], float] = {}
        # overhead_fit "depth": drafted buckets' own median at each depth the window
        # holds ``LINE_MIN_STEPS`` times or more (other depths: the line), for costs that
        # do not grow as a line does. (Built when SmolLM2's steps on an H200 ran ~0.6 ms
        # longer 4 deep than 2-3 deep; session 29 traced that to the batch's key span,
        # not the depth, and the A/B gained nothing: off by default.)
        self.overhead_fit = overhead_fit
        # What a step's attention costs per key row it gathers (requests x padded key
        # span), measured at start-up (0: not priced). Steps over longer contexts cost
        # more whatever they draft (SmolLM2 on an H200 at 16 requests, session 29: 3.18,
        # 3.47 and 4.05 ms for spans of 128, 256 and 512 keys at 4 tokens a request), and
        # contexts grow through a run while its depths change: a window that mixes them
        # would charge the context's share to whichever depths ran at long contexts. So
        # each step's miss is read at the window's mean context (``record_step``).
        self.key_row_ms = float(key_row_ms)
        self._depth_medians: dict[tuple[int, bool], dict[int, float]] = {}
        # Prices asked for since the last measurement, by (request count, depth): a
        # step's decisions ask for the same few several times (the depth, then the
        # budget: four calls of ``draft_cost_ms`` each), and each is a dozen calls of
        # its own. Every ``record`` and ``record_step`` clears it.
        self._prices: dict[tuple[int, int | None], float] = {}
        # The latest step's time scale: its forward's time over the forward's profiled
        # price (2.0: the machine ran at half the profile's speed; ``record_step``'s
        # ``forward_ms``; 1.0 until a step brings one).
        self.time_scale = 1.0

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
        ratio = drafting_ms / self.time_scale / max(self._profiled(num_reqs, depth), 1e-9)
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
            line = intercept + slope * depths
            own = self._depth_medians.get(key)
            if not own:
                return line
            if np.ndim(depths) == 0:
                return own.get(int(depths), line)
            return np.array([own.get(int(d), v) for d, v in zip(depths, line, strict=True)])
        undrafted = self._fit(num_reqs, True)
        start = 0.0 if undrafted is None else undrafted[0]
        if intercept <= start:
            ramp = intercept + 0.0 * depths
        else:
            ramp = start + (intercept - start) * np.minimum(depths, measured) / measured
        slope = self._slopes.get(key)
        if slope is None:
            return ramp
        # Shallower: down the slope measured before, never below the ramp (class doc).
        remembered = intercept - slope * np.maximum(measured - depths, 0)
        return np.maximum(ramp, remembered)

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
        forward_ms: float | None = None,
        padded_tokens: int = 0,
        key_rows: int | None = None,
    ) -> None:
        """A whole step of ``num_reqs`` decoding requests (prompt chunks priced by the
        profile alone are not recorded), ``num_tokens`` non-draft tokens and
        ``num_drafts`` admitted drafts, drafted ``depth`` deep (0: undrafted), took
        ``wall_ms``; the difference from its profiled price feeds ``overhead_ms``: per
        request-count bucket, the median of the last ``OVERHEAD_WINDOW`` undrafted steps,
        and a robust line in the depth through the last drafted ones (``_depth_line``).
        ``forward_ms``: the step's target forward alone, if measured; the wall time is
        then read at the profile's speed (class doc, machine speed). ``padded_tokens``:
        tokens the step's forward ran beyond its own captured size (a CUDA graph of a
        larger shape replayed while its own was not captured, ``CaptureLedger``); the
        step is priced with them, as the profile prices a step at the size it runs, so
        that a transient cover is not learnt as what drafting that deep costs (a depth
        whose steps replay a much larger graph would look expensive and be drafted less,
        and its shape then gathers the padding that gets it captured only slowly).
        ``key_rows``: the key rows the step's attention gathered; with ``key_row_ms``
        each miss in the window counts at the window's mean of them (its own less its
        rows' cost, plus the mean rows' cost), so the line and the depths' medians
        compare steps as if at one context, and the price level stays the recent
        steps'."""
        if not np.isfinite(wall_ms) or wall_ms < 0:
            raise ValueError(f"wall_ms must be a finite non-negative time, got {wall_ms}")
        if forward_ms is not None and not (math.isfinite(forward_ms) and forward_ms > 0):
            raise ValueError(f"forward_ms must be a finite positive time, got {forward_ms}")
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
        if forward_ms is not None:  # price: the forward's profiled cost so far
            low, high = TIME_SCALE_LIMITS
            self.time_scale = min(max(forward_ms / max(price, VERIFY_FLOOR_MS), low), high)
            wall_ms = wall_ms / self.time_scale
        if depth:
            price += self._profiled(num_reqs, depth) * self._scale(num_reqs)
        key = (int(num_reqs).bit_length(), depth == 0)
        window = self._missed.setdefault(key, deque(maxlen=OVERHEAD_WINDOW))
        rows_ms = 0.0
        if key_rows is not None and self.key_row_ms:
            if key_rows < 0:
                raise ValueError(f"key_rows must be >= 0, got {key_rows}")
            rows_ms = self.key_row_ms * key_rows
            if forward_ms is not None:
                rows_ms /= self.time_scale
        window.append((depth, wall_ms - price, rows_ms))
        # The depths the line is drawn through (read at one context when rows are priced).
        depths = _line_depths(_at_mean_context(window) if self.key_row_ms else window)
        self._overhead[key] = _line_through(depths, self.slope_noise)
        if depth:
            if len(depths) == 1:
                self._one_depth[key] = next(iter(depths))
            else:
                self._one_depth.pop(key, None)
                if self.slope_memory:
                    self._slopes[key] = self._overhead[key][1]
                if self.overhead_fit == "depth":
                    self._depth_medians[key] = {
                        d: statistics.median(v)
                        for d, v in depths.items()
                        if len(v) >= LINE_MIN_STEPS
                    }

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


def _at_mean_context(window: deque) -> list[tuple[int, float]]:
    """``(depth, ms missed)`` of a window of ``(depth, ms missed, rows' ms)``, each miss
    read at the window's mean rows' cost (``ObservedDraftCost.record_step``)."""
    mean_rows_ms = sum(entry[2] for entry in window) / len(window)
    return [(depth, missed - rows_ms + mean_rows_ms) for depth, missed, rows_ms in window]


LINE_MIN_STEPS = 3
"""Steps a drafting depth needs in the window to shape the overhead line, once another
depth has as many (``_line_depths``): the median of three resists one stray step."""


def _line_depths(points: deque) -> dict[int, list[float]]:
    """The values of ``(depth, ms)`` points by depth, less the depths seen fewer than
    ``LINE_MIN_STEPS`` times when another was seen that often: a depth seen once (or
    twice: a median of two is their mean) otherwise sets the line's slope wherever its
    step lands, and a depth priced too high is not drafted again to correct it. (The 8B
    shape at 256 requests on an H200, session 26: replayed from the logged steps, one
    4-deep step that missed its price by 43 ms among fifteen 3-deep ones that missed it
    by about 16 made the line 26 ms steeper a depth; two of nine runs had learnt slopes of
    3.8 and 6 ms a depth and drafted 1-2 deep for most of the run, 0.93-0.97x K = 5
    against 0.99-1.07x for the others.) A depth left out is priced from the others,
    optimistically where they are one (``ObservedDraftCost``), so it is drafted and
    measured again. Until some depth has that many steps, every depth counts."""
    by_depth: dict[int, list[float]] = {}
    for depth, value, *_ in points:  # window entries also carry their rows' cost
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


def _line_through(by_depth: dict[int, list[float]], shrink: bool = False) -> tuple[float, float]:
    """``_depth_line`` of the values ``_line_depths`` kept; ``shrink``: the slope less
    its standard error (``_shrunk_slope``)."""
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
    if shrink and slope > 0.0:
        slope = _shrunk_slope(slope, by_depth)
    return statistics.median(v - slope * d for d, v in medians), slope


def _shrunk_slope(slope: float, by_depth: dict[int, list[float]]) -> float:
    """``slope`` less one standard error (never below 0), the error read between the
    window's two most measured depths. A step's noise is the pooled median absolute
    deviation of the steps from their depth's median (times 1.4826, a normal spread's);
    a median of ``n`` steps has about 1.2533 / sqrt(n) of it. Left as it is when no
    depth holds two steps (nothing to read the noise from).

    Why: two depths' medians over a 16-step window differ by noise alone, and the line
    keeps no negative slope, so a depth that costs no more than another is priced above
    it about half the time, and never below to even it out: on average by 0.4 standard
    errors for normal noise. The engine then drafts the shallower depth. Less one error
    (as read from the window), that bias was a third as large in the test of two equally
    costly depths (0.04 against 0.12 ms a depth at 0.5 ms of noise a step), and a real
    slope is priced one error low (optimistically: the deeper depth is drafted, so both
    stay measured and the line corrects)."""
    residuals = [abs(v - m) for v, m in _with_medians(by_depth)]
    if not residuals:
        return slope
    noise = 1.4826 * statistics.median(residuals)
    (d1, n1), (d2, n2) = sorted(
        ((d, len(v)) for d, v in by_depth.items()), key=lambda item: (-item[1], item[0])
    )[:2]
    se = 1.2533 * noise * math.sqrt(1.0 / n1 + 1.0 / n2) / abs(d1 - d2)
    return max(slope - se, 0.0)


def _with_medians(by_depth: dict[int, list[float]]):
    """``(value, its depth's median)`` for every value of a depth holding two or more."""
    for values in by_depth.values():
        if len(values) >= 2:
            median = statistics.median(values)
            yield from ((v, median) for v in values)
