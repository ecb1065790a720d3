"""What the adaptive policy decides for a step (``StepPlan``) and what it reads."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dspark.engine.scheduler import ScheduledChunk
from dspark.engine.speculative import Proposal


class BudgetSource(enum.Enum):
    """Where a step's draft budget came from."""

    NONE = "none"  # nothing was drafted
    ALL = "all"  # every draft verified, undecided: a settled step
    STEP = "step"  # planned in the step, after the proposal
    AHEAD = "ahead"  # planned during the previous step's forward, for exactly this batch
    DRAFTING = "drafting"  # planned while the drafter ran
    SHARES = "shares"  # the sum of the requests' shares of the plan taken ahead
    RECUT = "recut"  # the plan ahead's ranking, cut again at this step's own prices


@dataclass(slots=True)
class StepPlan:
    """A step's drafting: how deep, which drafts are verified, and how that was decided."""

    depth: int = 0  # drafting depth of the proposal (0: not drafted)
    proposal: Proposal | None = None
    admitted: list[int] | None = None  # drafts verified per decoding request
    budget: int | None = None  # drafts verified in all (None: undecided, every draft)
    source: BudgetSource = BudgetSource.NONE
    decided: bool = False  # the policy priced this step (the gate and cost model learn it)
    settled: bool = False  # drafted at the settled depth, undecided
    probe: bool = False  # drafted although the cost model declined: the gate's probe
    shape_ms: float = 0.0  # host time: the batch's shape
    decide_ms: float = 0.0  # ... the depth decision
    plan_ms: float = 0.0  # ... the budget planned before the proposal
    schedule_ms: float = 0.0  # ... the budget and allocation after it

    @property
    def is_undrafted_decision(self) -> bool:
        """The policy decided not to draft this step."""
        return self.decided and self.proposal is None


class PricedStep(NamedTuple):
    """A decided step as the cost model and the gate price it."""

    num_reqs: int
    num_tokens: int  # non-draft tokens
    depth: int
    context: int  # tokens cached over the batch


class ProposalRun(NamedTuple):
    """One timed proposal: the drafts, the drafter's ms, whether a graph was captured."""

    proposal: Proposal
    ms: float
    captured: bool


@dataclass(slots=True)
class BatchShape:
    """What adaptive verification reads of a step's batch (built once a step)."""

    chunks: list[ScheduledChunk]
    slots: np.ndarray  # [n] verifier slot per scheduled request, batch order
    decode_index: np.ndarray  # positions in the batch of the decoding requests
    non_draft: np.ndarray  # [n] tokens per request before drafts
    num_sampling: int  # requests that sample a token this step
    context: int  # tokens already cached across the batch
    # The same as Python lists and a sum: the per-step checks of a small batch would pay
    # microseconds per NumPy call.
    slot_list: list[int] = field(default_factory=list)
    decode_list: list[int] = field(default_factory=list)
    num_tokens: int = 0  # non-draft tokens in all

    @property
    def num_reqs(self) -> int:
        return len(self.slot_list)


def batch_shape(chunks: list[ScheduledChunk], decode_index: list[int]) -> BatchShape:
    slots, non_draft = [], []
    num_sampling = context = 0
    for chunk in chunks:  # one pass: this runs on the host's critical path every step
        request = chunk.request
        slots.append(request.slot)
        count = chunk.num_tokens
        non_draft.append(count)
        computed = request.num_computed
        # ``chunk.samples`` spelt out: its properties' calls were half this loop's time.
        num_sampling += computed + count == len(request.prompt_ids) + len(request.output_ids)
        context += computed
    return BatchShape(
        chunks=chunks,
        slots=np.array(slots, dtype=np.int64),
        decode_index=np.array(decode_index, dtype=np.int64),
        non_draft=np.array(non_draft, dtype=np.int64),
        num_sampling=num_sampling,
        context=context,
        slot_list=slots,
        decode_list=decode_index,
        num_tokens=sum(non_draft),
    )


def elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3
