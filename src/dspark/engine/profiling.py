"""The start-up cost profile (the seed's plan) and its JSON cache.

Dummy steps of every profiled token count, split over ``min(tokens, max_num_seqs)``
requests that each have ``profile_context`` tokens cached, replayed a few times, with the
LM head on every row (as in a verification step, where each token is sampled); the
per-size medians become the cost tables of adaptive verification. With padded (graph)
steps every captured token count is profiled and a step costs what the captured size it
pads to costs (a step function up to the largest); eager execution pads nothing, so the
profile treats only size 1 as "captured" and interpolates every larger size between
profiled points (``cudagraph_limit = 1``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dspark.engine.graphs import exact_shapes
from dspark.engine.kv_cache import BlockTable
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams
from dspark.ops.linear import row_plan
from dspark.scheduling import (
    PROFILE_REPLAYS,
    CostTables,
    StepTiming,
    build_cost_tables,
    build_depth_costs,
    cost_curves,
    profile_sizes,
)
from dspark.scheduling.profiling import median_curve, monotone_curve

if TYPE_CHECKING:
    from dspark.engine.engine import LLMEngine

EAGER_CAPTURE_SIZES = [1]
# 2: the LM head runs on every row (1 priced only the last row); 3: the drafter is also
# timed at shallower depths (``draft_depth_samples``); 4: no depth is timed first after the
# forward (an untimed proposal runs before them, ``_dummy_step``); 5: eager steps also
# profile every size up to ``EAGER_SMALL_SIZES``, and CPU products of a few rows take the
# product measured faster (``dspark.ops.linear.tune_small_rows``); 6: sizes are timed
# round by round (replay 1 of every size, then replay 2, ...), not size by size; 7: what a
# key row of attention costs (``key_row_ms``); 8: CPU products may pad their rows to a
# larger count measured faster (the small-row plan holds row counts, no longer switches);
# 9: the plan names each count's product (``dspark.ops.linear.PATHS``: oneDNN's packed
# product joined ``F.linear`` and ``weight @ x.T``), and whether the drafter's block pass
# was cut to each depth (``block_cut``); 10: whether the KV caches read requests in their
# regions (``kv_regions``, ``dspark.engine.kv_cache``): attention costs another price.
PROFILE_FORMAT = 10

EAGER_SMALL_SIZES = 8
"""Eager steps are profiled at every token count 1 ... EAGER_SMALL_SIZES besides the
doubling sizes: one request verifying d drafts is a step of 1 + d tokens, and on a CPU
the cost of a few rows is not a line (session 10's guest: the model's products over 2-3
rows cost 1.1-1.2 times one row's, over 4 twice), which 1, 2, 4, 8 would interpolate
across. (A size s is profiled as min(s, max_num_seqs) requests, as every size is: the
products see s rows either way; attention differs from one request's s queries.)"""


def profiled_depths(num_drafts: int) -> list[int]:
    """Drafting depths timed besides the full K: one position, and half the block (the
    cost in between and around is interpolated, ``build_depth_costs``)."""
    return sorted({1, (num_drafts + 1) // 2} - {num_drafts})


@dataclass
class EngineProfile:
    samples: list[StepTiming]
    max_num_seqs: int
    max_num_batched_tokens: int
    cudagraph_limit: int
    profile_context: int
    model: str
    device: str
    dtype: str
    format: int = 1  # files written before the field existed are format 1
    num_drafts: int = 0  # K the drafter was timed at (0: no drafter)
    # (num_reqs, depth, drafter ms) for depths shallower than K (``profiled_depths``).
    draft_depth_samples: list[tuple[int, int, float]] = field(default_factory=list)
    # CPU: the small-row plan the products ran under (``dspark.ops.linear.row_plan``, as
    # [path, rows] per row count; None where there is none): timed under another plan,
    # the costs are another's.
    row_plan: list[list | None] | None = None
    # What a step pays per key row its attention gathers (requests x padded key span):
    # a full batch of decodes timed over cached contexts of two lengths, the difference
    # over the rows it added (``measure_key_rows``; 0 where the cache holds no second).
    key_row_ms: float = 0.0
    # Whether the drafter's block pass was cut to each depth (``EngineConfig.draft_block``):
    # the drafter's times were measured so.
    block_cut: bool = False
    # Whether the engine's KV caches had regions (``EngineConfig.kv_regions``): attention
    # read the cached rows of a batch in place rather than gathered.
    kv_regions: bool = False

    @property
    def tables(self) -> CostTables:
        """The seed's tables: per-size medians made non-decreasing by a running maximum."""
        return self.cost_tables("max")

    def cost_tables(self, fit: str = "max") -> CostTables:
        """The cost tables, the medians made non-decreasing by ``fit``: "max" (the seed's
        running maximum) or "isotonic" (``monotone_curve``, least squares)."""
        draft, verify = (_fitted(curve, fit) for curve in cost_curves(self.samples))
        return build_cost_tables(
            draft, verify, self.max_num_seqs, self.max_num_batched_tokens, self.cudagraph_limit
        )

    def depth_costs(self, fit: str = "max") -> np.ndarray | None:
        """``[K + 1, max_num_seqs + 1]`` drafter cost by drafting depth, or None when the
        drafter was timed at full depth only (``fit`` as in ``cost_tables``)."""
        if not self.draft_depth_samples or self.num_drafts < 1:
            return None
        full, _ = cost_curves(self.samples)
        grouped: dict[int, list[tuple[int, float]]] = {}
        for num_reqs, depth, ms in self.draft_depth_samples:
            grouped.setdefault(int(depth), []).append((int(num_reqs), float(ms)))
        curves = {depth: median_curve(points) for depth, points in grouped.items()}
        curves[self.num_drafts] = full
        curves = {depth: _fitted(curve, fit) for depth, curve in curves.items()}
        return build_depth_costs(curves, self.num_drafts, self.max_num_seqs, self.cudagraph_limit)

    def save(self, path: Path) -> None:
        payload = asdict(self)
        payload["samples"] = [asdict(s) for s in self.samples]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1))

    @classmethod
    def load(cls, path: Path) -> EngineProfile:
        try:
            payload = json.loads(Path(path).read_text())
            payload["samples"] = [StepTiming(**s) for s in payload["samples"]]
            return cls(**payload)
        except (OSError, json.JSONDecodeError, TypeError, KeyError) as error:
            raise ValueError(f"cannot read the engine profile {path}: {error}") from None

    def matches(self, engine: LLMEngine) -> bool:
        config = engine.config
        return (
            self.format == PROFILE_FORMAT
            and self.max_num_seqs == config.max_num_seqs
            and self.max_num_batched_tokens == config.max_num_batched_tokens
            and self.model == str(engine.loaded.path)
            and self.device == engine.device.type
            and self.dtype == str(engine.dtype)
            and self.cudagraph_limit == captured_sizes(engine)[-1]
            and self.num_drafts == (config.num_drafts if engine.drafter is not None else 0)
            and self.row_plan == current_row_plan(engine)
            and self.block_cut == drafts_cut_blocks(engine)
            and self.kv_regions == bool(engine.kv_regions)
        )


def profile_engine(
    engine: LLMEngine, profile_context: int = 128, path: Path | None = None
) -> EngineProfile:
    """Profile ``engine`` (or load a matching profile from ``path``; save it there)."""
    if path is not None and Path(path).is_file():
        profile = EngineProfile.load(path)
        if profile.matches(engine):
            return profile
    config = engine.config
    samples = []
    rng = np.random.default_rng(0)
    capture_sizes = captured_sizes(engine)
    num_drafts = config.num_drafts if engine.drafter is not None else 0
    depths = [num_drafts, *profiled_depths(num_drafts)] if num_drafts else []
    depth_samples: list[tuple[int, int, float]] = []
    sizes = profile_sizes(capture_sizes, config.max_num_batched_tokens)
    if engine.graphs is None:
        small = range(1, min(EAGER_SMALL_SIZES, config.max_num_batched_tokens) + 1)
        sizes = sorted(set(sizes).union(small))
    shapes = []
    for size in sizes:
        num_reqs = min(size, config.max_num_seqs)
        query = np.full(num_reqs, size // num_reqs)
        query[: size % num_reqs] += 1
        context = min(profile_context, engine.max_model_len - int(query.max()))
        shapes.append((size, num_reqs, query, context))
    with exact_shapes(engine.padded_runners()):  # each size timed as itself
        if engine.graphs is not None:  # capture every shape before timing its replays
            for _, _, query, context in shapes:
                _dummy_step(engine, query, context, rng, depths)
        # Round by round over the sizes, not size by size: a slow phase of the machine
        # lands on one replay of many sizes (the median drops it), never on every
        # replay of one (SmolLM2 on the 2-core CPU: 3 tokens profiled at 80.4 ms, 4 at
        # 58.6, and the seed's running maximum priced 1 to 2 drafts at 4 requests free).
        # Each round in its own order, so that no size always follows the same one (in
        # ascending rounds one token always came after 512, and measured 66.6 ms to 4
        # tokens' 56.3).
        for replay in range(PROFILE_REPLAYS):
            turn = replay % len(depths) if depths else 0  # each depth timed first in turn
            order = depths[turn:] + depths[:turn]
            for index in rng.permutation(len(shapes)):
                size, num_reqs, query, context = shapes[index]
                forward_ms, drafter_ms = _dummy_step(engine, query, context, rng, order)
                full = drafter_ms.get(num_drafts, 0.0)
                samples.append(StepTiming(num_reqs, size, forward_ms, full, True))
                depth_samples += [
                    (num_reqs, d, ms) for d, ms in drafter_ms.items() if d != num_drafts
                ]
        key_row_ms = measure_key_rows(engine, profile_context, rng)
    profile = EngineProfile(
        samples,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        capture_sizes[-1],
        profile_context,
        str(engine.loaded.path),
        engine.device.type,
        str(engine.dtype),
        PROFILE_FORMAT,
        num_drafts,
        depth_samples,
        current_row_plan(engine),
        key_row_ms,
        drafts_cut_blocks(engine),
        bool(engine.kv_regions),
    )
    if path is not None:
        profile.save(Path(path))
    return profile


def measure_key_rows(engine: LLMEngine, context: int, rng: np.random.Generator) -> float:
    """Milliseconds a step pays per key row its attention gathers: a full batch of
    decodes (``max_num_seqs`` requests, one token each) over ``context`` cached tokens
    and over about twice as many, ``PROFILE_REPLAYS`` rounds of both; the median of
    (slower - faster) over the rows added, never below 0. 0 where the KV cache or the
    model's length holds no batch twice as long. Called inside ``exact_shapes``."""
    num_reqs = engine.config.max_num_seqs
    longer = 2 * (context + 1) - 1  # twice the key span of ``context`` plus the decode
    cache = engine.cache
    blocks = num_reqs * -(-(longer + 1) // cache.block_size)
    if longer + 1 > engine.max_model_len or blocks > cache.num_free_blocks:
        return 0.0
    query = np.ones(num_reqs, dtype=np.int64)
    slopes = []
    for _ in range(PROFILE_REPLAYS + 1):  # the first round captures; it is not timed
        times, rows = [], []
        for cached in (context, longer):
            ms, _ = _dummy_step(engine, query, cached, rng, [])
            times.append(ms)
            rows.append(engine.key_rows)
        if rows[1] > rows[0]:
            slopes.append((times[1] - times[0]) / (rows[1] - rows[0]))
    return max(float(np.median(slopes[1:])), 0.0) if len(slopes) > 1 else 0.0


PROFILE_FITS = ("max", "isotonic")


def _fitted(curve: list[tuple[int, float]], fit: str) -> list[tuple[int, float]]:
    if fit not in PROFILE_FITS:
        raise ValueError(f"fit must be one of {PROFILE_FITS}, got {fit!r}")
    # "max": the running maximum build_cost_tables takes anyway.
    return monotone_curve(curve) if fit == "isotonic" else curve


def drafts_cut_blocks(engine: LLMEngine) -> bool:
    """Whether the engine's DSpark drafter (a replay's own) cuts its block pass."""
    proposer = getattr(engine.drafter, "inner", engine.drafter)
    return bool(getattr(proposer, "block_cut", False))


def current_row_plan(engine: LLMEngine) -> list[list | None] | None:
    """The small-row plan the engine's LM head products run under (None: none, e.g. on
    CUDA or before tuning)."""
    head = getattr(engine.model, "lm_head", None)
    if head is None or engine.device.type != "cpu":
        return None
    plan = row_plan(tuple(head.weight.shape))
    if plan is None:
        return None
    return [None if entry is None else list(entry) for entry in plan]  # as JSON reads it


def captured_sizes(engine: LLMEngine) -> list[int]:
    """Token counts a step pads to: the graph sizes, or [1] for eager steps (which pad
    nothing, so only size 1 is "captured" and larger sizes interpolate)."""
    return EAGER_CAPTURE_SIZES if engine.graphs is None else engine.graphs.token_sizes


@torch.inference_mode()
def _dummy_step(
    engine: LLMEngine,
    query: np.ndarray,
    context: int,
    rng: np.random.Generator,
    depths: list[int],
) -> tuple[float, dict[int, float]]:
    """One dummy verify step (ms) and the drafter's proposal over the same requests at
    each drafting depth in ``depths`` (ms by depth)."""
    cache = engine.cache
    # Slot i's region for request i (``dspark.engine.kv_cache``), as running requests'.
    tables = [BlockTable(region=i) for i in range(len(query))]
    try:
        for table, q in zip(tables, query, strict=True):
            if not cache.reserve(table, context + int(q)):
                raise ValueError(
                    "the KV cache is too small to profile; raise kv_cache_tokens or lower "
                    "max_num_batched_tokens"
                )
        vocab = engine.loaded.config.vocab_size
        num_tokens = int(query.sum())
        tokens = rng.integers(0, vocab, num_tokens).astype(np.int64)
        start = engine._clock()
        hidden, _ = engine.forward(tables, np.full(len(query), context), query, tokens)
        engine.model.logits(hidden)  # a verify step samples every row it computes
        forward_ms = engine._clock() - start
        drafter_ms: dict[int, float] = {}
        if engine.drafter is not None and depths:
            dummies = [
                # Greedy: sampling requests add per-request work in the drafter that a
                # greedy workload never pays (SamplingParams() samples at temperature 1).
                Request(f"profile-{i}", ids.tolist(), SamplingParams(temperature=0.0), 0.0)
                # (at least one token: the anchor; a size filling the model's length leaves none)
                for i, ids in enumerate(rng.integers(0, vocab, (len(query), max(context, 1))))
            ]
            for i, dummy in enumerate(dummies):
                dummy.slot = i  # its drafter rows in the slot's region, as the table's
            prepare = getattr(engine.drafter, "prepare_dummy", None)
            try:
                for dummy in dummies:  # a drafter with a context cache: pretend it is full
                    if prepare is not None:
                        prepare(dummy)
                # On a GPU the proposal timed first after a forward runs slower, whatever
                # its depth (the 8B shape on an H200: 0.05-0.3 ms at 1-64 requests,
                # scripts/gpu/depth_order.py), and the full block, always timed first,
                # was priced 0.4 ms above the line through the shallower depths. So an
                # untimed proposal goes first, and the timed order rotates per replay
                # (profile_engine): one more position costs the heads' own time. What
                # real steps pay around the passes the engine learns (ObservedDraftCost).
                engine.drafter.propose(dummies, np.full(len(query), min(depths)))
                for depth in depths:  # proposing reads the drafter's context, never moves it
                    start = engine._clock()
                    engine.drafter.propose(dummies, np.full(len(query), depth))
                    drafter_ms[depth] = engine._clock() - start
            finally:
                for dummy in dummies:
                    engine.drafter.on_finished(dummy)
        return forward_ms, drafter_ms
    finally:
        for table in tables:
            cache.release(table)
