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

Drafting at all, and relax. Whether to draft, and how deep (``drafting_pays``, before
the drafter runs), reads the latest recorded confidences (a request with none yet counts
as the population's average): their drafts are already verified, so this is as lossless
as the budget. A step that skips the drafter records nothing, so a request whose last
drafts looked poor would never be drafted again; ``relax`` moves the skipped slots'
survival halfway towards the population's (a running average of every recorded round),
and the request is retried once that average says drafting pays. The average forgets by
rounds, not only by calls (``POPULATION_ROUND_DECAY``): at one request a few calls'
memory holds only the poor rounds before the request stopped drafting, which would keep
it undrafted where drafting would gain.

Predictiveness. How much one round says about the next is measured, not assumed: each
``record`` pairs every slot's previous round with its new one (expected accepted drafts,
the survival summed over positions; a round ``relax`` moved counts as moved) and keeps
their running correlation, ``predictiveness`` (1.0 until ``PREDICTIVENESS_MIN_PAIRS``
pairs are seen). ``drafting_pays`` prices each request at ``population + predictiveness
· (latest - population)``, the best linear prediction of its coming round, so that where
rounds barely predict each other one poor-looking round does not stop a small batch
drafting, or make it draft shallow.

Batch-level shrink. ``plan`` reads the stale rounds in two parts. Their spread within
the batch stands for the spread of the fresh ones that the allocation ranks, and is kept,
as the seed keeps it. Their batch mean is one more round of the batch's level, which
predicts the coming level only as far as rounds predict each other, so
``_shrink_batch_level`` moves it towards the population's by ``predictiveness``. It
scales each position's rows rather than shifting them, so their ratios stay and no
survival reaches 0 that was not 0 (a shift would drive the rows below a lucky batch's
mean to 0, and the smallest best budget would leave those slots out even where verifying
them costs nothing). At one request the plan reads the request's predicted survival, so
one poor-looking round does not cut drafts the drafter has already run; at hundreds the
batch mean sits near the population's and the plan is the seed's.

Prompt chunks. A step that carries a prompt chunk besides its decodes is priced as if the
chunk were not there: the drafts' cost is their marginal one (the target's cost of the
chunk's tokens *plus* the drafts, less that of the chunk's tokens alone, and the
drafter), against a step of the same requests' decodes alone (one token each: a request
whose chunk does not finish its prompt counts as a decode that samples nothing, which
prices the undrafted step one token high per such request). The chunk is computed either
way and drafts save decoding steps, not prompt work, so they pay only when they come
faster than decoding alone brings them; priced with the chunk in, as the seed prices
every step, the chunk's cost holds the step's rate down and drafts slower than decoding
would still raise it. Steps of decodes alone are priced as the seed prices them.
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
from dspark.scheduling.budget import best_budget, depth_rates, draft_cap
from dspark.scheduling.cost import StepCostModel
from dspark.scheduling.survival import running_product, zero_unscheduled

POPULATION_RECORD_DECAY = 0.9
POPULATION_ROUND_DECAY = 0.995
"""A ``record`` call of ``n`` rounds keeps ``max(POPULATION_RECORD_DECAY,
POPULATION_ROUND_DECAY ** n)`` of the population's weight on earlier rounds: at one
request a memory of about two hundred rounds (the per-call decay alone keeps about ten
calls), from about 21 requests on one of about ten calls (thousands of rounds at hundreds
of requests)."""

PREDICTIVENESS_MIN_PAIRS = 64
"""Consecutive-round pairs (weighted by the running decay) before ``predictiveness`` is
measured rather than assumed to be 1."""


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
        # Mean survival of recorded rounds: an exponential average over record() calls,
        # bias-corrected (the first record is the mean, not a blend with a prior of 1.0).
        self._population_sum = np.zeros(num_positions)
        self._population_weight = 0.0
        self.population_decay = POPULATION_RECORD_DECAY  # kept per record() call, at least
        self.population_round_decay = POPULATION_ROUND_DECAY  # ... and per round recorded
        # Slots whose request has had no round recorded yet (they start at 1.0).
        self._unrecorded = np.zeros(max_num_slots, dtype=bool)
        # Running sums over consecutive-round pairs of a slot (previous round's expected
        # accepted drafts x, the new round's y): weight, then x and y, then the second
        # moments [[xx, xy], [xy, yy]]; and the correlation they give, kept up to date.
        self._pair_weight = 0.0
        self._pair_moments = [0.0] * 5  # x, y, xx, yy, xy
        self._predictiveness = 1.0
        self.predictiveness_decay = 0.99  # per record() call
        # The population and predictiveness as they were before the latest record: what
        # a plan of the recorded round's step reads (never that round's own confidences).
        self._planning_state: tuple[np.ndarray, float] = (self._population(), 1.0)
        # The depth of the best drafted plan in the last ``drafting_pays``, even when not
        # drafting was better (0: nothing to draft): what a probe of drafting would use.
        self.probe_depth = 0

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
        self._unrecorded[slot] = True

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
        self._planning_state = (self._population(), self._predictiveness)
        previous = self._fresh.take(slots, axis=0)
        self._stale[slots] = previous
        survival = running_product(confidences.T.astype(np.float64, order="C"))  # [K, n]
        self._fresh[slots] = survival.T
        if slots.size:
            # Expected accepted drafts (survival summed over positions), before and now.
            before, expected = previous.sum(axis=1), np.add.reduce(survival, axis=0)
            unrecorded = self._unrecorded.take(slots)
            if unrecorded.any():  # only slots with a round before pair it with this one
                before, expected = before[~unrecorded], expected[~unrecorded]
            if before.shape[0]:
                self._record_pairs(before, expected)
            self._unrecorded[slots] = False
            # Small batches forget by rounds (module doc), large ones by calls.
            decay = max(self.population_decay, self.population_round_decay ** slots.shape[0])
            mean = np.add.reduce(survival, axis=1) / slots.shape[0]  # [K]
            self._population_sum = decay * self._population_sum + (1 - decay) * mean
            self._population_weight = decay * self._population_weight + (1 - decay)

    def _record_pairs(self, x: np.ndarray, y: np.ndarray) -> None:
        """Fold pairs of (previous, new) expected accepted drafts into the running moments
        and update ``predictiveness`` (five reductions, then plain floats)."""
        decay = self.predictiveness_decay
        sums = (x.sum(), y.sum(), x @ x, y @ y, x @ y)
        self._pair_moments = [
            decay * old + float(new) for old, new in zip(self._pair_moments, sums, strict=True)
        ]
        self._pair_weight = weight = decay * self._pair_weight + x.shape[0]
        if weight < PREDICTIVENESS_MIN_PAIRS:
            return
        sx, sy, sxx, syy, sxy = self._pair_moments
        var_x, var_y = sxx / weight - (sx / weight) ** 2, syy / weight - (sy / weight) ** 2
        if var_x <= 1e-12 or var_y <= 1e-12:
            self._predictiveness = 1.0
            return
        correlation = (sxy / weight - sx * sy / weight**2) / (var_x * var_y) ** 0.5
        self._predictiveness = min(max(correlation, 0.0), 1.0)

    @property
    def predictiveness(self) -> float:
        """Correlation, in [0, 1], of a slot's expected accepted drafts between consecutive
        recorded rounds (running, decayed per record); 1.0 until
        ``PREDICTIVENESS_MIN_PAIRS`` pairs are seen or when either side has no spread."""
        return self._predictiveness

    @property
    def population_survival(self) -> np.ndarray:
        """``[K]`` running average of the survival of recorded rounds."""
        return self._population()

    def _population(self) -> np.ndarray:
        if self._population_weight == 0.0:
            return np.ones(self.num_positions)  # nothing recorded yet: the seed's prior
        return self._population_sum / self._population_weight

    def relax(self, slots: np.ndarray, weight: float = 0.5) -> None:
        """The slots' drafter did not run this step (nothing recorded): move their latest
        survival ``weight`` of the way towards the population's (see the module doc)."""
        slots = self._check_slots(slots)
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {weight}")
        latest = self._fresh.take(slots, axis=0)
        self._fresh[slots] = (1 - weight) * latest + weight * self._population()

    def plan(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
        *,
        ahead: bool = False,
    ) -> int:
        """The step's draft budget, from the stale confidences (see the module doc): their
        spread over the batch as recorded, their batch mean shrunk towards the population's
        by ``predictiveness`` (as it stood before the latest record; with 1.0, as until
        ``PREDICTIVENESS_MIN_PAIRS`` pairs are seen, exactly ``choose_draft_budget`` on
        the stale confidences). A step with a prompt chunk prices its drafts at their
        marginal cost against its decodes alone (module doc), where the seed's budget
        prices the whole step.

        ``ahead``: the budget of the slots' *next* round, planned before it is recorded,
        from the latest recorded confidences: exactly those that ``record`` of the next
        round turns stale, so the answer is the one ``plan`` gives after that ``record``
        (for the slots that record it; the cost model as it stands now). An engine can
        take it while the device still runs the current step."""
        budget, _ = self._planned_survival(
            slots, num_drafts, num_non_draft, num_sampling, context_tokens, ahead
        )
        return budget

    def plan_shares(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
    ) -> tuple[int, np.ndarray]:
        """``plan(..., ahead=True)`` and the budget's share of each request: ``[num_reqs]``
        admitted drafts of a global top-budget of the survival the plan ranked (ties as
        ``allocate``), summing to the budget.

        A batch that turns out to be these requests less some (one finished, another
        nears its limit) can take the sum of its requests' shares as its budget: the
        slots this plan found worth their price, without planning again. That is the
        same marginal survival cut at about the same step cost, not the budget the seed's
        search would give the smaller batch; it reads only recorded confidences, so it
        is as lossless as ``plan``."""
        budget, shares, _ = self.plan_ranking(
            slots, num_drafts, num_non_draft, num_sampling, context_tokens
        )
        return budget, shares

    def plan_ranking(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
    ) -> tuple[int, np.ndarray, np.ndarray | None]:
        """``plan_shares`` and the ``[num_reqs, K]`` survival its plan ranked (shrunk,
        calibrated, zero past each request's drafts; None when nothing can be verified),
        for ``recut``."""
        budget, survival = self._planned_survival(
            slots, num_drafts, num_non_draft, num_sampling, context_tokens, True
        )
        drafts = np.asarray(num_drafts, dtype=np.int64)
        total = int(drafts.sum())
        if survival is None or budget == 0:
            return budget, np.zeros(drafts.shape[0], dtype=np.int64), survival
        if budget >= total:
            return budget, drafts.copy(), survival
        return budget, admit_top_slots(survival.T.copy(), drafts, budget), survival

    def recut(
        self,
        survival: np.ndarray,
        num_drafts: int,
        num_reqs: int,
        num_tokens: int,
        num_sampling: int,
        depth: int,
        context_tokens: int = 0,
    ) -> int:
        """The budget of a step whose drafting requests' rows ``plan_ranking`` ranked
        ahead (``survival``: ``[m, K]``, those rows in any order, zeroed past each
        request's ``num_drafts`` in total, drafting at most ``depth`` deep), priced at
        this step's own shape: ``num_reqs`` requests and ``num_tokens`` non-draft tokens
        (a prompt chunk's included), ``num_sampling`` of them sampling. The best budget
        of that ranking at those prices, as ``plan`` prices a step (a prompt chunk's
        drafts at their marginal cost), without reading the slots' state again: the
        same budget as planning the step, whose drafting rows are these, when the
        look-ahead's batch-level shrink left them as the step's own would (always with
        ``predictiveness`` 1; the step's plan takes the rows of requests that do not
        draft into the batch mean as well). Only recorded confidences went into the
        rows, so it is as lossless as ``plan``."""
        k = self.num_positions
        if survival.ndim != 2 or survival.shape[1] != k:
            raise ValueError(f"survival must be [num_reqs, {k}], got shape {survival.shape}")
        num_drafts = as_non_negative_int("num_drafts", num_drafts)
        num_reqs = as_non_negative_int("num_reqs", num_reqs)
        if survival.shape[0] > num_reqs:
            raise ValueError(
                f"survival has {survival.shape[0]} rows, more than num_reqs={num_reqs}"
            )
        if not num_tokens >= num_reqs:
            raise ValueError(f"num_tokens must be at least num_reqs={num_reqs}, got {num_tokens}")
        if not 0 <= num_sampling <= num_reqs:
            raise ValueError(f"num_sampling must be in [0, {num_reqs}], got {num_sampling}")
        if not 0 <= depth <= k:
            raise ValueError(f"depth must be in [0, {k}], got {depth}")
        cap = draft_cap(num_drafts, num_reqs, self.max_total_logits, self.num_bonus_tokens)
        if cap == 0:
            return 0
        costs, _ = self._plan_costs(num_reqs, num_tokens, cap, context_tokens, depth)
        return best_budget(survival, cap, int(num_sampling), costs)

    def _planned_survival(
        self, slots, num_drafts, num_non_draft, num_sampling, context_tokens, ahead
    ) -> tuple[int, np.ndarray | None]:
        """``plan``'s budget and the ``[num_reqs, K]`` survival it ranked (None when
        nothing can be verified)."""
        slots = self._check_slots(slots)
        if ahead:  # the next record turns these stale, and snapshots the state as it is now
            rows = self._fresh.take(slots, axis=0)
            population, weight = self._population(), self._predictiveness
        else:
            rows = self._stale.take(slots, axis=0)
            population, weight = self._planning_state
        if weight < 1.0:
            _shrink_batch_level(rows, population, weight)
        priced = self._priced_plan(
            slots, num_drafts, num_non_draft, num_sampling, context_tokens, rows
        )
        if priced is None:
            return 0, None
        survival, costs, _ = priced
        return best_budget(survival, costs.shape[0] - 1, int(num_sampling), costs), survival

    def drafting_pays(
        self,
        slots: np.ndarray,
        num_drafts: np.ndarray,
        num_non_draft: np.ndarray,
        num_sampling: int,
        context_tokens: int = 0,
    ) -> int:
        """How deep to draft this step (0: do not run the drafter), decided before it runs.

        The seed always drafts the full block and then picks a budget, so the drafter's
        cost is paid even when the budget is zero, and in full even when the budget
        reaches one position deep. Here the plan is priced for every drafting depth
        ``d`` (positions past ``d`` neither drafted nor verified) with the drafter's cost
        at that depth (``draft_cost_ms(num_reqs, d)``), and the answer is the depth
        whose best budget expects the most tokens per millisecond, or 0 when none beats
        a step without the drafter (``best_drafting_depth``). A model that prices every
        depth alike gets the shallowest depth that holds its best plan's drafts.

        Only the latest *recorded* confidences are read (drafts already proposed, verified
        or being verified, never those of the step decided; a request with none recorded
        yet counts as the population's average, ``population_survival``), shrunk towards
        the population by ``predictiveness`` (module doc), so the decision cannot depend
        on the drafts it would produce; when the answer is 0, ``relax`` the slots. A cost
        model without ``draft_cost_ms`` keeps the seed's behaviour (draft whenever the
        budget is > 0), as deep as the budget could reach. ``probe_depth`` keeps the best
        drafted plan's depth even when the answer is 0 (an engine that probes drafting
        now and then, so that a learnt price can come back down, drafts that deep).
        """
        slots = self._check_slots(slots)
        latest = self._predicted(slots)
        priced = self._priced_plan(
            slots, num_drafts, num_non_draft, num_sampling, context_tokens, latest
        )
        self.probe_depth = 0
        if priced is None:
            return 0
        survival, costs, drafter_ms = priced
        if drafter_ms is None:
            budget = best_budget(survival, costs.shape[0] - 1, int(num_sampling), costs)
            return min(budget, self.num_positions)
        num_reqs = slots.shape[0]
        by_depth = getattr(self.cost_model, "draft_costs_by_depth", None)
        if by_depth is not None:
            draft_ms = by_depth(num_reqs, self.num_positions)
        else:
            draft = self.cost_model.draft_cost_ms
            draft_ms = np.array([draft(num_reqs, d) for d in range(self.num_positions + 1)])
            draft_ms[0] = 0.0  # an undrafted step pays no drafter
        rates = depth_rates(
            survival.reshape(num_reqs, self.num_positions),
            costs - drafter_ms,
            int(num_sampling),
            draft_ms,
        )
        best = int(rates[1:].argmax()) + 1  # the first maximum: ties go shallower
        self.probe_depth = best if np.isfinite(rates[best]) else 0
        return best if rates[best] > rates[0] else 0

    def predicted_survival(self, slots: np.ndarray) -> np.ndarray:
        """``[num_reqs, K]`` survival that ``drafting_pays`` expects of the slots' coming
        round (a copy): the latest recorded, the population's for a slot with none yet,
        shrunk towards the population by ``predictiveness``."""
        return self._predicted(self._check_slots(slots))

    def _predicted(self, slots: np.ndarray) -> np.ndarray:
        """``predicted_survival`` of slots already checked (the step's path checks once)."""
        latest = self._fresh.take(slots, axis=0)
        unrecorded = self._unrecorded.take(slots)
        population = self._population()
        if unrecorded.any():  # no track record yet: as the population's drafts survive
            latest[unrecorded] = population
        weight = self.predictiveness
        if weight < 1.0:  # the best linear prediction of the coming round (module doc)
            latest -= population
            latest *= weight
            latest += population
        return latest

    def _priced_plan(
        self, slots, num_drafts, num_non_draft, num_sampling, context_tokens, state=None
    ):
        """What the budget search needs, or None when nothing can be verified: the
        survival to rank (``[num_reqs, K]``, unscheduled positions zeroed), the step
        costs for budgets 0..cap and the drafter's share of them (None for a model
        without a drafter price; the drafter is priced at the deepest draft scheduled).
        ``state``: the slots' survival rows ``[num_reqs, K]`` (a copy, modified here),
        the stale ones unless given (``drafting_pays`` reads the latest recorded, which
        no draft of the coming step can have influenced)."""
        num_reqs = slots.shape[0]
        k = self.num_positions
        drafts = as_draft_counts("num_drafts", num_drafts, num_reqs, k)
        num_tokens = count_total("num_non_draft", num_non_draft, num_reqs)
        if not 0 <= num_sampling <= num_reqs:
            raise ValueError(f"num_sampling must be in [0, {num_reqs}], got {num_sampling}")
        cap = draft_cap(drafts.total, num_reqs, self.max_total_logits, self.num_bonus_tokens)
        if cap == 0:
            return None
        survival = self._stale.take(slots, axis=0) if state is None else state
        depth = k
        if not drafts.is_full:
            survival *= drafts.counts[:, None] > np.arange(k)
            depth = int(np.maximum.reduce(drafts.counts))
        costs, drafter_ms = self._plan_costs(num_reqs, num_tokens, cap, context_tokens, depth)
        return survival, costs, drafter_ms  # survival: [num_reqs, K]

    def _plan_costs(
        self, num_reqs: int, num_tokens: int, cap: int, context_tokens: int, depth: int
    ) -> tuple[np.ndarray, float | None]:
        """The step's cost for budgets ``0..cap`` as a plan prices it, and the drafter's
        share of it (None for a model without a drafter price; the drafter priced at
        ``depth``)."""
        costs = self.cost_model.step_costs_ms(num_reqs, num_tokens, cap, context_tokens)
        if num_tokens > num_reqs:
            # A prompt chunk shares the step: its tokens are computed whatever is drafted,
            # so drafts are priced at their marginal cost (after the chunk's tokens) over
            # the step of these requests' decodes alone (module doc).
            alone = self.cost_model.step_costs_ms(num_reqs, num_reqs, 0, context_tokens)
            costs = costs - (costs[0] - alone[0])
        drafter_ms = None
        draft_cost = getattr(self.cost_model, "draft_cost_ms", None)
        if draft_cost is not None:
            drafter_ms = full = draft_cost(num_reqs)
            if depth < self.num_positions:  # drafted shallower than the block: its price
                drafter_ms = draft_cost(num_reqs, depth)
                costs = costs + (drafter_ms - full)
        return costs, drafter_ms

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


def _shrink_batch_level(rows: np.ndarray, population: np.ndarray, weight: float) -> None:
    """In place, ``[n, K]`` survival rows: scale each position's rows so that their mean
    over the batch moves ``1 - weight`` of the way to ``population`` (ratios between rows
    kept; a position whose rows are all 0 takes the new mean), clipped at 1. Rows of the
    seed's prior (a request with no round recorded: every survival 1.0, which for a
    non-increasing row means its last one is) stay as they are and count in no mean."""
    is_prior = rows[:, -1] == 1.0
    num_prior = int(np.count_nonzero(is_prior))
    if num_prior == rows.shape[0]:
        return
    measured = rows[~is_prior] if num_prior else rows
    num_measured = measured.shape[0]
    mean = np.ones(num_measured) @ measured  # per-position sums (a matrix-vector product:
    mean /= num_measured  # several times faster than a reduction along the long axis)
    target = population - weight * population
    target += weight * mean
    empty = mean == 0.0
    if empty.any():  # nothing to scale: every row takes the new mean
        measured[:, empty] = target[empty]
        mean[empty] = target[empty] = 1.0
    target /= mean
    measured *= target
    np.minimum(measured, 1.0, out=measured)
    if num_prior:
        rows[~is_prior] = measured
