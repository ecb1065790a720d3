"""Verification policies: how many drafts each request verifies this step.

Every policy decides from what it is allowed to see: the scheduled draft counts, the
drafter's (possibly miscalibrated) confidences and the batch's shape. Only the
ideal-information reference is also handed the true acceptance probabilities and prices
steps with the true cost. No policy ever sees the coin flips that decide acceptance.
The adaptive policies run the real ``dspark.scheduling`` code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark.scheduling import (
    AdaptiveVerifier,
    StepCostModel,
    allocate_drafts,
    choose_draft_budget,
)


@dataclass(frozen=True, slots=True)
class StepView:
    """What a policy sees of a decode step (batch order = ``slots``)."""

    slots: np.ndarray  # [n] slot of each request
    num_drafts: np.ndarray  # [n] drafts scheduled (0..K)
    confidences: np.ndarray  # [n, K] the drafter's confidences for this round
    context_tokens: int  # KV tokens over the batch
    true_probs: np.ndarray | None = None  # [n, K], handed to oracle policies only


class Policy:
    """Base: verify every scheduled draft. Subclasses override ``decide``."""

    name = "policy"
    num_positions = 0  # drafts proposed per request (0: no speculation)
    is_oracle = False

    def begin(self, slot: int) -> None:  # a request took this slot
        pass

    def end(self, slot: int) -> None:  # the request in this slot finished
        pass

    def decide(self, step: StepView) -> np.ndarray:
        return step.num_drafts


class NoSpeculation(Policy):
    name = "no-spec"

    def decide(self, step: StepView) -> np.ndarray:
        return np.zeros_like(step.num_drafts)


class FixedK(Policy):
    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"fixed K must be at least 1, got {k}")
        self.num_positions = k
        self.name = f"fixed-{k}"


class Adaptive(Policy):
    """Stale budget, fresh allocation, priced by ``cost_model`` (the seed's or ours)."""

    def __init__(self, name: str, cost_model: StepCostModel, num_positions: int, max_slots: int):
        self.name = name
        self.num_positions = num_positions
        self.verifier = AdaptiveVerifier(
            max_slots, num_positions, cost_model, max_total_logits=max_slots * (num_positions + 1)
        )

    def begin(self, slot: int) -> None:
        self.verifier.add_request(slot)

    def end(self, slot: int) -> None:
        self.verifier.remove_request(slot)

    def decide(self, step: StepView) -> np.ndarray:
        num_reqs = step.slots.shape[0]
        self.verifier.record(step.slots, step.confidences)
        budget = self.verifier.plan(
            step.slots,
            step.num_drafts,
            np.ones(num_reqs, dtype=np.int64),
            num_reqs,
            step.context_tokens,
        )
        return self.verifier.allocate(step.slots, step.num_drafts, budget)


class IdealInformation(Policy):
    """The reference: this round's true acceptance probabilities and the true cost."""

    name = "ideal"
    is_oracle = True

    def __init__(self, true_cost: StepCostModel, num_positions: int) -> None:
        self.true_cost = true_cost
        self.num_positions = num_positions

    def decide(self, step: StepView) -> np.ndarray:
        if step.true_probs is None:
            raise ValueError("the ideal-information policy needs the true probabilities")
        num_reqs = step.slots.shape[0]
        budget = choose_draft_budget(
            step.true_probs,
            step.num_drafts,
            np.ones(num_reqs, dtype=np.int64),
            num_reqs,
            self.true_cost,
            num_reqs * (self.num_positions + 1),
            context_tokens=step.context_tokens,
        )
        return allocate_drafts(step.true_probs, step.num_drafts, budget)
