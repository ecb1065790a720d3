"""The reference engine: continuous batching, chunked prefill, speculative decoding.

One ``step()``: the scheduler picks the batch; the drafter proposes drafts for decoding
requests; adaptive verification (stale budget, fresh allocation) or a fixed K decides how
many each verifies; one packed forward computes every scheduled token; verification
accepts drafts and emits tokens; rejected positions roll back in O(1).
"""

from __future__ import annotations

import enum
import itertools
import math
import numbers
import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
import torch

from dspark.engine.graphs import CAPTURE_AFTER_WASTE, PaddedStepRunner, timed_padding_budget
from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.engine.request import FinishReason, PromptTooLongError, Request
from dspark.engine.sampling import SamplingParams
from dspark.engine.scheduler import ScheduledChunk, Scheduler
from dspark.engine.speculative import (
    Drafter,
    NgramDrafter,
    OnlineAcceptance,
    Proposal,
    SampledRound,
    verify,
    verify_sampled,
)
from dspark.models.loader import LoadedModel
from dspark.ops import allocate_drafts_torch
from dspark.ops.linear import forget_small_rows, tune_small_rows
from dspark.scheduling import AdaptiveVerifier, StepCostModel, allocate_drafts
from dspark.scheduling.ceiling import DepthCeiling
from dspark.scheduling.cost import ObservedDraftCost
from dspark.scheduling.gate import ALONE_CONFIDENCE, ALONE_WINDOW, ThroughputGate

DEFER_LIMIT = 32
"""Most undrafted steps whose drafter context updates are held back at once."""

HOLD_LIMIT = 8
"""Most steps in a row that hold their draft room back (``EngineConfig.hold_draft_room``):
then one step reserves it and decides again, so a stream of prompts never keeps an
engine from drafting for good."""


class SpecMode(str, enum.Enum):
    NONE = "none"
    FIXED = "fixed"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's positions, up to the KV cache
    kv_cache_tokens: int = 65536
    block_size: int = 16
    spec: SpecMode = SpecMode.NONE
    num_drafts: int = 4  # K: drafts proposed per decoding request
    seed: int = 0
    profile_path: str | None = None  # adaptive: load the cost profile from / save it to here
    # "auto": the shipped DSpark drafter when one matches the model, else "ngram";
    # "dspark": the shipped one (an error if none matches); or a drafter directory.
    drafter: str = "auto"
    # Where the fresh allocation runs: "host" (NumPy, ``AdaptiveVerifier.allocate``) or
    # "device" (``dspark.ops.allocate_drafts_torch`` on the drafter's confidences where
    # they were computed); same decisions. "auto" is the host: this engine builds the
    # packed verify batch on the host, so the drafts and their confidences come back
    # there anyway, and the device op would add its launches and one more
    # synchronisation (about 0.4 ms a step on an H200, measured) to an otherwise
    # microseconds-long NumPy call. The op is for engines that keep drafts on the device.
    allocation: str = "auto"
    # The drafter's reduced vocabulary (draft_vocab.npy next to its weights): "on", "off"
    # or "auto" (on for CPU, where each draft position reads the LM head from memory; off
    # on CUDA, where the full head is cheap and the reduced one only lowers acceptance).
    draft_vocab: str = "auto"
    # Padded steps replayed as CUDA graphs (``dspark.engine.graphs``): "auto" (on for
    # CUDA), "on" (on CPU: the same padded layout, run eagerly) or "off" (eager, unpadded).
    cuda_graphs: str = "auto"
    # With padded steps: the drafter's head pass (each position's draft, greedy or
    # sampled, and confidence, then the calibration) as one replayed step per row count,
    # depth and pass (``dspark.engine.drafter.DraftHeads``) instead of a dozen launches a
    # position; False: eager heads.
    head_graphs: bool = True
    # CUDA graphs: a shape not captured yet replays a captured one that holds it until the
    # padding adds up to this many steps' worth, then is captured (``CaptureLedger``);
    # 0: capture every new shape the first time it is met; "auto": for the target's
    # steps, as many steps' worth as one capture's measured time over a forward's, at
    # most CAPTURE_AFTER_WASTE (``timed_padding_budget``; the drafter's runners keep
    # CAPTURE_AFTER_WASTE). "auto" is off by default: for the 8B shape at 256 requests on
    # an H200 it measured as the fixed budget (session 26, docs/bench/h200_8b.md).
    graph_padding_budget: float | str = CAPTURE_AFTER_WASTE
    # Adaptive, CUDA graphs: raise a step's budget to verify as many drafts as the
    # graph it replays holds (the captured size its tokens pad to, or a larger captured
    # shape covering its own), since the device computes that padding anyway
    # (``LLMEngine._filled_budget``).
    fill_padding: bool = True
    # Adaptive: a budget below the drafts is a cut, and a cut costs host time on the
    # step's critical path (the allocation, the padding fill, trimming the drafts). "on":
    # where the cost model prices verifying the cut drafts at less than the cuts'
    # measured host time, verify them all instead (as lossless; as many tokens or more,
    # in less time if the prices are right); "auto": on for CUDA. Off by default: SmolLM2
    # on an H200 (session 41, time-sliced) ran 1.009x (paired 1.002) with it at 64
    # requests, where cuts took 0.07 ms of allocation to save 0.015 ms of forward, level
    # at 16, and 0.991x (paired 0.991) at 256, where the drafts it kept cost more than
    # their price.
    cheap_cuts: str = "off"
    # Adaptive: per-step scheduling (the batch's shape, the depth decision, the budget's
    # plan and the cut) costs host time on every drafted step, and where the target is
    # launch-bound it buys little back. "on": once ``SETTLE_WINDOW`` decided steps in a
    # row all drafted, and the cost model prices what their decisions bought (the
    # forward time their cuts saved, the drafter time between their depths and the
    # window's lower median depth) below the host time their scheduling took (measured,
    # at the window's median), and the forward prices a draft more a decoding request
    # below one step's scheduling too, the engine settles: the next ``SETTLE_STEPS``
    # drafting steps draft that depth and verify every draft, as a fixed K would, with
    # no decision, plan or cut; the last hands the verifier its round; then one step
    # decides again and is weighed with the window (``LLMEngine._weigh_settling``). That
    # step deciding not to draft (the cost model, or the gate), or a batch outside half
    # to twice the window's size, ends the settling. As lossless as any step verifying
    # every draft it proposed. "auto" (the default): on for CUDA. SmolLM2 on an H200
    # (session 42, time-sliced, paired against plain adaptive in the same windows):
    # 1.016-1.031 at 16, 1.012-1.028 at 64, 1.025 at 1; at 256 it seldom settles (0.990,
    # and one run whose learnt prices drafted 1 deep, 0.935); the 8B shape 0.994-1.014.
    settle: str = "auto"
    # Adaptive, with ``settle``: the depth a settled stretch drafts. "median" (the
    # default): the lower median of the depths the window's decided steps chose.
    # "measured": of the window's depths, the one whose earlier settled stretches, at a
    # batch of half to twice the window's, emitted the most tokens a request per ms; the
    # lower median while that has no such stretch (so each depth is first tried as the
    # median; ``measured_settle_depth``). Session 47, SmolLM2 on an H200 at 64 requests:
    # stretches settled 2 deep emitted 11-13% fewer tokens a ms than K = 4's steps, and
    # the run that settled 2-3 deep on a third of its steps ran 0.970x K = 4, against
    # 0.987x and 1.005x in runs that seldom or never did. "measured" is not yet measured
    # on a GPU.
    settle_depth: str = "median"
    # Adaptive: also decide whether to draft at all from measured tokens per ms of
    # drafted and undrafted steps (``dspark.scheduling.gate``), on top of the cost model.
    throughput_gate: bool = True
    # Adaptive, the gate at one request: the steps it keeps per arm (one request's
    # drafted steps are correlated, and a short window holds the last request alone;
    # ``gate.ALONE_WINDOW``, 128 since session 31; 16 is the gate before it), and how
    # many standard errors wide its veto's bounds are (``gate.ALONE_CONFIDENCE``, 1).
    gate_alone_window: int = ALONE_WINDOW
    gate_alone_confidence: float = ALONE_CONFIDENCE
    # Adaptive: on steps the gate leaves undrafted, hold the drafter's context updates back
    # and run them batched (every DEFER_LIMIT steps, or before the next drafting step).
    defer_upkeep: bool = True
    # Adaptive, with ``defer_upkeep``: the cost model prices an undrafted step that held its
    # upkeep back with its share of a catch-up, as the gate does (``LLMEngine.step``).
    # False: at its own time alone, as before session 46 (kept to A/B it). SmolLM2 at 16
    # requests on the 2-core CPU (session 46, two runs of four time-sliced windows): True
    # ran 1.000x and 0.995x False (paired 0.998, 0.999): the decisions moved, not the
    # speed.
    upkeep_in_price: bool = True
    # Adaptive: a step with prompt work (a chunk in progress, or a prompt waiting for a free
    # slot) right after a decided step that drafted nothing reserves no draft room in the
    # token budget, so its prompt chunk takes the room drafts would not use; such a step
    # drafts nothing and decides nothing (at most HOLD_LIMIT in a row). "auto": on without
    # the look-ahead (the decision comes after the batch is scheduled); "on", "off". Off by
    # default: SmolLM2 on the 2-core CPU at 16 requests, where no speculation beats every
    # fixed K and adaptive's prompts went in 12 chunks to no speculation's 7 (its budget
    # holding 7 drafts a decode it did not draft), held about 5 steps a window and ran
    # level with it off (session 43, eight windows: off 1.006x, paired 1.008, 0.86-1.09).
    hold_draft_room: str = "off"
    # Adaptive: decide the next step's drafting depth while the device runs this step's
    # forward, for the same requests ("auto": on for CUDA, where the forward runs
    # asynchronously; "on", "off"). Used as the next step's own decision if the next
    # batch is the same decodes.
    lookahead: str = "auto"
    # Adaptive, look-ahead on: a next batch that is not the same decodes (a prompt chunk
    # joined, a request left, one nears its length limit) still takes the depth decided
    # ahead when at least this share of its decoding requests were among those it was
    # decided for (its budget is then planned in the step); None: decide such a step in
    # the step, so every depth is the one the step would take itself.
    lookahead_reuse: float | None = 0.75
    # Adaptive, look-ahead on: a next batch whose decoding requests were all planned for
    # ahead, but that is not exactly them (one finished or nears its length limit), takes
    # as its budget the sum of its requests' shares of the budget planned ahead
    # (``AdaptiveVerifier.plan_shares``) instead of planning in the step (while the
    # drafter runs, which a launch-bound target does not hide). A prompt chunk moves the
    # step's token count along the captured sizes, so shares priced for the decodes alone
    # cut such a step's drafts where the decodes' step is cheap, not where the step with
    # the chunk is: "decode" gives a batch with a prompt chunk the ranking that plan made
    # of its decoding requests, cut again at the step's own prices
    # (``AdaptiveVerifier.recut``: the step's own plan but for the batch-level shrink,
    # without reading the slots again), "all" gives it the shares too, "off" plans every
    # changed batch in the step. By the 8B shape's H200 profile at 256 requests steps
    # with a chunk emit 3.6% fewer tokens a ms with "all" than planned in the step
    # (``scripts/mixed_step_model.py``), and on the H200 planning them in the step ran
    # 1.028x "all" (paired median of five runs; docs/bench/h200_8b.md, session 27).
    lookahead_shares: str = "decode"
    # Adaptive: how the start-up profile's per-size medians are made non-decreasing
    # before they price steps: "max", the seed's running maximum, or "isotonic", the
    # closest non-decreasing curve in least squares
    # (``dspark.scheduling.profiling.monotone_curve``). Where a step's time barely grows
    # with its tokens (a small model replaying graphs), the running maximum can carry one
    # slow median to every larger size and price a rise that is there flat. On the H200's
    # SmolLM2 profiles the two differ by <= 0.14 ms (session 29); on this 2-core CPU
    # isotonic ran 0.923x and 0.878x plain adaptive at 1 and 4 requests (paired 0.929 and
    # 1.022; session 36, docs/results/bench/cpu_iso_session36). Not A/B'd on a GPU.
    profile_fit: str = "max"
    # Adaptive: what drafted steps cost beyond their profiled price, by drafting depth:
    # "line", a robust line in the depth through the measured steps
    # (``ObservedDraftCost``), or "depth", each depth's own median where it was measured
    # often enough, the line elsewhere (session 29's A/Bs: no gain on the H200 nor here).
    overhead_fit: str = "line"
    # Adaptive: once drafted steps of a batch size have shown what a depth costs (two
    # depths or more measured), shallower depths are priced down that slope when the
    # engine settles on one depth, not as nearly free (``ObservedDraftCost``,
    # ``slope_memory``). Off by default: no consistent gain on the H200 (session 31,
    # docs/bench/h200_smollm2.md).
    overhead_slope_memory: bool = False
    # Adaptive, ObservedDraftCost: each learnt overhead line's slope in the drafting depth
    # less its standard error, read from the window's own spread (``cost._shrunk_slope``).
    # The line keeps no negative slope, so noise alone prices equally costly deeper
    # depths higher. In simulation (the 8B shape's H200 profile at 16 requests, noisy
    # synthetic step times, eight seeds) it moved most 6-deep steps to 7 deep, as the
    # prices known decide (docs/results/sim/slope_noise_c16_session35.txt). On by
    # default since session 36's in-run A/Bs on the H200 (``--variant
    # sn:overhead_slope_noise=on``, docs/results/bench/h200/session36/): the 8B shape ran
    # 1.014x and 1.020x plain adaptive at 16 requests, 1.032x at 64 and 0.988x, 1.003x
    # and 1.000x at 1, 4 and 256; SmolLM2 0.995x at 16 and 0.985x at 1; this CPU, at the
    # main job's levels over five repeats, 1.029x at 1 and 0.953x at 4 (ratios of
    # medians; the paired ones in that folder's README and docs/bench/cpu.md).
    overhead_slope_noise: bool = True
    # Adaptive: read each step's measured time at the recent steps' mean context before
    # the cost model learns from it, by what the start-up profile measured a key row of
    # attention to cost (``ObservedDraftCost`` ``key_row_ms``), so that the context's
    # growth through a run is not learnt as the price of the depths drafted at its end
    # (session 29's A/Bs: no gain on the H200 nor on this CPU).
    context_rows: bool = False
    # Adaptive: correct the survival every plan prices by how verified drafts fared
    # against their confidences, per position (``AdaptiveVerifier.record_outcomes``).
    # A step's outcomes are learnt one step late (during the next forward with the
    # look-ahead, at the end of the next step without), so that a plan taken ahead and
    # one taken in the step read the same state. Off by default: not yet shown to pay
    # end to end (docs/bench/h200_smollm2.md, sessions 23 and 24).
    calibrate_survival: bool = False
    # Adaptive: read each step's measured time at the start-up profile's machine speed
    # (its target forward's time over the profiled price of that forward) before the cost
    # model learns from it (``ObservedDraftCost``, machine speed), so that overheads
    # measured in a slow phase of a shared machine and in a fast one compare: "auto" (on
    # without the look-ahead, as on a CPU; off with it, as on CUDA, where the forward's
    # time is measured around the look-ahead's host work), "on", "off". Off by default:
    # on this 2-core VM it steadies the learnt prices, but its effect on throughput was
    # not separable from the VM's spread (README, CPU section, session 24).
    normalise_speed: str = "off"
    # Adaptive: the shallowest drafting depth whose promise of tokens per ms is within
    # this share of the best depth's (and beats not drafting) is chosen
    # (``AdaptiveVerifier.depth_margin``; 0: the best promise wins).
    depth_margin: float = 0.0
    # Adaptive: drafting must promise more than this share above the tokens per ms of not
    # drafting (``AdaptiveVerifier.draft_margin``; 0: any promised gain drafts).
    draft_margin: float = 0.0
    # Adaptive: cap the drafting depth the cost model chooses at a ceiling searched per
    # batch size by measured tokens per ms (``dspark.scheduling.ceiling.DepthCeiling``).
    # Off by default: made after session 39 found SmolLM2 on an H200 at 16 requests
    # 0.923x K = 4 drafting up to 7 deep and 1.028x K = 4 held to 4 deep; not yet run on
    # a GPU (``--variant dc:depth_ceiling=on``).
    depth_ceiling: bool = False
    # CPU: products of 1-64 rows (a verify step's K + 1 per request) run as whichever of
    # F.linear, weight @ x.T and oneDNN's product over packed weights measured fastest on
    # this machine at start-up, over the target's own weights, padded with zero rows to a
    # larger count where that measured clearly faster, and then the drafter's own shapes
    # timed alike on its weights ("tune", about 8 s here, once per process and model;
    # ``dspark.ops.linear.tune_small_rows``), or as weight @ x.T for 2-16 rows
    # ("transposed", the choice before session 10; nothing packed). Per weight shape,
    # process-wide: the last engine built on a model decides for that model's shapes.
    small_rows: str = "tune"
    # DSpark drafter: how much of its block the block pass runs. "full": all K positions
    # (the anchor and K - 1 mask tokens, attending to each other), whatever the step
    # drafts, as trained; "cut": the positions up to the step's deepest draft and one mask
    # token after it (``DSparkDrafter.block_cut``), so a shallow step pays a shallow pass.
    # The cut changes the drafts a little (the positions kept no longer attend to the mask
    # tokens past the cut): SmolLM2's drafter at 16 requests on this CPU, acceptance
    # length 1.435 cut against 1.438 full at K = 1, 1.661 against 1.664 at K = 3, while
    # its pass took 6.8 ms cut against 12.4 at K = 1 (session 44). Lossless either way.
    # "auto" (the default): cut, on every device. On the H200 (session 46, time-sliced,
    # against full in the same windows) the 8B shape at 256 requests ran 1.033x and
    # 1.035x in two runs (paired 1.033, 1.026; its shallow steps' drafter pass 6.3 ms cut
    # against 7.5 full); every other level of both targets 0.991-1.007 (paired
    # 0.993-1.007; ``docs/results/bench/h200/session46``). Before session 46: full on
    # CUDA, then unmeasured there.
    draft_block: str = "auto"
    # KV cache regions (``dspark.engine.kv_cache``): "on" gives each sequence slot a run of
    # the cache's blocks that its request fills in order, so that eager attention reads
    # the cached keys and values of a batch of decodes as a view of the cache rather than
    # copying them in every layer (SmolLM2 at 16 requests of about 600 tokens on this
    # CPU: a forward of 86.5 ms against 118.2 gathered, session 45). The
    # pool's size is unchanged; a request that outgrows its run (kv_cache_tokens /
    # max_num_seqs tokens) is read by a gather. "off": blocks from one pool, gathered.
    # "auto" (the default): on on the CPU; off on CUDA, whose padded steps (graphs)
    # gather in fixed shapes and whose eager path was not measured with them.
    kv_regions: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", SpecMode(self.spec))
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise ValueError(f"cuda_graphs must be 'auto', 'on' or 'off', got {self.cuda_graphs!r}")
        if self.draft_vocab not in ("auto", "on", "off"):
            raise ValueError(f"draft_vocab must be 'auto', 'on' or 'off', got {self.draft_vocab!r}")
        if self.lookahead not in ("auto", "on", "off"):
            raise ValueError(f"lookahead must be 'auto', 'on' or 'off', got {self.lookahead!r}")
        if self.lookahead_reuse is not None and not 0.0 < self.lookahead_reuse <= 1.0:
            raise ValueError(
                f"lookahead_reuse must be in (0, 1] or None, got {self.lookahead_reuse!r}"
            )
        budget = self.graph_padding_budget
        number = isinstance(budget, numbers.Real) and not isinstance(budget, bool)
        if budget != "auto" and not (number and budget >= 0.0):
            raise ValueError(
                "graph_padding_budget must be 'auto' or a number of steps >= 0 (0: capture "
                f"every new shape at once), got {budget!r}"
            )
        if self.lookahead_shares not in ("decode", "all", "off"):
            raise ValueError(
                f"lookahead_shares must be 'decode', 'all' or 'off', got {self.lookahead_shares!r}"
            )
        if self.normalise_speed not in ("auto", "on", "off"):
            raise ValueError(
                f"normalise_speed must be 'auto', 'on' or 'off', got {self.normalise_speed!r}"
            )
        if self.gate_alone_window < 1:
            raise ValueError(f"gate_alone_window must be at least 1, got {self.gate_alone_window}")
        if not self.gate_alone_confidence >= 0.0:
            raise ValueError(
                f"gate_alone_confidence must be >= 0, got {self.gate_alone_confidence}"
            )
        if not 0.0 <= self.depth_margin < 1.0:
            raise ValueError(f"depth_margin must be in [0, 1), got {self.depth_margin}")
        if not 0.0 <= self.draft_margin < 1.0:
            raise ValueError(f"draft_margin must be in [0, 1), got {self.draft_margin}")
        if self.profile_fit not in ("max", "isotonic"):
            raise ValueError(f"profile_fit must be 'max' or 'isotonic', got {self.profile_fit!r}")
        if self.overhead_fit not in ("line", "depth"):
            raise ValueError(f"overhead_fit must be 'line' or 'depth', got {self.overhead_fit!r}")
        if self.small_rows not in ("tune", "transposed"):
            raise ValueError(f"small_rows must be 'tune' or 'transposed', got {self.small_rows!r}")
        if self.hold_draft_room not in ("auto", "on", "off"):
            raise ValueError(
                f"hold_draft_room must be 'auto', 'on' or 'off', got {self.hold_draft_room!r}"
            )
        if self.cheap_cuts not in ("auto", "on", "off"):
            raise ValueError(f"cheap_cuts must be 'auto', 'on' or 'off', got {self.cheap_cuts!r}")
        if self.kv_regions not in ("auto", "on", "off"):
            raise ValueError(f"kv_regions must be 'auto', 'on' or 'off', got {self.kv_regions!r}")
        if self.draft_block not in ("auto", "full", "cut"):
            raise ValueError(
                f"draft_block must be 'auto', 'full' or 'cut', got {self.draft_block!r}"
            )
        if self.settle not in ("auto", "on", "off"):
            raise ValueError(f"settle must be 'auto', 'on' or 'off', got {self.settle!r}")
        if self.settle_depth not in ("median", "measured"):
            raise ValueError(
                f"settle_depth must be 'median' or 'measured', got {self.settle_depth!r}"
            )
        if self.allocation not in ("auto", "host", "device"):
            raise ValueError(
                f"allocation must be 'auto', 'host' or 'device', got {self.allocation!r}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.spec is not SpecMode.NONE and self.num_drafts < 1:
            raise ValueError(
                f"num_drafts (K) must be at least 1 with speculation, got {self.num_drafts}"
            )
        if self.max_model_len is not None and not 1 < self.max_model_len <= self.kv_cache_tokens:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must be at least 2 and fit "
                f"kv_cache_tokens ({self.kv_cache_tokens})"
            )


STEP_FIELDS = (
    "wall_ms",  # the step, start to end (a held-back upkeep flush included)
    "flush_ms",  # of it, catching up held-back drafter upkeep
    "draft_ms",  # the drafting phase (depth decision, proposal, budget, allocation)
    "forward_ms",  # the target's forward (device-synchronised)
    "apply_ms",  # verification, emission, the drafter's context update
    "schedule_ms",  # adaptive: budget and allocation after the proposal
    "before_ms",  # of the drafting phase, before the proposal (depth, plans, flush)
    "shape_ms",  # of that, adaptive: the batch's shape (``_batch_shape``)
    "decide_ms",  # the depth decision (``_drafting_depth``)
    "plan_ms",  # the budget planned or taken before the drafter runs
    "sync_ms",  # waiting for the device before the proposal's timer starts
    "propose_ms",  # of it, the proposal (device-synchronised)
    "requests",  # requests in the batch
    "chunk_tokens",  # non-draft tokens past one a request: prompt chunks (0: decodes alone)
    "tokens",  # tokens the target's forward ran on (drafts included)
    "depth",  # drafting depth of the proposal (0: undrafted)
    "drafts",  # drafts verified
    "emitted",  # tokens emitted
    "graph_tokens",  # tokens of the captured shape replayed (0: eager)
    "covered",  # replayed a larger captured shape than its own
    "captured",  # captured a CUDA graph
    "settled",  # drafted at a settled depth, undecided (``EngineConfig.settle``)
)


CUT_TIMES = 9
"""``EngineConfig.cheap_cuts``: the cuts' host time is the median of this many latest."""

CUT_RETIME = 32
"""``EngineConfig.cheap_cuts``: after this many cuts left unmade since one was made, the
next is made, and timed."""

SETTLE_WINDOW = 16
"""``EngineConfig.settle``: the decided drafting steps weighed to settle (all must have
drafted; their cuts' priced savings against their scheduling's host time)."""

SETTLE_STEPS = 32
"""``EngineConfig.settle``: drafting steps run at the settled depth, undecided, before one
decides again."""

SETTLE_RECORDS = 4
"""``EngineConfig.settle_depth="measured"``: the latest settled stretches kept per depth."""


def measured_settle_depth(
    depths: list[int],
    median: int,
    stretches: dict[int, deque],
    num_reqs: float,
) -> int:
    """``EngineConfig.settle_depth="measured"``: the depth to settle at, of ``depths``
    (the window's decided depths; ``median`` their lower median). ``stretches`` maps a
    depth to its settled stretches as (decoding requests the stretch was weighed at,
    tokens emitted, ms of its timed steps). A depth's rate is over its stretches weighed
    at half to twice ``num_reqs``: their tokens a request (a batch twice as large emits
    about twice the tokens in a step of about the same time on a launch-bound target)
    over their ms. The median stands while it has no rate (it is tried first); else the
    window's depth of the highest rate, the median on ties."""

    def rate(depth: int) -> float | None:
        near = [
            (tokens / reqs, ms)
            for reqs, tokens, ms in stretches.get(depth, ())
            if num_reqs / 2 <= reqs <= 2 * num_reqs
        ]
        total_ms = sum(ms for _, ms in near)
        return sum(tokens for tokens, _ in near) / total_ms if total_ms > 0.0 else None

    best_rate = rate(median)
    if best_rate is None:
        return median
    best = median
    for depth in sorted(set(depths)):
        depth_rate = rate(depth)
        if depth_rate is not None and depth_rate > best_rate:
            best, best_rate = depth, depth_rate
    return best


@dataclass
class EngineStats:
    num_steps: int = 0
    num_decode_rounds: int = 0
    num_verified: int = 0  # admitted drafts + 1 per decode round
    num_accepted: int = 0  # accepted drafts + 1 per decode round
    num_generated: int = 0
    # The most recent steps only: a long-running server must not grow without bound.
    forward_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    drafter_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    budgets: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    schedule_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    undrafted_steps: int = 0  # adaptive: steps where drafting would not have paid
    gate_vetoes: int = 0  # adaptive: of those, steps the cost model drafted but the gate not
    ceiling_cuts: int = 0  # adaptive: drafted steps drafted shallower by the depth ceiling
    probes: int = 0  # adaptive: drafted steps the cost model declined (``should_probe``)
    held_steps: int = 0  # adaptive: steps that held their draft room back (hold_draft_room)
    # Adaptive: drafted steps whose budget verified fewer drafts than were proposed.
    budget_cuts: int = 0
    # Steps whose budget was raised into the padding of the graph they replay, and the
    # drafts that added (``EngineConfig.fill_padding``).
    filled_steps: int = 0
    filled_drafts: int = 0
    # Adaptive: steps that verified every draft instead of cutting to the budget, the
    # verification priced below the cut's host time (``EngineConfig.cheap_cuts``).
    cheap_cuts: int = 0
    # Adaptive: drafting steps run at a settled depth with every draft verified and no
    # decision, plan or cut, and the times the engine settled (``EngineConfig.settle``).
    settled_steps: int = 0
    settles: int = 0
    # Adaptive: decided steps by drafting depth (0: undrafted).
    depth_steps: Counter[int] = field(default_factory=Counter)
    # Adaptive: drafting decisions taken ahead, during the previous step's forward, and
    # used (the batch was the same decodes); the host time spent taking them, used or not.
    lookahead_hits: int = 0
    # Adaptive: steps whose batch differed but took the depth decided ahead anyway
    # (``EngineConfig.lookahead_reuse``).
    lookahead_reused: int = 0
    # ``lookahead_ms``, the host time above: since session 41 it also holds the shares
    # looked up (and recut) while the drafter runs (``_plan_while_drafting``).
    lookahead_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    # Adaptive: of those, steps whose budget was planned ahead too (its round recorded
    # during the forward): the step itself only allocated.
    lookahead_plans: int = 0
    # Adaptive: steps whose budget was planned while the drafter ran, and taken
    # (``LLMEngine._plan_while_drafting``; the host time of every such plan, taken or
    # not, is in ``lookahead_ms``).
    drafting_plans: int = 0
    # Adaptive: steps whose batch changed and took the sum of its requests' shares of the
    # budget planned ahead (``EngineConfig.lookahead_shares``).
    share_plans: int = 0
    # Adaptive: steps with a prompt chunk whose budget was the look-ahead's ranking cut
    # again at the step's own prices (``AdaptiveVerifier.recut``; lookahead_shares
    # "decode").
    recut_plans: int = 0
    capture_steps: int = 0  # steps that captured a CUDA graph (a one-time cost per shape)
    # Host phases of a step (ms, no device sync): drafting as a whole (gate, proposal,
    # budget, allocation), verification and emission, the drafter's context update.
    draft_phase_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    apply_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    observe_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    # One tuple per step, fields ``STEP_FIELDS``: what a benchmark needs to say which
    # steps make a difference in step time (``dspark bench --step-log``).
    step_log: deque[tuple] = field(default_factory=lambda: deque(maxlen=10_000))

    @property
    def acceptance_length(self) -> float:
        """Tokens per decode round, the bonus token included."""
        return self.num_accepted / self.num_decode_rounds if self.num_decode_rounds else 0.0

    @property
    def verified_per_step(self) -> float:
        """Tokens verified per request per decode round (admitted drafts + 1)."""
        return self.num_verified / self.num_decode_rounds if self.num_decode_rounds else 0.0


def uses_kv_regions(config: EngineConfig, device: torch.device) -> bool:
    """Whether the KV caches give each sequence slot a region (``EngineConfig.kv_regions``)."""
    return config.kv_regions == "on" or (config.kv_regions == "auto" and device.type == "cpu")


def drafter_rows(config: EngineConfig, drafter_block: int) -> int:
    """Cache rows a drafter needs beside an engine: the target's, plus room for every
    running request's block of ``drafter_block`` drafts (rounded up by a cache block)."""
    return config.kv_cache_tokens + config.max_num_seqs * (drafter_block + config.block_size)


@dataclass
class _Batch:
    """What adaptive verification needs to know about this step's batch (built once)."""

    slots: np.ndarray  # verifier slot per scheduled request, batch order
    decode_index: np.ndarray  # positions in the batch of the decoding requests
    non_draft: np.ndarray  # tokens per request before drafts
    num_sampling: int  # requests that sample a token this step
    context: int  # tokens already cached across the batch
    # The same as Python lists and sums, for the per-step checks of a small batch: each
    # NumPy call costs microseconds there, several times more on a host just back from
    # queueing a forward (cold caches), and a step made about thirty of them.
    slot_list: list[int] = field(default_factory=list)
    decode_list: list[int] = field(default_factory=list)
    num_tokens: int = 0  # non_draft summed
    host_ms: float = 0.0  # time spent building this
    chunks: list = field(default_factory=list)  # the scheduled chunks, batch order


class LLMEngine:
    """``add_request`` / ``step`` over a loaded model."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig | None = None,
        drafter: Drafter | None = None,
        cost_model: StepCostModel | None = None,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.config = config = config or EngineConfig()
        positions = loaded.config.max_position
        self.max_model_len = config.max_model_len or min(positions, config.kv_cache_tokens)
        if self.max_model_len > positions:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's {positions} positions"
            )
        param = next(self.model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if self.device.type == "cuda":
            # cuDNN's attention prepares a plan per new shape on the host (1.3-2.9 ms a
            # call measured on an H200) and every step brings new key lengths; the flash /
            # memory-efficient kernels have no such cost. The switch is process-wide.
            torch.backends.cuda.enable_cudnn_sdp(False)
        weights_of = getattr(self.model, "linear_weights", None)
        if self.device.type == "cpu" and weights_of is not None:
            if config.small_rows == "tune":
                tune_small_rows(weights_of())
            else:
                forget_small_rows(weights_of())
        self.padded_steps = config.cuda_graphs == "on" or (
            config.cuda_graphs == "auto" and self.device.type == "cuda"
        )
        self.kv_regions = config.max_num_seqs if uses_kv_regions(config, self.device) else 0
        self.cache = PagedKVCache(
            loaded.config,
            # Padded steps take one block for padding tokens: on top of the pool asked for.
            config.kv_cache_tokens // config.block_size + int(self.padded_steps),
            config.block_size,
            self.dtype,
            self.device,
            regions=self.kv_regions,
        )
        self.scheduler = Scheduler(
            self.cache,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            on_admit=self._on_admit,
            on_release=self._on_release,
        )
        self.graphs: PaddedStepRunner | None = None
        if self.padded_steps:
            self.graphs = PaddedStepRunner(
                self._graph_body,
                self.cache,
                max_tokens=config.max_num_batched_tokens,
                max_pieces=config.max_num_batched_tokens,
                max_len=self.max_model_len,
                capture=self.device.type == "cuda",
            )
        self.stop_ids = loaded.stop_token_ids
        self.stats = EngineStats()
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        # Requests without a seed of their own take the next of these (a count, not the
        # number of requests held: a server releases finished ones, and every request
        # that arrived alone would have sampled from the same seed).
        self._seeds = itertools.count()
        self.drafter: Drafter | None = None
        self.verifier: AdaptiveVerifier | None = None
        self.gate: ThroughputGate | None = None
        self.ceiling: DepthCeiling | None = None
        self._ceiling_arm: tuple[int, int, int] | None = None  # this step's arm, to record
        # Adaptive: this step's (requests, non-draft tokens, drafting depth, context), for
        # the gate and a cost model that learn from whole steps, and for held-back upkeep.
        self._priced_step: tuple[int, int, int, int] | None = None
        self._overruled = False  # this step drafts although the cost model declined
        self._deferred: list[tuple[list, torch.Tensor]] = []  # held-back context updates
        # Held-back upkeep run in this step: (host ms, CUDA start and end events or None,
        # undrafted steps it caught up), read at the step's end (``_take_flush_cost``).
        self._flushes: list[tuple[float, tuple | None, int]] = []
        self._held_back = False  # this step's own upkeep was held back
        # What catching up one undrafted step's upkeep costs, in ms (a running average
        # over flushes): the price of an undrafted step that its own wall time lacks.
        self.upkeep_ms_per_step: float | None = None
        # Adaptive: (step it is for, slots, depth, probe depth, budget or None, the slots
        # as a list) decided ahead (the budget only when the next batch can be the same
        # decodes with a full K each), and a budget planned early for the step under way:
        # (step, drafts per request it assumed (a depth for every request, a [num_reqs]
        # array, or a list in decoding order), budget, where it came from: "ahead" (the
        # look-ahead), "drafting" (``_plan_while_drafting``), "shares" or "recut"
        # (``_shared_budget``)).
        self._ahead: tuple[int, np.ndarray, int, int, int | None, list[int]] | None = None
        self._planned: tuple[int, int | np.ndarray | list[int], int, str] | None = None
        # Adaptive: each request's share of the budget planned ahead, and the survival
        # that plan ranked (step it is for, depth, {slot: admitted drafts}, [n, K]
        # survival or None, {slot: its row}; ``EngineConfig.lookahead_shares``).
        self._shares: tuple[int, int, dict[int, int], np.ndarray | None, dict[int, int]] | None = (
            None
        )
        # Adaptive, ``calibrate_survival``: this step's decoding requests' confidences (as
        # the allocation saw them), and the last step's verified outcome waiting to be
        # learnt (confidences, admitted, accepted).
        self._round_rows: np.ndarray | None = None
        self._outcome: tuple[np.ndarray, list[int], list[int]] | None = None
        # Adaptive: a round whose recording waits for the forward (slots, confidences).
        self._unrecorded: tuple[np.ndarray, np.ndarray] | None = None
        # With the look-ahead: this step's proposal time for ``ObservedDraftCost.record``
        # (requests, ms, depth), learnt during the forward, off the step's host path.
        self._unrecorded_draft: tuple[int, float, int] | None = None
        # With the look-ahead: the last step's timing, for ``record_step`` in the next one.
        self._step_timing: tuple | None = None
        # Adaptive, look-ahead on: slots of an undrafted step whose ``relax`` waits for the
        # forward (``_relax_pending``), off the host's critical path.
        self._to_relax: np.ndarray | None = None
        self._slot_marks = np.zeros(config.max_num_seqs, dtype=bool)  # scratch, by slot
        self._step_index = 0
        # Seconds the owner held this engine idle between steps (``request_clock``).
        self.idle_s = 0.0
        self.key_rows = 0  # key rows the latest forward's attention gathered (``forward``)
        self.lookahead = False
        self.round_log: list[tuple[np.ndarray | None, int, int]] | None = None
        if config.spec is not SpecMode.NONE:
            self.drafter = drafter or self._build_drafter(config.drafter)
            if self.drafter.num_positions < config.num_drafts:
                off = (
                    "turn adaptive verification off with --spec fixed (or none)"
                    if config.spec is SpecMode.ADAPTIVE
                    else "turn speculation off with --spec none"
                )
                raise ValueError(
                    f"K={config.num_drafts} (--k, EngineConfig.num_drafts) exceeds the "
                    f"drafter's block of {self.drafter.num_positions}, so the drafter cannot "
                    f"propose that many per request: lower --k to at most "
                    f"{self.drafter.num_positions}, or {off}"
                )
            self.acceptance = OnlineAcceptance(config.num_drafts)
            block = config.draft_block
            if block == "auto":
                block = "cut"
            proposer = getattr(self.drafter, "inner", self.drafter)  # a replay's own drafter
            if hasattr(proposer, "block_cut"):
                proposer.block_cut = block == "cut"
            drafter_weights = getattr(proposer, "linear_weights", None)
            if self.device.type == "cpu" and drafter_weights is not None:
                if config.small_rows == "tune":  # the shapes it shares keep the target's plan
                    shared = {tuple(w.shape) for w in weights_of()} if weights_of else set()
                    tune_small_rows(drafter_weights(), keep_shapes=frozenset(shared))
                else:
                    forget_small_rows(drafter_weights())
        # Every padded-step runner (target, drafter, a replayed drafter's inner one): a
        # step that captured a graph in any of them is not timed.
        inner = getattr(self.drafter, "inner", None)
        runners = (
            self.graphs,
            getattr(self.drafter, "graphs", None),
            getattr(self.drafter, "context_graphs", None),
            getattr(self.drafter, "heads", None),
            getattr(inner, "graphs", None),
            getattr(inner, "context_graphs", None),
            getattr(inner, "heads", None),
        )
        self._runners = [runner for runner in runners if runner is not None]
        timed = config.graph_padding_budget == "auto"
        for runner in self._runners:
            runner.ledger.budget = CAPTURE_AFTER_WASTE if timed else config.graph_padding_budget
        # "auto": the target's budget follows its captures' and forwards' measured times.
        self._timed_padding = timed and self.graphs is not None and self.graphs.capture
        self._forward_ema_ms: float | None = None
        # Padding is computed only where a graph replays it: not on the CPU's padded steps.
        self._fills_padding = (
            config.fill_padding and self.graphs is not None and self.graphs.capture
        )
        self.allocate_on_device = config.allocation == "device"
        cheap_cuts = config.cheap_cuts
        if cheap_cuts == "auto":
            cheap_cuts = "on" if self.device.type == "cuda" else "off"
        # ``EngineConfig.cheap_cuts``: the cuts' host time (ms, the median of the latest
        # ``CUT_TIMES``; None until a cut is timed) and the cuts skipped since one was made.
        self._skips_cheap_cuts = cheap_cuts == "on"
        self._cut_ms: float | None = None
        self._cut_times: deque[float] = deque(maxlen=CUT_TIMES)
        self._cuts_skipped = 0
        settle = config.settle
        if settle == "auto":
            settle = "on" if self.device.type == "cuda" else "off"
        # ``EngineConfig.settle``: the latest decided drafting steps (depth, requests,
        # decoding requests, the cut's priced saving and the scheduling's host ms), the
        # settled depth and the drafting steps left to run at it; whether this step runs
        # at it, and its cut.
        self._settles = settle == "on"
        # ``EngineConfig.settle_depth="measured"``: per depth, its latest settled
        # stretches (``measured_settle_depth``), and the running stretch's tokens and ms.
        self._measures_settling = self._settles and config.settle_depth == "measured"
        self._stretches: dict[int, deque] = {}
        self._stretch = [0, 0.0]
        # ``EngineConfig.hold_draft_room``: whether steps may hold their draft room back,
        # the depth the latest decided step took (None: none decided yet), whether this
        # step holds it back and how many did in a row.
        self._holds_room = False
        self._last_depth: int | None = None
        self._room_held = False
        self._held_in_a_row = 0
        self._settle_log: deque[tuple] = deque(maxlen=SETTLE_WINDOW)
        self._settled_depth = 0
        self._settled_reqs = 0.0  # the window's median of decoding requests
        self._settled_left = 0
        self._step_decoding = 0  # decoding requests of this step
        self._coasting = False
        self._step_cut: tuple | None = None
        self._normalise_speed = False  # adaptive: ``EngineConfig.normalise_speed``
        if config.spec is SpecMode.ADAPTIVE:
            if cost_model is None:
                from dspark.engine.profiling import profile_engine

                profile = profile_engine(self, path=self.config.profile_path)
                fit = config.profile_fit
                cost_model = ObservedDraftCost(
                    profile.cost_tables(fit),
                    depth_ms=profile.depth_costs(fit),
                    num_positions=config.num_drafts,
                    overhead_fit=config.overhead_fit,
                    key_row_ms=profile.key_row_ms if config.context_rows else 0.0,
                    slope_memory=config.overhead_slope_memory,
                    slope_noise=config.overhead_slope_noise,
                )
            self.gate = (
                ThroughputGate(
                    alone_confidence=config.gate_alone_confidence,
                    alone_window=config.gate_alone_window,
                )
                if config.throughput_gate
                else None
            )
            self.ceiling = DepthCeiling(config.num_drafts) if config.depth_ceiling else None
            self.lookahead = config.lookahead == "on" or (
                config.lookahead == "auto" and self.device.type == "cuda"
            )
            self.verifier = AdaptiveVerifier(
                config.max_num_seqs,
                config.num_drafts,
                cost_model,
                max_total_logits=config.max_num_seqs * (config.num_drafts + 1),
            )
            self.verifier.depth_margin = config.depth_margin
            self.verifier.draft_margin = config.draft_margin
            self._holds_room = config.hold_draft_room == "on" or (
                config.hold_draft_room == "auto" and not self.lookahead
            )
            # Only this package's model takes the forward's time (``ObservedDraftCost``).
            self._normalise_speed = isinstance(cost_model, ObservedDraftCost) and (
                config.normalise_speed == "on"
                or (config.normalise_speed == "auto" and not self.lookahead)
            )

    # ---- requests -------------------------------------------------------------------

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """Queue a request. Raises ``PromptTooLongError`` (a ``ValueError``) if the prompt
        cannot fit the context, ``ValueError`` for a duplicate id or an empty prompt."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; the context holds {self.max_model_len} "
                "(prompt plus at least one generated token)"
            )
        generator = None
        if not params.is_greedy:
            generator = torch.Generator(device=self.device)
            seed = (
                params.seed
                if params.seed is not None
                else self.config.seed * 1_000_003 + next(self._seeds)
            )
            generator.manual_seed(seed)
        request = Request(request_id, ids, params, self.request_clock(), generator=generator)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str, error: str | None = None) -> None:
        """End a request now and free its cache and slot (``error``: it failed)."""
        request = self.requests.get(request_id)
        if request is not None and not request.is_finished:
            self._finish(request, FinishReason.ERROR if error else FinishReason.ABORT, error)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def _build_drafter(self, name: str) -> Drafter:
        from dspark.engine.drafter import DSparkDrafter, find_drafter
        from dspark.models.drafter import load_drafter

        if name == "ngram":
            return NgramDrafter(self.config.num_drafts)
        if name in ("auto", "dspark"):
            path = find_drafter(self.loaded.config, required=name == "dspark")
        else:
            path = name
        if path is None:
            return NgramDrafter(self.config.num_drafts)
        model = load_drafter(path, self.model)
        config = self.config
        reduced = config.draft_vocab == "on" or (
            config.draft_vocab == "auto" and self.device.type == "cpu"
        )
        return DSparkDrafter(
            model,
            drafter_rows(config, model.config.block_size),
            config.block_size,
            use_draft_vocab=reduced,
            graphs=(config.max_num_seqs, self.max_model_len) if self.padded_steps else None,
            head_graphs=config.head_graphs,
            regions=self.kv_regions,
        )

    def _on_admit(self, request: Request) -> None:
        if self.verifier is not None:
            self.verifier.add_request(request.slot)

    def _on_release(self, request: Request) -> None:
        if self.verifier is not None:
            self._relax_pending()  # it may hold this slot
            self.verifier.remove_request(request.slot)
        if self.drafter is not None:
            self.drafter.on_finished(request)

    # ---- one step -------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one engine step; returns the requests that got tokens or finished."""
        room = self.config.num_drafts if self.drafter is not None else 0
        self._room_held = bool(room) and self._holds_draft_room()
        chunks = self.scheduler.schedule(0 if self._room_held else room)
        if not chunks:
            return []
        self._held_in_a_row = self._held_in_a_row + 1 if self._room_held else 0
        self._step_index += 1
        phase = step_start = time.perf_counter()
        self._step_start_ms = step_start * 1e3
        generated, captures = self.stats.num_generated, self.num_captures()
        self._priced_step = None
        self._overruled = False
        self._ceiling_arm = None
        self._held_back = False
        self._unrecorded = None  # recorded in every forward; left only by a failed step
        self._unrecorded_draft = None
        self._round_rows = None
        self._step_depth, self._step_schedule_ms, self._step_graph_tokens = 0, 0.0, 0
        self._step_before_ms = self._step_propose_ms = 0.0
        self._step_before = (0.0, 0.0, 0.0, 0.0)  # shape, decide, plan, sync (ms)
        self._coasting = False
        self._step_cut = None
        covered = self.graphs.num_covered if self.graphs is not None else 0
        drafts, draft_probs = self._draft(chunks)
        draft_ms = (time.perf_counter() - phase) * 1e3
        self.stats.draft_phase_ms.append(draft_ms)
        tokens, num_cached, num_query = [], [], []
        for chunk, extra in zip(chunks, drafts, strict=True):
            request = chunk.request
            start = request.num_computed
            tokens += request.all_ids[start : start + chunk.num_tokens] + extra
            num_cached.append(start)
            num_query.append(chunk.num_tokens + len(extra))
        num_query_np = np.array(num_query)
        ends = np.cumsum(num_query_np)
        rows, owners = [], []
        for i, (chunk, extra) in enumerate(zip(chunks, drafts, strict=True)):
            if chunk.samples:
                count = len(extra) + 1
                rows.extend(range(ends[i] - count, ends[i]))
                owners.append((i, count))
        # The sampled rows' index goes to the device before the forward is queued, from
        # pinned memory: a copy out of pageable memory waits for the stream (the forward)
        # to drain first, which kept the host from queueing the logits behind it. Rows only
        # increase, so as many rows as tokens are every row (any step of decodes alone,
        # drafted or not, since a decode samples each of its rows; only a prompt chunk
        # leaves rows out): the logits then take the hidden states as they are, with no
        # index to copy and no gather (0.05-0.09 ms of host time a step at one request on
        # an H200's host, session 37's trace).
        every_row = len(rows) == int(ends[-1])
        row_index = self._to_device(rows) if rows and not every_row else None
        start_time = self._clock()
        padded = self.graphs.covered_tokens if self.graphs is not None else 0
        hidden, captured = self.forward(
            [c.request.table for c in chunks],
            np.array(num_cached),
            num_query_np,
            np.array(tokens, dtype=np.int64),
        )
        # The logits are queued before the look-ahead, so the device never waits on it.
        logits = None
        if rows:
            logits = self.model.logits(hidden if every_row else hidden[row_index])
        if (
            self.verifier is not None
            and self.lookahead
            and not (
                self._coasting and self._settled_left  # the next step is settled too
            )
        ):
            self._look_ahead(chunks, drafts)  # the host's turn while the device computes
        self.stats.forward_ms.append(self._clock() - start_time)
        if self.graphs is not None:  # tokens the forward ran on a larger graph than its own
            padded = self.graphs.covered_tokens - padded
        if self._timed_padding and self.num_captures() == captures:
            self._time_padding(self.stats.forward_ms[-1])
        features = torch.cat(captured, dim=-1) if captured else None
        row_starts = ends - num_query_np
        phase = time.perf_counter()
        touched = self._apply(chunks, drafts, draft_probs, logits, owners, row_starts, features)
        end = time.perf_counter()
        apply_ms = (end - phase) * 1e3
        self.stats.apply_ms.append(apply_ms)
        if not self.scheduler.running:
            self._deferred.clear()  # held-back updates of requests that all finished
            self._unsettle()  # what comes next is weighed afresh
        # A step that captured a graph is not a typical step of its kind: not timed. The
        # gate times steps with a prompt chunk in buckets of their own (the chunk makes a
        # step slow whichever way it drafted); the cost model learns from decoding steps.
        # Held-back upkeep is the undrafted steps' debt, paid by whichever step flushes it:
        # it leaves that step's time, and the gate and the cost model price every
        # undrafted step that held its upkeep back at what catching one up costs on
        # average (a smooth charge: the whole flush on one step would widen the undrafted
        # arm's bound as much as it lowers its rate). A drafted step's own upkeep is in
        # its time; before session 46 the cost model read undrafted steps without theirs,
        # so not drafting looked cheaper than it was (SmolLM2 at 16 requests on the
        # 2-core CPU: 2.0-3.3 ms an undrafted step, of steps of 130-141 ms, about what
        # drafting gains there).
        flush_ms = self._take_flush_cost()
        num_reqs, num_tokens, depth, context = self._priced_step or (0, -1, 0, 0)
        captured = self.num_captures() != captures
        num_drafts = sum(len(extra) for extra in drafts)  # verified this step
        if self._coasting and self._measures_settling and not captured:
            # A settled step is not priced (no ``_priced_step``): timed here, for its
            # stretch (``EngineConfig.settle_depth``).
            self._stretch[0] += self.stats.num_generated - generated
            self._stretch[1] += max((end - step_start) * 1e3 - flush_ms, 1e-3)
        if self._settles and self._priced_step is not None:
            self._weigh_settling(depth)
        if num_tokens >= num_reqs > 0 and not captured:
            wall_ms = max((end - step_start) * 1e3 - flush_ms, 1e-3)
            debt = 0.0  # its share of a catch-up when it held its upkeep back
            if self._held_back and self.upkeep_ms_per_step is not None:
                debt = self.upkeep_ms_per_step
            mixed = num_tokens != num_reqs
            tokens = self.stats.num_generated - generated
            if self.gate is not None:
                gate_ms = wall_ms + debt
                self.gate.record(num_reqs, depth > 0, tokens, gate_ms, mixed, self._overruled)
            if self._ceiling_arm is not None:
                self.ceiling.record(self._ceiling_arm, tokens, wall_ms)
            record_step = getattr(self.verifier.cost_model, "record_step", None)
            if record_step is not None and not mixed:
                priced_ms = wall_ms + debt if self.config.upkeep_in_price else wall_ms
                timing = (
                    num_reqs,
                    num_tokens,
                    num_drafts,
                    depth,
                    priced_ms,
                    context,
                    self.key_rows,
                )
                # With ``normalise_speed``, the forward's time too (the step's time scale).
                forward_ms = self.stats.forward_ms[-1] if self._normalise_speed else None
                if self.lookahead:  # learnt while the next step's forward runs
                    self._step_timing = (timing, forward_ms, padded)
                else:
                    self._record_step(timing, forward_ms, padded)
        self.stats.capture_steps += captured
        self.stats.step_log.append(
            (
                (time.perf_counter() - step_start) * 1e3,
                flush_ms,
                draft_ms,
                self.stats.forward_ms[-1],
                apply_ms,
                self._step_schedule_ms,
                self._step_before_ms,
                *self._step_before,
                self._step_propose_ms,
                len(chunks),
                int(ends[-1]) - num_drafts - len(chunks),
                int(ends[-1]),
                self._step_depth,
                num_drafts,
                self.stats.num_generated - generated,
                self._step_graph_tokens,
                int(self.graphs is not None and self.graphs.num_covered != covered),
                int(captured),
                int(self._coasting),
            )
        )
        return touched

    def _time_padding(self, forward_ms: float) -> None:
        """``graph_padding_budget="auto"``: the target's capture ledger waits for as many
        steps' worth of padding as one of its captures takes in forwards: the mean of all
        its captures so far (start-up profiling's included, and the first one's warm-up
        pass, which raise it early on) over a moving average of every forward of a step
        that captured nothing (prompt chunks and eager steps included)."""
        average = self._forward_ema_ms
        average = forward_ms if average is None else 0.8 * average + 0.2 * forward_ms
        self._forward_ema_ms = average
        runner = self.graphs
        if runner.num_captures and average > 0.0:
            capture_ms = runner.capture_seconds * 1e3 / runner.num_captures
            runner.ledger.budget = timed_padding_budget(capture_ms, average)

    def _record_step(self, timing: tuple, forward_ms: float | None, padded: int = 0) -> None:
        """A decoding step's timing for the cost model (``ObservedDraftCost.record_step``),
        with its forward's time when the engine normalises speed, the tokens its forward
        ran beyond its own captured size when a larger graph covered it and the key rows
        its attention gathered when the model prices them (only that model takes them)."""
        *timing, key_rows = timing  # the key rows its attention gathered, last
        extra = {}
        if forward_ms is not None:
            extra["forward_ms"] = forward_ms
        if padded:
            extra["padded_tokens"] = padded
        model = self.verifier.cost_model
        if getattr(model, "key_row_ms", 0.0):
            extra["key_rows"] = key_rows
        model.record_step(*timing, **extra)

    def _to_device(self, values: list[int]) -> torch.Tensor:
        """An int64 index on the engine's device without waiting for the device's queue."""
        if self.device.type != "cuda":
            return torch.tensor(values, dtype=torch.int64)
        host = torch.tensor(values, dtype=torch.int64, pin_memory=True)
        return host.to(self.device, non_blocking=True)  # the host allocator keeps it alive

    def forward(
        self,
        tables: list[BlockTable],
        num_cached: np.ndarray,
        num_query: np.ndarray,
        tokens: np.ndarray,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The target over one packed step: final hidden states ``[T, hidden]`` and the
        drafter's captured layers. A padded (graph) step when its shape is captured or
        capturable, else eager; the outputs of a graph are its own buffers, valid until
        the next forward."""
        shape = None if self.graphs is None else self.graphs.shape_for(num_cached, num_query)
        if shape is not None:
            covered = self.graphs.covered_tokens
            outputs = self.graphs.run(tables, num_cached, num_query, tokens, shape=shape)
            # The shape replayed: its own, or the larger one the ledger covered it with.
            self._step_graph_tokens = shape.num_tokens + self.graphs.covered_tokens - covered
            self.key_rows = self.graphs.key_rows
            return outputs[0], outputs[1:]
        self.key_rows = len(num_query) * int((num_cached + num_query).max())
        batch = self.cache.attention_batch(tables, num_cached, num_query)
        positions = np.concatenate(
            [np.arange(c, c + q) for c, q in zip(num_cached, num_query, strict=True)]
        )
        return self.model(
            torch.from_numpy(tokens).to(self.device),
            torch.from_numpy(positions).to(self.device),
            batch,
            self.cache.layers,
            capture_layers=getattr(self.drafter, "capture_layers", ()),
        )

    def _graph_body(self, ids: torch.Tensor, positions: torch.Tensor, batch) -> list:
        hidden, captured = self.model(
            ids,
            positions,
            batch,
            self.cache.layers,
            capture_layers=getattr(self.drafter, "capture_layers", ()),
        )
        return [hidden, *captured]

    def padded_runners(self) -> list:
        """Every padded-step runner of this engine (target, drafter, context updates)."""
        return list(self._runners)

    @property
    def settled_depth(self) -> int:
        """``EngineConfig.settle``: the depth drafting steps draft undecided now; 0 while
        the engine decides every step."""
        return self._settled_depth if self._settled_left else 0

    def num_captures(self) -> int:
        """CUDA graphs captured so far by every padded-step runner (target and drafter)."""
        return sum(runner.num_captures for runner in self._runners)

    def capture_seconds(self) -> float:
        """Host seconds spent capturing those graphs (the device waiting on the host)."""
        return sum(runner.capture_seconds for runner in self._runners)

    def _draft(self, chunks: list[ScheduledChunk]) -> tuple[list[list[int]], list]:
        drafts: list[list[int]] = [[] for _ in chunks]
        probs: list[torch.Tensor | None] = [None] * len(chunks)
        self._round_confidences: dict[int, np.ndarray] = {}
        if self.drafter is None:
            return drafts, probs
        decode_index = [i for i, c in enumerate(chunks) if c.is_decode]
        if not decode_index:
            return drafts, probs
        self._step_decoding = len(decode_index)
        if self._room_held:  # no draft room this step (``hold_draft_room``): undecided
            self.stats.held_steps += 1
            return drafts, probs
        limit_list = [self._draft_limit(chunks[i]) for i in decode_index]
        limits = np.array(limit_list)
        batch = None
        shaped = decided = 0.0
        if self._settled_left and not self._stays_settled(len(decode_index)):
            self._unsettle()  # the batch left the size the window was weighed at
        if self.verifier is not None and self._settled_left:
            # Settled (``EngineConfig.settle``): this step drafts the settled depth and
            # verifies every draft, undecided, as a fixed K does.
            limits = np.minimum(limits, self._settled_depth)
            if not limits.any():  # every request at its length limit: nothing to draft
                return drafts, probs
            self._settled_left -= 1
            self._coasting = True
            self.stats.settled_steps += 1
        elif self.verifier is not None:
            begin = time.perf_counter()
            batch = self._batch_shape(chunks, decode_index)
            shaped = time.perf_counter()
            depth = self._drafting_depth(batch, limits, min(limit_list))
            decided = time.perf_counter()
            shaped, decided = shaped - begin, decided - shaped
            if depth == 0:
                self.stats.undrafted_steps += 1
                self._step_before_ms = time.perf_counter() * 1e3 - self._step_start_ms
                self._step_before = (shaped * 1e3, decided * 1e3, 0.0, 0.0)
                return drafts, probs
            limits = np.minimum(limits, depth)
        self._step_depth = int(limits.max())
        self._timed_flush()  # the drafter's context must be complete before it drafts
        captures = self.num_captures()
        requests = [chunks[i].request for i in decode_index]
        begin = time.perf_counter()
        overlap = None if batch is None else self._plan_while_drafting(batch, limits)
        planned = time.perf_counter()
        start = self._clock()
        self._step_before_ms = start - self._step_start_ms
        self._step_before = (
            shaped * 1e3,
            decided * 1e3,
            (planned - begin) * 1e3,
            start - planned * 1e3,
        )
        if overlap is None:
            proposal: Proposal = self.drafter.propose(requests, limits)
        else:
            proposal = self.drafter.propose(requests, limits, while_drafting=overlap)
        drafter_ms = self._clock() - start
        self._step_propose_ms = drafter_ms
        self.stats.drafter_ms.append(drafter_ms)
        # The last settled step hands over what a decided one would (``settle``).
        last_settled = self._coasting and not self._settled_left
        cost_model = self.verifier.cost_model if batch is not None or last_settled else None
        # A proposal that captured a graph is no measure of drafting's price.
        depth = int(limits.max())
        if (
            isinstance(cost_model, ObservedDraftCost)
            and depth > 0
            and self.num_captures() == captures
        ):
            if self.lookahead:  # learnt while the forward runs (``_look_ahead``)
                self._unrecorded_draft = (len(chunks), drafter_ms, depth)
            else:
                cost_model.record(len(chunks), drafter_ms, depth)
        for row, (i, proposed, limit) in enumerate(
            zip(decode_index, proposal.tokens, limits, strict=True)
        ):
            drafts[i] = list(proposed[:limit])
            probs[i] = proposal.draft_probs[row]
            if self.round_log is not None and proposal.confidences is not None:
                self._round_confidences[i] = np.array(proposal.confidences[row])
        if batch is not None:
            self._admit_adaptively(batch, drafts, proposal)
        elif last_settled:
            self._record_settled_round(chunks, decode_index, drafts, proposal)
        return drafts, probs

    def _record_settled_round(
        self,
        chunks: list[ScheduledChunk],
        decode_index: list[int],
        drafts: list[list[int]],
        proposal: Proposal,
    ) -> None:
        """``EngineConfig.settle``: the last settled step before one decides again hands
        the verifier its round (and its outcome, ``_learn_outcome``), as a decided step
        would (its proposal's time goes to the cost model in ``_draft``), so that the
        decision reads this round's confidences, not the ones from before the stretch
        (where requests that joined during it would read as never drafted)."""
        confidences = proposal.confidences
        if confidences is None:
            confidences = self.acceptance.confidences(len(decode_index))
        rows = np.asarray(confidences)[:, : self.config.num_drafts]
        self._round_rows = rows
        slots = np.array([chunks[i].request.slot for i in decode_index], dtype=np.int64)
        self._hand_round(slots, rows, [len(drafts[i]) for i in decode_index])

    def _hand_round(self, slots: np.ndarray, rows: np.ndarray, counts: list[int]) -> None:
        """Record a drafted round (decoding requests' ``slots``, their confidence ``rows``,
        drafts each) for the verifier. Only requests with drafts have confidences to
        record (one at its length limit, or not yet ready to draft, proposed none: no
        round of its own). With the look-ahead the record (its bookkeeping is most of the
        allocation's host time) waits for it, while the device computes the forward."""
        if all(counts):  # the usual case: no copies to select the drafted rows
            round_ = (slots, rows)
        elif any(counts):
            drafted = np.array(counts) > 0
            round_ = (slots[drafted], rows[drafted])
        else:
            return
        if self.lookahead:
            self._unrecorded = round_
        else:
            self.verifier.record(*round_)

    def _holds_draft_room(self) -> bool:
        """``EngineConfig.hold_draft_room``: whether this step schedules no draft room: the
        latest decided step drafted nothing, no settled stretch is running, a prompt can use
        the budget this step, and fewer than ``HOLD_LIMIT`` steps in a row held it back."""
        return (
            self._holds_room
            and self._last_depth == 0
            and not self._settled_left
            and self._held_in_a_row < HOLD_LIMIT
            and self.scheduler.has_prompt_work()
        )

    def _stays_settled(self, num_decoding: int) -> bool:
        """``EngineConfig.settle``: whether a settled stretch goes on for a step with
        ``num_decoding`` decoding requests: within half to twice the window's median
        (a stretch weighed on one request must not carry a batch of 256)."""
        return self._settled_reqs / 2 <= num_decoding <= 2 * self._settled_reqs

    def _unsettle(self) -> None:
        """``EngineConfig.settle``: end a settled stretch and forget the window (it was
        weighed for a batch that is gone, or decided not to draft)."""
        if self._measures_settling:
            self._close_stretch()
        self._settled_left = 0
        self._settle_log.clear()

    def _close_stretch(self) -> None:
        """``EngineConfig.settle_depth="measured"``: keep the settled stretch that ran
        last (its timed steps' tokens and ms), under its depth and the batch size it was
        weighed at."""
        tokens, ms = self._stretch
        if ms > 0.0:
            kept = self._stretches.setdefault(self._settled_depth, deque(maxlen=SETTLE_RECORDS))
            kept.append((self._settled_reqs, tokens, ms))
        self._stretch = [0, 0.0]

    def _plan_while_drafting(self, batch: _Batch, limits: np.ndarray):
        """Adaptive, on a device: the step's budget, while the drafter's passes run
        (``Drafter``'s ``while_drafting``) when the look-ahead did not plan it: its shares
        or its ranking recut (``_shared_budget``) where they cover the batch, else planned
        (session 41: gathering the shares before the passes were queued took 0.03-0.07 ms
        a step on the H200's host at 64 requests, on the step's critical path). The plan
        reads only recorded rounds (``AdaptiveVerifier.plan(..., ahead=True)``, as
        ``_admit_adaptively`` would), for each decoding request drafting its limit;
        ``_admit_adaptively`` takes it when the proposal holds exactly those drafts, and
        plans again otherwise. Against planning after the proposal, the cost model lacks
        only this proposal's time (``ObservedDraftCost.record``), as a plan ahead does.
        Its host time falls inside the proposal's measured time, hidden while the device
        drafts for longer."""
        planned = self._planned
        if (
            not self.lookahead
            or not getattr(self.drafter, "runs_host_work_while_drafting", False)
            or (planned is not None and planned[0] == self._step_index)
        ):
            return None
        limit_list = limits.tolist()
        step = self._step_index

        def plan() -> None:
            # The look-ahead's shares or its ranking recut (``_shared_budget``) when they
            # cover the batch, else a plan of the step's own; gathered here too, not
            # before the passes are queued.
            start = time.perf_counter()
            shared = self._shared_budget(batch, limit_list)
            if shared is not None:
                self._planned = (step, limit_list, *shared)
            else:
                num_drafts = np.zeros(batch.slots.shape[0], dtype=np.int64)
                num_drafts[batch.decode_index] = limits
                budget = self._plan_budget(batch, num_drafts)
                self._planned = (step, num_drafts, budget, "drafting")
            self.stats.lookahead_ms.append((time.perf_counter() - start) * 1e3)

        return plan

    def _shared_budget(self, batch: _Batch, counts: list[int]) -> tuple[int, str] | None:
        """The budget the look-ahead's plan gives this step without planning it, and how
        (``EngineConfig.lookahead_shares``), or None when that plan does not cover the
        step: planned for another step or depth, or a decoding request was not planned
        for. A step of decodes alone takes the sum of its decoding requests' shares, each
        at most its ``counts`` (drafts, in decoding order; "shares"), as does, with "all",
        a step that carries a prompt chunk; with "decode" such a step takes the plan's
        ranking of its decoding requests cut again at its own prices ("recut",
        ``AdaptiveVerifier.recut``): the chunk's tokens move the step along the captured
        sizes."""
        shares = self._shares
        if shares is None or shares[0] != self._step_index or not counts:
            return None
        priced = self._priced_step  # (num_reqs, num_tokens, depth, context)
        if priced is None or priced[2] != shares[1]:
            return None
        _, depth, of_slot, survival, row_of = shares
        slot_list = batch.slot_list
        if priced[1] != priced[0] and self.config.lookahead_shares == "decode":
            if survival is None:
                return None
            rows = [row_of.get(slot_list[i]) for i in batch.decode_list]
            if None in rows:
                return None
            picked = survival[rows]  # a copy, in decoding order
            if min(counts) < depth:  # a request near its length limit drafted fewer
                picked *= np.arange(picked.shape[1]) < np.array(counts)[:, None]
            budget = self.verifier.recut(
                picked,
                num_drafts=sum(counts),
                num_reqs=priced[0],
                num_tokens=priced[1],
                num_sampling=batch.num_sampling,
                depth=max(counts),
                context_tokens=batch.context,
            )
            return budget, "recut"
        budget = 0
        for i, count in zip(batch.decode_list, counts, strict=True):
            share = of_slot.get(slot_list[i])
            if share is None:
                return None
            budget += min(share, count)
        # Within what the logits buffer leaves room for (a prompt chunk that joined adds a
        # sampling request), as any plan is (``draft_cap``).
        verifier = self.verifier
        room = verifier.max_total_logits - len(slot_list) * verifier.num_bonus_tokens
        return max(0, min(budget, room)), "shares"

    def _plan_budget(self, batch: _Batch, num_drafts: np.ndarray) -> int:
        """The step's budget before its round is recorded, from what that record turns
        stale (``plan(..., ahead=True)``: the same budget as recording first)."""
        return self.verifier.plan(
            batch.slots,
            num_drafts,
            batch.non_draft,
            batch.num_sampling,
            batch.context,
            ahead=True,
        )

    def _tokens_left(self, request: Request) -> int:
        """Tokens the request may still emit (its max_tokens, the model's length)."""
        return min(
            request.params.max_tokens - len(request.output_ids),
            self.max_model_len - request.num_tokens,
        )

    def _draft_limit(self, chunk: ScheduledChunk) -> int:
        left = self._tokens_left(chunk.request)
        return max(0, min(self.config.num_drafts, chunk.draft_room, left - 1))

    def _batch_shape(self, chunks: list[ScheduledChunk], decode_index: list[int]) -> _Batch:
        start = time.perf_counter()
        slots, non_draft = [], []
        num_sampling = context = 0
        for chunk in chunks:  # one pass: this runs on the host's critical path every step
            request = chunk.request
            slots.append(request.slot)
            count = chunk.num_tokens
            non_draft.append(count)
            computed = request.num_computed
            # ``chunk.samples`` spelt out: its properties' calls were half this loop's time
            num_sampling += computed + count == len(request.prompt_ids) + len(request.output_ids)
            context += computed
        batch = _Batch(
            slots=np.array(slots, dtype=np.int64),
            decode_index=np.array(decode_index, dtype=np.int64),
            non_draft=np.array(non_draft, dtype=np.int64),
            num_sampling=num_sampling,
            context=context,
            slot_list=slots,
            decode_list=decode_index,
            num_tokens=sum(non_draft),
            chunks=chunks,
        )
        batch.host_ms = (time.perf_counter() - start) * 1e3
        return batch

    def _drafting_depth(self, batch: _Batch, limits: np.ndarray, min_limit: int) -> int:
        """Adaptive: how deep to draft; 0 when even the best plan from the latest recorded
        confidences would not pay for the drafter (``AdaptiveVerifier.drafting_pays``);
        then the requests are relaxed (nothing is recorded for them this step, so they
        are retried as the population's confidences suggest, never given up for good)."""
        start = time.perf_counter()
        self._relax_pending()  # left by a step that failed before its forward
        num_reqs = batch.slots.shape[0]
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] != self._step_index:
            ahead = None  # decided for a step that never ran (a failed one)
        if (
            ahead is not None
            and ahead[4] is not None
            and batch.num_sampling == num_reqs == len(batch.decode_list)
            and ahead[5] == batch.slot_list
            # Decided for limits of K: the same answer for any limits that leave room for
            # the best drafted plan's depth (``_look_ahead``).
            and min_limit >= ahead[3]
        ):
            depth, self.verifier.probe_depth = ahead[2], ahead[3]
            self.stats.lookahead_hits += 1
            if depth:
                self._planned = (self._step_index, depth, ahead[4], "ahead")
        elif ahead is not None and self._reuses(ahead[1], batch.slots[batch.decode_index]):
            depth, self.verifier.probe_depth = ahead[2], ahead[3]
            self.stats.lookahead_reused += 1
        else:
            num_drafts = np.zeros(num_reqs, dtype=np.int64)
            num_drafts[batch.decode_index] = limits
            depth = self.verifier.drafting_pays(
                batch.slots, num_drafts, batch.non_draft, batch.num_sampling, batch.context
            )
        num_tokens = batch.num_tokens
        mixed = num_tokens != num_reqs  # a prompt chunk shares the step
        if depth and self.gate is not None and not self.gate.should_draft(num_reqs, mixed):
            depth = 0  # measured: undrafted steps emit more tokens per ms at this size
            self.stats.gate_vetoes += 1
        elif not depth and self.gate is not None and self.gate.should_probe(num_reqs, mixed):
            depth = self.verifier.probe_depth  # keep the price of drafting measured
            self.stats.probes += bool(depth)
            self._overruled = bool(depth)
        if depth and self.ceiling is not None and not mixed and not self._overruled:
            # Measured: how deep this batch size's steps pay to draft. A budget planned
            # ahead for the deeper depth would not match the drafts (``_admit_adaptively``
            # plans again then); dropped now, the step's own plan runs while the drafter
            # does (``_plan_while_drafting``).
            # (as deep as the step can draft: requests near their length limit draft less)
            deepest = min(depth, int(limits.max()))
            if deepest > 0:
                capped, self._ceiling_arm = self.ceiling.decide(num_reqs, deepest)
                if capped < deepest:
                    depth = capped
                    self.stats.ceiling_cuts += 1
                    planned = self._planned
                    if planned is not None and planned[0] == self._step_index:
                        self._planned = None
        self.stats.depth_steps[depth] += 1
        self._priced_step = (num_reqs, num_tokens, depth, batch.context)
        self._last_depth = depth
        if depth == 0:
            self._to_relax = batch.slots[batch.decode_index]
            if not self.lookahead:
                self._relax_pending()
        self.stats.schedule_ms.append((time.perf_counter() - start) * 1e3 + batch.host_ms)
        return depth

    def _look_ahead(self, chunks: list[ScheduledChunk], drafts: list[list[int]]) -> None:
        """Adaptive, while the device runs this step's forward: the next step's drafting
        depth for the requests that decode then (this step's decodes, and prompts whose
        last chunk runs now), each decoding with a full K (``drafting_pays`` on what is
        recorded now). It reads rounds already recorded
        (this step's among them), never the next step's drafts, which do not exist yet:
        as lossless as deciding at the next step.

        When the next batch can be exactly these decodes (no prompt left unfinished now),
        ``_drafting_depth`` takes it as that step's own decision if the batch is indeed
        that and every draft limit leaves room for the best drafted plan's depth
        (``probe_depth``; a request near its length limit has a lower limit next step, by
        how much depends on what this step accepts): a limit below K only removes plans
        deeper than itself, so the best plan, and whether it beats not drafting, are the
        ones the step's own limits give (up to rounding in the prices). Against deciding
        then it lacks only this step's timing (the
        cost model learns it during the next forward) and this step's accepted drafts in the
        context count it passes (no shipped cost model reads the context). It then also
        plans that step's budget (``AdaptiveVerifier.plan(..., ahead=True)``: from the
        rounds recorded now, which the next round turns stale), so a step that drafts as
        decided only allocates before its forward; its round is recorded here, at the
        start of the next look-ahead, while its forward runs. The plan is the step's own
        exactly when the cost model learns nothing in between (``ObservedDraftCost`` learns
        from each proposal's time: the plan ahead misses one such update). Otherwise the
        depth alone is kept, for a changed batch to take (``EngineConfig.lookahead_reuse``)."""
        start = time.perf_counter()
        if self._step_timing is not None:  # the last step's wall time, for the cost model
            self._record_step(*self._step_timing)
            self._step_timing = None
        self._relax_pending()  # this step's, should it not draft
        self._shares = None
        if self._unrecorded_draft is not None:  # what this step's proposal took
            self.verifier.cost_model.record(*self._unrecorded_draft)
            self._unrecorded_draft = None
        if self._unrecorded is not None:  # the round this step drafted, recorded late
            self.verifier.record(*self._unrecorded)
            self._unrecorded = None
        if self._outcome is not None:  # how the last step's drafts fared
            self.verifier.record_outcomes(*self._outcome)
            self._outcome = None
        k = self.config.num_drafts
        # The requests that decode next step unless they finish: this step's decodes and
        # the prompts whose last chunk runs now (they sample their first token). When
        # that is every request of this step, the next batch can be exactly these
        # decodes, and the decision (and the budget planned for it) is that step's own if
        # its limits leave room for the depth. (Under load a prompt joins every few
        # steps; counting only this step's decodes left the step after each prompt to
        # plan its budget while the drafter ran, which a launch-bound target does not
        # hide.)
        decoding = [c for c in chunks if c.samples]
        exact = len(decoding) == len(chunks)
        if not decoding or not (exact or self.config.lookahead_reuse is not None):
            self.stats.lookahead_ms.append((time.perf_counter() - start) * 1e3)
            return
        num_reqs = len(decoding)
        slot_list = [c.request.slot for c in decoding]
        slots = np.array(slot_list, dtype=np.int64)
        # Their context next step (a decode adds its token; accepted drafts are not known).
        context = sum(c.request.num_computed + c.num_tokens for c in decoding)
        ones = np.ones(num_reqs, dtype=np.int64)
        verifier = self.verifier
        depth = verifier.drafting_pays(slots, ones * k, ones, num_reqs, context)
        probe_depth = verifier.probe_depth
        # The budget of that step, should it draft that deep (the gate may still say no):
        # planned from the rounds recorded now, which its own round turns stale.
        budget = None
        if depth and self.config.lookahead_shares != "off":
            # With each request's share, for a next batch of fewer of them, or (with
            # "all") with a prompt chunk besides (``_shared_budget``).
            budget, shares, ranked = verifier.plan_ranking(
                slots, ones * depth, ones, num_reqs, context
            )
            of_slot = dict(zip(slot_list, shares.tolist(), strict=True))
            row_of = dict(zip(slot_list, range(num_reqs), strict=True))
            self._shares = (self._step_index + 1, depth, of_slot, ranked, row_of)
            if not exact:
                budget = None
        elif exact:
            budget = (
                verifier.plan(slots, ones * depth, ones, num_reqs, context, ahead=True)
                if depth
                else 0
            )
        self._ahead = (self._step_index + 1, slots, depth, probe_depth, budget, slot_list)
        self.stats.lookahead_ms.append((time.perf_counter() - start) * 1e3)

    def _reuses(self, ahead_slots: np.ndarray, decoding: np.ndarray) -> bool:
        """Whether a batch whose decoding requests sit in slots ``decoding`` takes the
        depth decided ahead for ``ahead_slots`` (``EngineConfig.lookahead_reuse``)."""
        share = self.config.lookahead_reuse
        if share is None or decoding.shape[0] == 0:
            return False
        marks = self._slot_marks  # all False between calls; cheaper than np.isin, which sorts
        marks[ahead_slots] = True
        known = np.count_nonzero(marks[decoding])
        marks[ahead_slots] = False
        return known >= share * decoding.shape[0]

    def _relax_pending(self) -> None:
        """``AdaptiveVerifier.relax`` the slots an undrafted step left (``_drafting_depth``).
        With the look-ahead on it runs at the start of ``_look_ahead``, while the device
        computes, and nothing reads or writes the verifier in between: the same state as
        relaxing at once, one step's host work lighter."""
        if self._to_relax is not None:
            slots, self._to_relax = self._to_relax, None
            self.verifier.relax(slots)

    def _admit_adaptively(self, batch: _Batch, drafts: list[list[int]], proposal: Proposal) -> None:
        """Stale budget, fresh allocation (``dspark.scheduling.verifier``). The usual step
        (every decoding request drafted as planned, the budget admitting them all) checks
        and counts on Python lists, with no NumPy reduction: per-step host time on the
        critical path, between proposal and forward."""
        start = time.perf_counter()
        k = self.config.num_drafts
        decode_index = batch.decode_index
        decoding = batch.decode_list
        confidences = proposal.confidences
        if confidences is None:
            confidences = self.acceptance.confidences(len(decoding))
        counts = [len(drafts[i]) for i in decoding]  # drafts per decoding request
        total = sum(counts)
        rows = np.asarray(confidences)[:, :k]
        self._round_rows = rows
        planned, self._planned = self._planned, None
        ahead = planned is not None and planned[0] == self._step_index
        if ahead:  # the drafts the plan assumed (none for requests not decoding)?
            assumed = planned[1]
            if isinstance(assumed, list):  # drafts per decoding request
                ahead = assumed == counts
            elif isinstance(assumed, np.ndarray):
                ahead = assumed[decode_index].tolist() == counts and (int(assumed.sum()) == total)
            else:  # one depth for every request of the batch
                ahead = len(counts) == len(batch.slot_list) and all(
                    count == assumed for count in counts
                )
        if ahead:
            # Planned during the last forward or while the drafter ran, from the rounds
            # recorded then, which this round turns stale (or those rounds' shares).
            budget, source = planned[2], planned[3]
            if source == "ahead":
                self.stats.lookahead_plans += 1
            elif source == "drafting":
                self.stats.drafting_plans += 1
            elif source == "recut":
                self.stats.recut_plans += 1
            else:
                self.stats.share_plans += 1
        else:
            shared = self._shared_budget(batch, counts)
            if shared is None:
                num_drafts = np.zeros(batch.slots.shape[0], dtype=np.int64)
                num_drafts[decode_index] = counts
                budget = self._plan_budget(batch, num_drafts)
            else:
                budget, source = shared
                if source == "recut":
                    self.stats.recut_plans += 1
                else:
                    self.stats.share_plans += 1
        self._hand_round(batch.slots[decode_index], rows, counts)
        if (
            0 < budget < total
            and self._skips_cheap_cuts
            and self._cut_is_dear(batch, budget, total)
        ):
            budget = total
            self.stats.cheap_cuts += 1
        cut_start = time.perf_counter()
        if budget < total and self._fills_padding:
            budget = self._filled_budget(batch, counts, budget, total)
        self.stats.budgets.append(budget)
        if budget < total:  # else every draft is admitted: nothing to cut
            if self._settles:  # priced at the step's end (``_weigh_settling``)
                self._step_cut = (
                    len(batch.slot_list),
                    batch.num_tokens,
                    batch.context,
                    budget,
                    total,
                )
            self.stats.budget_cuts += 1
            if budget <= 0:
                admitted = [0] * len(counts)
            elif proposal.device_confidences is not None and self.allocate_on_device:
                # Only decoding requests have drafts; the others would admit nothing
                # anyway, and dropping them keeps the batch order, so ties resolve alike.
                on_device = torch.tensor(counts, dtype=torch.int64).to(self.device)
                chosen = allocate_drafts_torch(
                    proposal.device_confidences[:, :k], on_device, budget
                )
                admitted = chosen.tolist()  # the packed batch is built here
            else:  # ``AdaptiveVerifier.allocate`` on this round, before it is recorded
                # Positions no request drafted never win: ranked without them.
                deepest = max(counts)
                admitted = allocate_drafts(rows[:, :deepest], np.array(counts), budget).tolist()
            for i, count in zip(decoding, admitted, strict=True):
                del drafts[i][count:]
            if budget > 0 and self._skips_cheap_cuts:
                self._record_cut((time.perf_counter() - cut_start) * 1e3)
        self._step_schedule_ms = (time.perf_counter() - start) * 1e3
        self.stats.schedule_ms.append(self._step_schedule_ms)

    def _record_cut(self, cut_ms: float) -> None:
        """``EngineConfig.cheap_cuts``: a cut made took ``cut_ms`` of host time. The price
        is the median of the latest ``CUT_TIMES``: one slow cut (a collection, the process
        descheduled) must not price cutting out for long, as cuts are timed only one in
        ``CUT_RETIME + 1`` while they are being skipped."""
        self._cut_times.append(cut_ms)
        self._cut_ms = statistics.median(self._cut_times)
        self._cuts_skipped = 0

    def _cut_is_dear(self, batch: _Batch, budget: int, total: int) -> bool:
        """``EngineConfig.cheap_cuts``: whether the cost model prices verifying the drafts
        a cut to ``budget`` would drop below what cuts take on the host (measured). Every
        ``CUT_RETIME``-th such cut is made anyway, so that their time stays measured."""
        if self._cut_ms is None:
            return False
        if self._cuts_skipped >= CUT_RETIME:
            self._cuts_skipped = 0
            return False
        cut = (len(batch.slot_list), batch.num_tokens, batch.context, budget, total)
        if self._cut_saving_ms(cut) >= self._cut_ms:
            return False
        self._cuts_skipped += 1
        return True

    def _cut_saving_ms(self, cut: tuple[int, int, int, int, int]) -> float:
        """The forward time the cost model prices a cut to ``budget`` of ``total`` drafts
        to save (``cut``: requests, non-draft tokens, context, budget, total); infinite
        beyond its tables (not priced: the cut is taken to matter). The drafter's share
        of a step does not depend on the budget: the target's forward alone prices the
        difference (``ObservedDraftCost.base``)."""
        num_reqs, num_tokens, context, budget, total = cut
        model = self.verifier.cost_model
        model = getattr(model, "base", model)
        try:
            costs = model.step_costs_ms(num_reqs, num_tokens, total, context)
        except ValueError:
            return math.inf
        return float(costs[total] - costs[max(budget, 0)])

    def _weigh_settling(self, depth: int) -> None:
        """``EngineConfig.settle``, at the end of a decided step: log it and settle when
        the last ``SETTLE_WINDOW`` decided steps all drafted and what deciding buys is
        priced below what it costs on the host. Cost: a step's scheduling (the batch's
        shape, the decision, the budget and the cut), measured, at the window's median.
        Bought, at the cost model's prices (``_cut_saving_ms``, ``draft_cost_ms``): the
        forward time the window's cuts saved, and the drafter's time between each step's
        depth and the window's lower median, the depth the engine would settle on. And a
        bound on what deciding could buy: the latest step's forward priced one draft a
        decoding request deeper than that depth must also cost less than a step's
        scheduling. Where it costs more (a large target's forward grows with its
        tokens), per-step decisions move the depth and cut by amounts that matter,
        whatever the window happened to decide (the 8B shape at 256 requests, session 42,
        settled at depth 3 from a window of 3s and ran 0.972x plain adaptive). The
        stretch is weighed for the window's batch size (``_stays_settled``). A step that
        did not draft (or drafted only as the gate's probe) empties the log: drafting, or
        its depth, is in question again."""
        log = self._settle_log
        if depth == 0 or self._overruled:
            self._unsettle()
            return
        num_reqs, num_tokens, _, context = self._priced_step
        decoding = self._step_decoding
        saving = 0.0 if self._step_cut is None else self._cut_saving_ms(self._step_cut)
        shape_ms, decide_ms = self._step_before[0], self._step_before[1]
        host_ms = shape_ms + decide_ms + self._step_schedule_ms
        log.append((depth, num_reqs, decoding, saving, host_ms))
        if len(log) < SETTLE_WINDOW:
            return
        # A step's scheduling at the window's median: one slow step (a collection, the
        # process descheduled) must not price deciding up for the stretches it stays in.
        step_ms = statistics.median(entry[4] for entry in log)
        host = step_ms * len(log)
        bought = sum(entry[3] for entry in log)
        if bought >= host:
            return
        settled = sorted(entry[0] for entry in log)[(len(log) - 1) // 2]  # the lower median
        drafts = decoding * settled
        deeper = (num_reqs, num_tokens, context, drafts, drafts + decoding)
        if self._cut_saving_ms(deeper) >= step_ms:
            return
        # (The drafter's prices are by the step's requests, as its times are recorded.)
        price = getattr(self.verifier.cost_model, "draft_cost_ms", None)
        if price is not None:
            for entry_depth, entry_reqs, *_ in log:
                if entry_depth != settled:
                    bought += abs(price(entry_reqs, entry_depth) - price(entry_reqs, settled))
            if bought >= host:
                return
        num_decoding = statistics.median(entry[2] for entry in log)
        if self._measures_settling:
            self._close_stretch()
            depths = [entry[0] for entry in log]
            settled = measured_settle_depth(depths, settled, self._stretches, num_decoding)
        self._settled_depth = settled
        self._settled_reqs = num_decoding
        self._settled_left = SETTLE_STEPS
        self.stats.settles += 1

    def _filled_budget(self, batch: _Batch, counts: list[int], budget: int, total: int) -> int:
        """``EngineConfig.fill_padding``: the budget raised to verify as many drafts as the
        CUDA graph the step will replay has room for. A step's tokens pad to a captured
        size, or to a larger captured shape while the ledger covers its own
        (``CaptureLedger``); the device computes those padding tokens anyway, so drafts
        put there cost the step nothing more (but their logits rows and acceptance). A
        covered step still charges the ledger for its own shape (``fill_shape``), which
        is captured when those charges add up, as it would be unfilled.

        The graph is looked up for the step's tokens with the budget, its pieces, and
        every request's key span with all its drafts (an upper bound of the span the
        allocation leaves), so the filled step fits that graph whichever drafts the
        allocation admits. Nothing here reads this round's confidences: the raised budget
        is as lossless as the planned one (the allocation still ranks by fresh survival,
        and top-b sets nest, so every draft the plan admitted stays admitted)."""
        runner = self.graphs
        plen = runner.piece_len
        if 1 + max(counts) > plen:  # a decode's drafts would spill into a second piece
            return budget
        pieces = longest = 0
        for chunk in batch.chunks:
            pieces += -(-chunk.num_tokens // plen)
            end = chunk.request.num_computed + chunk.num_tokens
            if end > longest:
                longest = end
        shape = runner.padded_shape(batch.num_tokens + budget, pieces, longest + max(counts))
        if shape is None:  # runs eagerly: padding is not computed
            return budget
        room = runner.fill_shape(shape).num_tokens - batch.num_tokens
        filled = min(total, room)
        if filled <= budget:
            return budget
        self.stats.filled_steps += 1
        self.stats.filled_drafts += filled - budget
        return filled

    def _apply(
        self,
        chunks: list[ScheduledChunk],
        drafts: list[list[int]],
        draft_probs: list[torch.Tensor | None],
        logits: torch.Tensor | None,
        owners: list[tuple[int, int]],
        row_starts: np.ndarray,
        features: torch.Tensor | None,
    ) -> list[Request]:
        self.stats.num_steps += 1
        touched = []
        offset = 0
        sampled: dict[int, tuple[torch.Tensor, list[int]]] = {}
        replay = getattr(self.drafter, "replayed_acceptance", None)
        # Greedy rows need only the argmax: one reduction and one transfer for the batch.
        needs_argmax = replay is not None or any(
            chunks[i].request.params.is_greedy for i, _ in owners
        )
        argmax = logits.argmax(dim=-1).tolist() if needs_argmax else []
        for i, count in owners:
            sampled[i] = (logits[offset : offset + count], argmax[offset : offset + count] or None)
            offset += count
        # Sampling requests are verified together: one target_probs per set of sampling
        # parameters and two transfers for the batch (``verify_sampled``).
        batched = [
            i
            for i in sampled
            if not chunks[i].request.params.is_greedy
            and not (replay is not None and chunks[i].is_decode)
        ]
        rounds = []
        for i in batched:
            request, extra, probs = chunks[i].request, drafts[i], draft_probs[i]
            probs = None if probs is None else probs[: len(extra)]
            rounds.append(
                SampledRound(sampled[i][0], extra, probs, request.params, request.generator)
            )
        verdicts = dict(zip(batched, verify_sampled(rounds), strict=True))
        admitted, accepted = [], []
        kept: list[tuple[Request, int, int, int]] = []  # request, position, row, count
        for i, (chunk, extra) in enumerate(zip(chunks, drafts, strict=True)):
            request = chunk.request
            if i not in sampled:
                kept.append((request, request.num_computed, row_starts[i], chunk.num_tokens))
                request.num_computed += chunk.num_tokens
                continue
            is_decode = chunk.is_decode
            probs = draft_probs[i]
            rows, best = sampled[i]
            if replay is not None and is_decode:  # acceptance from a trace (replay.py)
                num_accepted = replay(request, len(extra))
                new_tokens = [*extra[:num_accepted], best[num_accepted]]
            elif i in verdicts:
                num_accepted, new_tokens = verdicts[i]
            else:
                num_accepted, new_tokens = verify(
                    rows,
                    extra,
                    None if probs is None else probs[: len(extra)],
                    request.params,
                    request.generator,
                    best,
                )
            count = chunk.num_tokens + num_accepted
            kept.append((request, request.num_computed, row_starts[i], count))
            request.num_computed += count
            if is_decode and self.drafter is not None:
                request.num_rounds += 1
                request.num_drafts_verified += len(extra)
                request.num_drafts_accepted += num_accepted
                self.stats.num_decode_rounds += 1
                self.stats.num_verified += len(extra) + 1
                self.stats.num_accepted += num_accepted + 1
                admitted.append(len(extra))
                accepted.append(num_accepted)
                self.drafter.on_verified(request, num_accepted)
                if self.round_log is not None:
                    self.round_log.append(
                        (self._round_confidences.get(i), len(extra), num_accepted)
                    )
            self._emit(request, new_tokens)
            touched.append(request)
        if any(admitted):  # an undrafted step tried no position: nothing to learn
            self.acceptance.update(np.array(admitted), np.array(accepted))
        if self.verifier is not None and self.config.calibrate_survival:
            self._learn_outcome(admitted, accepted)
        if features is not None:
            phase = time.perf_counter()
            self._observe(kept, features)
            self.stats.observe_ms.append((time.perf_counter() - phase) * 1e3)
        return touched

    def _learn_outcome(self, admitted: list[int], accepted: list[int]) -> None:
        """Hand the verifier this step's verified outcome one step late (see
        ``EngineConfig.calibrate_survival``): with the look-ahead the next look-ahead
        learns it, without it the next step's end, after that step planned."""
        rows = self._round_rows
        outcome = (rows, admitted, accepted) if rows is not None and any(admitted) else None
        if not self.lookahead and self._outcome is not None:
            self.verifier.record_outcomes(*self._outcome)
        elif outcome is None:
            return  # one still waiting (a look-ahead skipped while settled) waits on
        self._outcome = outcome

    def _observe(self, kept: list[tuple[Request, int, int, int]], features: torch.Tensor) -> None:
        """Hand the drafter the target features of the positions each request kept; on a
        step the gate left undrafted, keep them for later instead (``_flush_upkeep``)."""
        kept = [item for item in kept if not item[0].is_finished and item[3] > 0]
        if not kept:
            return
        if all(count == 1 for *_, count in kept):  # decodes that kept one position each
            rows = np.fromiter((row for _, _, row, _ in kept), np.int64, len(kept))
        else:
            rows = np.concatenate([np.arange(row, row + count) for _, _, row, count in kept])
        if rows[-1] == rows.shape[0] - 1:
            # Rows only increase, so these are rows 0..n-1 (every request kept one row of
            # an undrafted step): a view of the step's own (concatenated) features, with
            # no index sent to the device and no gather.
            selected = features[: rows.shape[0]]
        else:
            selected = features[torch.from_numpy(rows).to(features.device)]
        step = self._priced_step  # set when adaptive verification decided this step
        # Undrafted: decided so, or holding its draft room back (``hold_draft_room``).
        undrafted = self._room_held or (step is not None and step[2] == 0)
        if self.config.defer_upkeep and undrafted:
            items = [(r, start, count, r.num_preemptions) for r, start, _, count in kept]
            self._deferred.append((items, selected))
            self._held_back = True
            if len(self._deferred) >= DEFER_LIMIT:
                self._timed_flush()  # other steps' work: not this step's price
            return
        self._flush_upkeep()  # anything held back goes first, in order
        self.drafter.observe(
            [item[0] for item in kept],
            [item[1] for item in kept],
            [item[3] for item in kept],
            selected,
        )

    def _timed_flush(self) -> None:
        """``_flush_upkeep``, timed: its host time, and on CUDA its device time too."""
        if not self._deferred:
            return
        steps = len(self._deferred)
        start = time.perf_counter()
        events = None
        if self.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        self._flush_upkeep()
        if events is not None:
            events[1].record()
        self._flushes.append(((time.perf_counter() - start) * 1e3, events, steps))

    def _take_flush_cost(self) -> float:
        """Milliseconds of held-back upkeep in this step's wall time, and the running
        average of what one undrafted step's catch-up costs. On the CPU a flush's time
        is its host time; on CUDA its device time (a drafting step's catch-up is queued
        on an idle device and delays the step by that much, not by its launch time). A
        flush at the end of an undrafted step (``DEFER_LIMIT``) is waited for here, so
        that its time stays in the step that ran it."""
        cost = 0.0
        for host_ms, events, steps in self._flushes:
            flush_ms = host_ms
            if events is not None:
                events[1].synchronize()
                flush_ms = events[0].elapsed_time(events[1])
            cost += flush_ms
            per_step = flush_ms / steps
            last = self.upkeep_ms_per_step
            self.upkeep_ms_per_step = per_step if last is None else last + 0.25 * (per_step - last)
        self._flushes.clear()
        return cost

    def _flush_upkeep(self) -> None:
        """Run the drafter's context updates held back on undrafted steps, in order, as one
        call. Only a drafting step needs the drafter's context complete, so an adaptive
        engine that declines to draft pays this once per ``DEFER_LIMIT`` steps (one batched
        call instead of one per step) or when it drafts again: the drafter ends up exactly
        as if it had observed every step. Requests finished or preempted since are
        skipped (the drafter has forgotten them)."""
        if not self._deferred:
            return
        requests, starts, counts, pieces = [], [], [], []
        for items, selected in self._deferred:
            live = [
                i
                for i, (r, _, _, preemptions) in enumerate(items)
                if not r.is_finished and r.num_preemptions == preemptions
            ]
            if not live:
                continue
            offsets = np.cumsum([0] + [item[2] for item in items])
            rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in live])
            if len(live) < len(items):
                selected = selected[torch.from_numpy(rows).to(selected.device)]
            requests += [items[i][0] for i in live]
            starts += [items[i][1] for i in live]
            counts += [items[i][2] for i in live]
            pieces.append(selected)
        self._deferred.clear()
        if requests:
            self.drafter.observe(requests, starts, counts, torch.cat(pieces))

    def _emit(self, request: Request, new_tokens: list[int]) -> None:
        """Append tokens one by one, stopping at EOS, a stop string or a length limit."""
        if request.first_token_time is None:
            request.first_token_time = self.request_clock()
        params = request.params
        reason = None
        for token in new_tokens:
            if token in self.stop_ids and not params.ignore_eos:
                reason = FinishReason.STOP
                break
            request.output_ids.append(token)
            self.stats.num_generated += 1
            if params.stop:
                text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
                cut = min((text.find(s) for s in params.stop if s in text), default=-1)
                if cut >= 0:
                    request.stop_at = cut
                    reason = FinishReason.STOP
                    break
            if (
                len(request.output_ids) >= params.max_tokens
                or request.num_tokens >= self.max_model_len
            ):
                reason = FinishReason.LENGTH
                break
        if reason is not None:
            self._finish(request, reason)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        request.finish_reason, request.error = reason, error
        request.finish_time = self.request_clock()
        request.text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        if request.stop_at is not None:
            request.text = request.text[: request.stop_at]
        self.scheduler.finish(request)

    def request_clock(self) -> float:
        """Seconds for requests' timestamps (arrival, first token, finish): the host's
        clock less ``idle_s``, the time the engine's owner held it idle (a time-sliced
        benchmark stepping other engines in between), so that TPOT counts this engine's
        own time only."""
        return time.perf_counter() - self.idle_s

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() * 1e3
