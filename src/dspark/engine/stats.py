"""What the engine counts: ``EngineStats`` and the per-step log (``StepRecord``)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

RECENT = 10_000
"""Per-step series keep the latest steps only: a long-running server must not grow."""


def _recent() -> deque:
    return deque(maxlen=RECENT)


class StepRecord(NamedTuple):
    """One step, for ``dspark bench --step-log`` (times in ms)."""

    wall_ms: float  # the step, start to end (a held-back upkeep flush included)
    flush_ms: float  # of it, catching up held-back drafter upkeep
    draft_ms: float  # the drafting phase (depth decision, proposal, budget, allocation)
    forward_ms: float  # the target's forward (device-synchronised)
    apply_ms: float  # verification, emission, the drafter's context update
    schedule_ms: float  # adaptive: budget and allocation after the proposal
    before_ms: float  # of the drafting phase, before the proposal (depth, plans, flush)
    shape_ms: float  # of that, adaptive: the batch's shape
    decide_ms: float  # the depth decision
    plan_ms: float  # the budget planned before the drafter runs
    sync_ms: float  # waiting for the device before the proposal's timer starts
    propose_ms: float  # the proposal (device-synchronised)
    requests: int  # requests in the batch
    chunk_tokens: int  # non-draft tokens past one a request: prompt chunks (0: decodes alone)
    tokens: int  # tokens the target's forward ran on (drafts included)
    depth: int  # drafting depth of the proposal (0: undrafted)
    drafts: int  # drafts verified
    emitted: int  # tokens emitted
    graph_tokens: int  # tokens of the captured shape replayed (0: eager)
    covered: int  # replayed a larger captured shape than its own
    captured: int  # captured a CUDA graph
    settled: int  # drafted at a settled depth, undecided


STEP_FIELDS = StepRecord._fields


@dataclass
class EngineStats:
    num_steps: int = 0
    num_decode_rounds: int = 0
    num_verified: int = 0  # admitted drafts + 1 per decode round
    num_accepted: int = 0  # accepted drafts + 1 per decode round
    num_generated: int = 0
    forward_ms: deque[float] = field(default_factory=_recent)
    drafter_ms: deque[float] = field(default_factory=_recent)
    budgets: deque[int] = field(default_factory=_recent)
    schedule_ms: deque[float] = field(default_factory=_recent)  # adaptive: deciding, per call
    # Host phases of a step (no device sync): drafting as a whole, verification and
    # emission, the drafter's context update.
    draft_phase_ms: deque[float] = field(default_factory=_recent)
    apply_ms: deque[float] = field(default_factory=_recent)
    observe_ms: deque[float] = field(default_factory=_recent)
    step_log: deque[StepRecord] = field(default_factory=_recent)
    capture_steps: int = 0  # steps that captured a CUDA graph (once per shape)
    # Adaptive: what the policy decided, step by step.
    undrafted_steps: int = 0  # decided not to draft
    gate_vetoes: int = 0  # of those, the cost model drafted but the throughput gate did not
    probes: int = 0  # drafted although the cost model declined (the gate's probe)
    budget_cuts: int = 0  # verified fewer drafts than were proposed
    filled_steps: int = 0  # budget raised into the padding of the step's graph
    filled_drafts: int = 0  # drafts that added
    settled_steps: int = 0  # drafted at a settled depth, every draft verified, undecided
    settles: int = 0  # times the engine settled
    depth_steps: Counter[int] = field(default_factory=Counter)  # decided steps by depth
    lookahead_hits: int = 0  # the depth decided during the previous forward, used as is
    lookahead_reused: int = 0  # ... taken by a batch that changed a little
    lookahead_plans: int = 0  # the budget planned during the previous forward, used as is
    drafting_plans: int = 0  # the budget planned while the drafter ran
    share_plans: int = 0  # the budget summed from the requests' shares of the plan ahead
    recut_plans: int = 0  # the plan ahead's ranking cut again at the step's own prices
    lookahead_ms: deque[float] = field(default_factory=_recent)  # host time of those plans

    @property
    def acceptance_length(self) -> float:
        """Tokens per decode round, the bonus token included."""
        return self.num_accepted / self.num_decode_rounds if self.num_decode_rounds else 0.0

    @property
    def verified_per_step(self) -> float:
        """Tokens verified per request per decode round (admitted drafts + 1)."""
        return self.num_verified / self.num_decode_rounds if self.num_decode_rounds else 0.0
