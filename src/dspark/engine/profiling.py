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

import numpy as np
import torch

from dspark.engine.graphs import exact_shapes
from dspark.engine.kv_cache import BlockTable
from dspark.engine.request import Request
from dspark.engine.runner import ModelRunner
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
from dspark.scheduling.profiling import median_curve

EAGER_CAPTURE_SIZES = [1]
# Bumped whenever what a profile holds or how it is timed changes: an older file is
# profiled afresh.
PROFILE_FORMAT = 11

EAGER_SMALL_SIZES = 8
"""Eager steps are profiled at every token count up to this besides the doubling sizes: one
request verifying d drafts is a step of 1 + d tokens, and on a CPU the cost of a few rows
is not a line that 1, 2, 4, 8 would interpolate."""


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
    # Whether the drafter's block pass was cut to each depth: its times were measured so.
    block_cut: bool = False
    # Whether the engine's KV caches had regions (``EngineConfig.kv_regions``): attention
    # read the cached rows of a batch in place rather than gathered.
    kv_regions: bool = False
    # Ranks the target was split over: each rank's share and the all-reduces change costs.
    tensor_parallel_size: int = 1

    @property
    def tables(self) -> CostTables:
        """The seed's tables: per-size medians made non-decreasing by a running maximum."""
        draft, verify = cost_curves(self.samples)
        return build_cost_tables(
            draft, verify, self.max_num_seqs, self.max_num_batched_tokens, self.cudagraph_limit
        )

    def depth_costs(self) -> np.ndarray | None:
        """``[K + 1, max_num_seqs + 1]`` drafter cost by drafting depth, or None when the
        drafter was timed at full depth only."""
        if not self.draft_depth_samples or self.num_drafts < 1:
            return None
        full, _ = cost_curves(self.samples)
        grouped: dict[int, list[tuple[int, float]]] = {}
        for num_reqs, depth, ms in self.draft_depth_samples:
            grouped.setdefault(int(depth), []).append((int(num_reqs), float(ms)))
        curves = {depth: median_curve(points) for depth, points in grouped.items()}
        curves[self.num_drafts] = full
        return build_depth_costs(curves, self.num_drafts, self.max_num_seqs, self.cudagraph_limit)

    def save(self, path: Path) -> None:
        payload = asdict(self)
        payload["samples"] = [asdict(s) for s in self.samples]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1))

    @classmethod
    def load(cls, path: Path) -> EngineProfile | None:
        """The profile saved at ``path``; None if it was written in another format."""
        try:
            payload = json.loads(Path(path).read_text())
            if payload["format"] != PROFILE_FORMAT:
                return None
            payload["samples"] = [StepTiming(**s) for s in payload["samples"]]
            return cls(**payload)
        except (OSError, json.JSONDecodeError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(f"cannot read the engine profile {path}: {error}") from None

    def matches(self, runner: ModelRunner, drafter, num_drafts: int) -> bool:
        config = runner.config
        return (
            self.format == PROFILE_FORMAT
            and self.max_num_seqs == config.max_num_seqs
            and self.max_num_batched_tokens == config.max_num_batched_tokens
            and self.model == str(runner.loaded.path)
            and self.device == runner.device.type
            and self.dtype == str(runner.dtype)
            and self.cudagraph_limit == captured_sizes(runner)[-1]
            and self.num_drafts == (num_drafts if drafter is not None else 0)
            and self.row_plan == current_row_plan(runner)
            and self.block_cut == drafts_cut_blocks(drafter)
            and self.kv_regions == bool(runner.kv_regions)
            and self.tensor_parallel_size == config.tensor_parallel_size
        )


def profile_engine(
    runner: ModelRunner,
    drafter,
    num_drafts: int,
    runners: list,
    path: Path | None = None,
    profile_context: int = 128,
) -> EngineProfile:
    """Profile the target behind ``runner`` and ``drafter`` drafting ``num_drafts`` deep
    (``runners``: every padded-step runner, held to exact shapes while timing), or load a
    matching profile from ``path``; save it there."""
    if path is not None and Path(path).is_file():
        profile = EngineProfile.load(path)
        if profile is not None and profile.matches(runner, drafter, num_drafts):
            return profile
    config = runner.config
    samples = []
    rng = np.random.default_rng(0)
    capture_sizes = captured_sizes(runner)
    num_drafts = num_drafts if drafter is not None else 0
    depths = [num_drafts, *profiled_depths(num_drafts)] if num_drafts else []
    depth_samples: list[tuple[int, int, float]] = []
    sizes = profile_sizes(capture_sizes, config.max_num_batched_tokens)
    if runner.graphs is None:
        small = range(1, min(EAGER_SMALL_SIZES, config.max_num_batched_tokens) + 1)
        sizes = sorted(set(sizes).union(small))
    shapes = []
    for size in sizes:
        num_reqs = min(size, config.max_num_seqs)
        query = np.full(num_reqs, size // num_reqs)
        query[: size % num_reqs] += 1
        context = min(profile_context, runner.max_model_len - int(query.max()))
        shapes.append((size, num_reqs, query, context))
    with exact_shapes(runners):  # each size timed as itself
        if runner.graphs is not None:  # capture every shape before timing its replays
            for _, _, query, context in shapes:
                dummy_step(runner, drafter, query, context, rng, depths)
        # Round by round over the sizes, each round in its own order: a slow phase of the
        # machine lands on one replay of many sizes (the median drops it), never on every
        # replay of one, and no size always follows the same one.
        for replay in range(PROFILE_REPLAYS):
            turn = replay % len(depths) if depths else 0  # each depth timed first in turn
            order = depths[turn:] + depths[:turn]
            for index in rng.permutation(len(shapes)):
                size, num_reqs, query, context = shapes[index]
                forward_ms, drafter_ms = dummy_step(runner, drafter, query, context, rng, order)
                full = drafter_ms.get(num_drafts, 0.0)
                samples.append(StepTiming(num_reqs, size, forward_ms, full, True))
                depth_samples += [
                    (num_reqs, d, ms) for d, ms in drafter_ms.items() if d != num_drafts
                ]
    profile = EngineProfile(
        samples,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        capture_sizes[-1],
        profile_context,
        str(runner.loaded.path),
        runner.device.type,
        str(runner.dtype),
        PROFILE_FORMAT,
        num_drafts,
        depth_samples,
        current_row_plan(runner),
        drafts_cut_blocks(drafter),
        bool(runner.kv_regions),
        config.tensor_parallel_size,
    )
    if path is not None:
        profile.save(Path(path))
    return profile


def drafts_cut_blocks(drafter) -> bool:
    """Whether a DSpark drafter (a replay's own) cuts its block pass to each depth."""
    proposer = getattr(drafter, "inner", drafter)
    return bool(getattr(proposer, "block_cut", False))


def current_row_plan(runner: ModelRunner) -> list[list | None] | None:
    """The small-row plan the LM head's products run under (None: none, e.g. on CUDA)."""
    head = getattr(runner.model, "lm_head", None)
    if head is None or runner.device.type != "cpu":
        return None
    plan = row_plan(tuple(head.weight.shape))
    if plan is None:
        return None
    return [None if entry is None else list(entry) for entry in plan]  # as JSON reads it


def captured_sizes(runner: ModelRunner) -> list[int]:
    """Token counts a step pads to: the graph sizes, or [1] for eager steps (which pad
    nothing, so only size 1 is "captured" and larger sizes interpolate)."""
    return EAGER_CAPTURE_SIZES if runner.graphs is None else runner.graphs.token_sizes


@torch.inference_mode()
def dummy_step(
    runner: ModelRunner,
    drafter,
    query: np.ndarray,
    context: int,
    rng: np.random.Generator,
    depths: list[int],
) -> tuple[float, dict[int, float]]:
    """One dummy verify step (ms) and the drafter's proposal over the same requests at
    each drafting depth in ``depths`` (ms by depth)."""
    cache = runner.cache
    # Slot i's region for request i (``dspark.engine.kv_cache``), as running requests'.
    tables = [BlockTable(region=i) for i in range(len(query))]
    try:
        for table, q in zip(tables, query, strict=True):
            if not cache.reserve(table, context + int(q)):
                raise ValueError(
                    "the KV cache is too small to profile; raise kv_cache_tokens or lower "
                    "max_num_batched_tokens"
                )
        vocab = runner.loaded.config.vocab_size
        num_tokens = int(query.sum())
        tokens = rng.integers(0, vocab, num_tokens).astype(np.int64)
        start = runner.clock()
        hidden, _ = runner.forward(tables, np.full(len(query), context), query, tokens)
        runner.model.logits(hidden)  # a verify step samples every row it computes
        forward_ms = runner.clock() - start
        drafter_ms: dict[int, float] = {}
        if drafter is not None and depths:
            dummies = [
                # Greedy: sampling requests add per-request work in the drafter that a
                # greedy workload never pays (SamplingParams() samples at temperature 1).
                Request(f"profile-{i}", ids.tolist(), SamplingParams(temperature=0.0), 0.0)
                # (at least one token: the anchor; a size filling the model's length leaves none)
                for i, ids in enumerate(rng.integers(0, vocab, (len(query), max(context, 1))))
            ]
            for i, dummy in enumerate(dummies):
                dummy.slot = i  # its drafter rows in the slot's region, as the table's
            prepare = getattr(drafter, "prepare_dummy", None)
            try:
                for dummy in dummies:  # a drafter with a context cache: pretend it is full
                    if prepare is not None:
                        prepare(dummy)
                # On a GPU the proposal timed first after a forward runs slower, whatever
                # its depth: an untimed proposal goes first, and the timed order rotates
                # per replay (profile_engine). What real steps pay around the passes the
                # engine learns (ObservedDraftCost).
                drafter.propose(dummies, np.full(len(query), min(depths)))
                for depth in depths:  # proposing reads the drafter's context, never moves it
                    start = runner.clock()
                    drafter.propose(dummies, np.full(len(query), depth))
                    drafter_ms[depth] = runner.clock() - start
            finally:
                for dummy in dummies:
                    drafter.on_finished(dummy)
        return forward_ms, drafter_ms
    finally:
        for table in tables:
            cache.release(table)
