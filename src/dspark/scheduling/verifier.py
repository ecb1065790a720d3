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

Deciding whether to draft at all (``drafting_pays``, before the drafter runs) reads the
latest recorded confidences: the drafts they describe are already verified, so this is
as lossless as the budget. A step that skips the drafter records nothing, so a request
whose last drafts looked poor would never be drafted again; ``relax`` therefore moves the
skipped slots' survival halfway towards the population's (a running average of every
recorded round), and the request is retried once that average says drafting pays.
"""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import (
    as_confidences,
    as_counts,
    as_draft_counts,
    as_non_negative_int,
    count_total,
)
from dspark.scheduling.allocation import admit_top_slots
from dspark.scheduling.budget import best_budget, draft_cap
from dspark.scheduling.cost import StepCostModel
from dspark.scheduling.survival import running_product, zero_unscheduled


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
        self.max_total_logits = as_non_negative_int("max_total_logits", max_total_logits)
        self.num_bonus_tokens = as_non_negative_int("num_bonus_tokens", num_bonus_tokens)
        # Survival of each slot's last two recorded rounds: [max_num_slots, K] each.
        self._fresh = np.ones((max_num_slots, num_positions))
        self._stale = np.ones((max_num_slots, num_positions))
        self._is_active = np.zeros(max_num_slots, dtype=bool)
        self._last_plan: tuple | None = None  # (inputs, survival, budget, costs)
        # Mean survival of recorded rounds (exponential average over record() calls).
        self._population = np.ones(num_positions)
        self.population_decay = 0.9

    @property
    def max_num_slots(self) -> int:
        return self._is_active.shape[0]

    def add_request(self, slot: int) -> None:
        """Start tracking a request in ``slot``; its confidences start at 1.0."""
        self._check_slot(slot)
        if self._is_active[slot]:
            raise ValueError(f"slot {slot} already holds a request; remove it first")
        self._fresh[slot] = 1.0
        self._stale[slot] = 1.0
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
        self._stale[slots] = self._fresh.take(slots, axis=0)
        survival = running_product(confidences.T.astype(np.float64, order="C"))  # [K, n]
        self._fresh[slots] = survival.T
        if slots.size:
            decay = self.population_decay
            mean = np.add.reduce(survival, axis=1) / slots.shape[0]  # [K]
            self._population = decay * self._population + (1 - decay) * mean

    @property
    def population_survival(self) -> np.ndarray:
        """``[K]`` running average of the survival of recorded rounds."""
        return self._population.copy()

    def relax(self, slots: np.ndarray, weight: float = 0.5) -> None:
        """The slots' drafter did not run this step (nothing recorded): move their latest
        survival ``weight`` of the way towards the population's (see the module doc)."""
        slots = self._check_slots(slots)
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {weight}")
        latest = self._fresh.take(slots, axis=0)
        self._fresh[slots] = (1 - weight) * latest + weight * self._population

    def plan(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
    ) -> int:
        """The step's draft budget, from the stale confidences (see the module doc)."""
        return self._stale_plan(slots, num_drafts, num_non_draft, num_sampling, context_tokens)[0]

    def drafting_pays(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
    ) -> int:
        """How deep to draft this step (0: do not run the drafter), decided before it runs.

        The seed always drafts and then picks a budget, so the drafter's cost is paid
        even when the budget is zero. Here the stale plan (``num_drafts``: the most each
        request could get) is priced first: drafting pays when the expected tokens per
        millisecond with the planned budget, draft cost included, beat the tokens per
        millisecond of a step without drafts. Only the latest *recorded* confidences are
        read (drafts already verified), so the decision cannot depend on the drafts it
        would produce; when the answer is 0, ``relax`` the slots. A cost model without
        ``draft_cost_ms`` keeps the seed's behaviour (draft whenever the budget is > 0).
        When drafting pays, the answer is the planned budget capped at K: the fresh
        allocation admits a prefix of at most that many drafts per request, so deeper
        positions need not be drafted at all.
        """
        budget, survival, costs = self._stale_plan(
            slots, num_drafts, num_non_draft, num_sampling, context_tokens, self._fresh
        )
        if budget == 0:
            return 0
        depth = min(budget, self.num_positions)
        draft_cost = getattr(self.cost_model, "draft_cost_ms", None)
        if draft_cost is None:
            return depth
        top = np.partition(survival, survival.size - budget)[-budget:]
        gain = num_sampling + float(top.sum())
        without = max(float(costs[0]) - draft_cost(len(slots)), 1e-9)
        return depth if gain / float(costs[budget]) > num_sampling / without else 0

    def _stale_plan(
        self, slots, num_drafts, num_non_draft, num_sampling, context_tokens, state=None
    ):
        """The budget, the survival it ranked (flat, unscheduled positions zeroed) and the
        step costs for budgets 0..cap (None when nothing can be verified). ``state``: the
        survival table to read, the stale one unless given (``drafting_pays`` reads the
        latest recorded, which no draft of the coming step can have influenced)."""
        slots = self._check_slots(slots)
        num_reqs = slots.shape[0]
        drafts = as_draft_counts("num_drafts", num_drafts, num_reqs, self.num_positions)
        num_tokens = count_total("num_non_draft", num_non_draft, num_reqs)
        if not 0 <= num_sampling <= num_reqs:
            raise ValueError(f"num_sampling must be in [0, {num_reqs}], got {num_sampling}")
        cap = draft_cap(drafts.total, num_reqs, self.max_total_logits, self.num_bonus_tokens)
        if cap == 0:
            return 0, None, None
        table = self._stale if state is None else state
        survival = table.take(slots, axis=0)  # [num_reqs, K]; order is irrelevant here
        if not drafts.is_full:
            survival *= drafts.counts[:, None] > np.arange(self.num_positions)
        survival = survival.ravel()
        # The gate's plan (latest recorded survival) is usually the budget's plan one call
        # later (record() moved exactly those rows to stale): same inputs, same answer, so
        # the search runs once per step. A cost model is a function of its arguments (and
        # of its version, for one that learns).
        # A cost model that learns (``ObservedDraftCost``) says so through a version.
        version = getattr(self.cost_model, "version", 0)
        key = (num_reqs, num_tokens, cap, int(num_sampling), int(context_tokens), version)
        if self._is_last_plan(key, survival):
            return self._last_plan[2], survival, self._last_plan[3]
        costs = self.cost_model.step_costs_ms(num_reqs, num_tokens, cap, context_tokens)
        budget = best_budget(survival, cap, int(num_sampling), costs)
        self._last_plan = (key, survival.copy(), budget, costs)
        return budget, survival, costs

    def _is_last_plan(self, key: tuple, survival: np.ndarray) -> bool:
        memo = self._last_plan
        # The first score usually differs already: a scalar test before the full one.
        return (
            memo is not None
            and memo[0] == key
            and memo[1][0] == survival[0]
            and bool((memo[1] == survival).all())
        )

    def allocate(self, slots: np.ndarray, num_drafts: np.ndarray, budget: int) -> np.ndarray:
        """Admitted drafts per request: the budget's slots of highest fresh survival."""
        slots = self._check_slots(slots)
        drafts = as_draft_counts("num_drafts", num_drafts, slots.shape[0], self.num_positions)
        if not 0 <= budget <= drafts.total:
            raise ValueError(
                f"budget must be in [0, {drafts.total}] (the scheduled drafts), got {budget}"
            )
        if budget == drafts.total:
            return drafts.counts.astype(np.int64)
        if budget == 0:
            return np.zeros(slots.shape[0], dtype=np.int64)
        survival = self._fresh.take(slots, axis=0).T.copy()  # [K, num_reqs], position-major
        if not drafts.is_full:
            zero_unscheduled(survival, drafts.counts)
        return admit_top_slots(survival, drafts.counts, budget)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_num_slots:
            raise ValueError(f"slot must be in [0, {self.max_num_slots}), got {slot}")

    def _check_slots(self, slots: np.ndarray) -> np.ndarray:
        slots = as_counts("slots", slots)
        if slots.size and (
            np.maximum.reduce(slots) >= self.max_num_slots or not self._is_active.take(slots).all()
        ):
            inactive = [int(s) for s in slots if s >= self.max_num_slots or not self._is_active[s]]
            raise ValueError(f"slots {inactive} hold no request; call add_request first")
        return slots
