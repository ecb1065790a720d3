"""Per-slot confidence state and the step lifecycle of adaptive verification.

Each step, for the requests of the batch:

1. ``record(slots, confidences)`` — the drafter has proposed this step's drafts; their
   confidences become *fresh*, and what was fresh for those slots becomes *stale*.
2. ``plan(...)`` — the budget, priced from the **stale** confidences.
3. ``allocate(...)`` — the budget's slots, ranked by the **fresh** confidences.

Why the lag. Speculative sampling is lossless only if the decision of how many drafts
to verify does not depend on the draft tokens under verification. If the budget read
the fresh confidences, a request whose drafts look unlikely would be cut short *because
of those drafts* — a data-dependent stopping rule that biases the output distribution
(the DSpark paper, Appendix A, gives a counterexample). The stale confidences describe
the previous round's drafts only, so the budget is fixed before this round's tokens
are seen. The allocation may use the fresh ones: ranking slots by survival admits a
prefix of each request's drafts, and whether draft k of a request is admitted depends
only on that request's drafts 1..k-1 (through their survival) and on other requests,
never on draft k itself or later ones. Rejection sampling of an admitted prefix stays
exact, so the output follows the target distribution whatever the verifier decides.

A new slot starts with all confidences 1.0: a request's first budget assumes its drafts
survive until it has a track record.
"""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import (
    as_confidences,
    as_int_vector,
    check_drafts_fit,
    check_non_negative_int,
)
from dspark.scheduling.allocation import admit_top_slots
from dspark.scheduling.budget import best_budget, draft_cap
from dspark.scheduling.cost import StepCostModel
from dspark.scheduling.survival import zero_unscheduled


class AdaptiveVerifier:
    """Chooses and places the draft budget of every step; owns no engine state."""

    def __init__(
        self,
        max_num_slots: int,
        num_positions: int,
        cost_model: StepCostModel,
        max_total_logits: int,
        num_bonus_tokens: int = 1,
    ) -> None:
        if max_num_slots <= 0 or num_positions <= 0:
            raise ValueError(
                "max_num_slots and num_positions (K) must be positive, got "
                f"{max_num_slots} and {num_positions}"
            )
        self.num_positions = num_positions
        self.cost_model = cost_model
        self.max_total_logits = check_non_negative_int("max_total_logits", max_total_logits)
        self.num_bonus_tokens = check_non_negative_int("num_bonus_tokens", num_bonus_tokens)
        # Survival of each slot's recorded confidences, position-major: [K, max_num_slots].
        self._fresh = np.ones((num_positions, max_num_slots))
        self._stale = np.ones((num_positions, max_num_slots))
        self._is_active = np.zeros(max_num_slots, dtype=bool)

    @property
    def max_num_slots(self) -> int:
        return self._is_active.shape[0]

    def add_request(self, slot: int) -> None:
        """Start tracking a request in ``slot``; its confidences start at 1.0."""
        self._check_slot(slot)
        if self._is_active[slot]:
            raise ValueError(f"slot {slot} already holds a request; remove it first")
        self._fresh[:, slot] = 1.0
        self._stale[:, slot] = 1.0
        self._is_active[slot] = True

    def remove_request(self, slot: int) -> None:
        """Stop tracking the request in ``slot`` (finished, aborted or preempted)."""
        self._check_slot(slot)
        if not self._is_active[slot]:
            raise ValueError(f"slot {slot} holds no request")
        self._is_active[slot] = False

    def record(self, slots: np.ndarray, confidences: np.ndarray) -> None:
        """Confidences ``[num_reqs, K]`` of the drafts proposed for this step."""
        slots = self._check_slots(slots)
        confidences = as_confidences("confidences", confidences)
        if confidences.shape != (slots.shape[0], self.num_positions):
            raise ValueError(
                f"confidences must be [{slots.shape[0]}, {self.num_positions}] "
                f"(one row per slot, K={self.num_positions}), got {confidences.shape}"
            )
        self._stale[:, slots] = self._fresh[:, slots]
        survival = confidences.T.astype(np.float64)  # [K, num_reqs]
        for k in range(1, self.num_positions):
            np.multiply(survival[k - 1], survival[k], out=survival[k])
        self._fresh[:, slots] = survival

    def plan(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
    ) -> int:
        """The step's draft budget, from the stale confidences (see the module doc)."""
        slots = self._check_slots(slots)
        num_reqs = slots.shape[0]
        drafts = self._check_drafts(num_drafts, num_reqs)
        non_draft = as_int_vector("num_non_draft", num_non_draft, num_reqs)
        if not 0 <= num_sampling <= num_reqs:
            raise ValueError(f"num_sampling must be in [0, {num_reqs}], got {num_sampling}")
        cap = draft_cap(int(drafts.sum()), num_reqs, self.max_total_logits, self.num_bonus_tokens)
        costs = self.cost_model.step_costs_ms(num_reqs, int(non_draft.sum()), cap, context_tokens)
        survival = self._stale.take(slots, axis=1)
        zero_unscheduled(survival, drafts)
        return best_budget(survival.ravel(), cap, int(num_sampling), costs)

    def allocate(self, slots: np.ndarray, num_drafts: np.ndarray, budget: int) -> np.ndarray:
        """Admitted drafts per request: the budget's slots of highest fresh survival."""
        slots = self._check_slots(slots)
        drafts = self._check_drafts(num_drafts, slots.shape[0])
        total = int(drafts.sum())
        if not 0 <= budget <= total:
            raise ValueError(f"budget must be in [0, {total}] (the scheduled drafts), got {budget}")
        if budget == total:
            return drafts.copy()
        if budget == 0:
            return np.zeros(slots.shape[0], dtype=np.int64)
        survival = self._fresh.take(slots, axis=1)
        zero_unscheduled(survival, drafts)
        return admit_top_slots(survival, drafts, budget)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_num_slots:
            raise ValueError(f"slot must be in [0, {self.max_num_slots}), got {slot}")

    def _check_slots(self, slots: np.ndarray) -> np.ndarray:
        slots = as_int_vector("slots", slots)
        if slots.size and (slots.max() >= self.max_num_slots or not self._is_active[slots].all()):
            inactive = [int(s) for s in slots if s >= self.max_num_slots or not self._is_active[s]]
            raise ValueError(f"slots {inactive} hold no request; call add_request first")
        return slots

    def _check_drafts(self, num_drafts: np.ndarray, num_reqs: int) -> np.ndarray:
        drafts = as_int_vector("num_drafts", num_drafts, num_reqs)
        check_drafts_fit("num_drafts", drafts, self.num_positions)
        return drafts
