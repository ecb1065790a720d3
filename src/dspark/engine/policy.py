"""The adaptive policy: every step's drafting depth, draft budget and allocation.

``AdaptivePolicy.plan_step`` runs a step's drafting phase and returns its ``StepPlan``:

1. **Depth.** A settled stretch drafts its depth undecided (``settle.Settler``). Otherwise
   the depth decided during the last forward (``lookahead``) or now:
   ``AdaptiveVerifier.drafting_pays`` prices the best budget at every depth from the
   latest *recorded* confidences, against not drafting; the throughput gate
   (``ThroughputGate``) may veto drafting or probe it.
2. **Proposal** that deep (the engine's ``propose``).
3. **Budget** from the *stale* confidences (``AdaptiveVerifier.plan``): planned during the
   last forward, while the drafter ran, from the plan ahead's shares or ranking, or in
   the step; then raised into the padding of the CUDA graph the step replays.
4. **Allocation**: the budget's slots of highest *fresh* survival (``allocate_drafts``).

Every decision reads confidences of drafts already proposed and timings of steps already
run, never the drafts being verified: sampling stays lossless (``dspark.scheduling``).
After the step, ``finish_step`` hands its timing to the gate and the cost model and
weighs settling.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from dspark.engine.config import EngineConfig, switched_on
from dspark.engine.graphs import PaddedStepRunner
from dspark.engine.lookahead import LookAhead
from dspark.engine.plan import (
    BatchShape,
    BudgetSource,
    PricedStep,
    ProposalRun,
    StepPlan,
    batch_shape,
    elapsed_ms,
)
from dspark.engine.scheduler import ScheduledChunk
from dspark.engine.settle import Settler, StepCut
from dspark.engine.speculative import OnlineAcceptance, Proposal
from dspark.engine.stats import EngineStats
from dspark.scheduling import AdaptiveVerifier, ObservedDraftCost, ThroughputGate, allocate_drafts

Propose = Callable[[np.ndarray, Callable[[], None] | None], ProposalRun]
"""The engine's proposal: drafts up to ``limits[r]`` per decoding request, timed; a host
callable to run while the drafter's device work is queued, or None."""

PLAN_STATS = {
    BudgetSource.AHEAD: "lookahead_plans",
    BudgetSource.DRAFTING: "drafting_plans",
    BudgetSource.SHARES: "share_plans",
    BudgetSource.RECUT: "recut_plans",
}


class AdaptivePolicy:
    """Decides each step's drafting for an engine with adaptive verification."""

    def __init__(
        self,
        config: EngineConfig,
        verifier: AdaptiveVerifier,
        stats: EngineStats,
        acceptance: OnlineAcceptance,
        *,
        on_cuda: bool,
        graphs: PaddedStepRunner | None,
        overlaps_drafting: bool,
    ) -> None:
        adaptive = config.adaptive
        self.verifier = verifier
        self.cost_model = verifier.cost_model
        self.stats = stats
        self.num_drafts = config.num_drafts
        self.acceptance = acceptance  # confidences for drafters without a head
        self.gate = ThroughputGate() if adaptive.throughput_gate else None
        self.lookahead = (
            LookAhead(verifier, config.num_drafts)
            if switched_on(adaptive.lookahead, on_cuda)
            else None
        )
        self.settler = Settler(self.cost_model) if switched_on(adaptive.settle, on_cuda) else None
        # Padding is computed only where a graph replays it: not on the CPU's padded steps.
        fills = adaptive.fill_padding and graphs is not None and graphs.capture
        self.fill_graphs = graphs if fills else None
        # Whether the drafter runs host work while its device passes run (``Drafter``).
        self.overlaps_drafting = overlaps_drafting and self.lookahead is not None
        self.plan = StepPlan()  # the step under way
        self._step = 0
        self._num_decoding = 0
        self._priced: PricedStep | None = None
        self._cut: StepCut | None = None
        self._early: tuple[int, list[int], int, BudgetSource] | None = None  # planned early
        self._to_relax: np.ndarray | None = None  # slots of an undrafted step

    # ---- requests -------------------------------------------------------------------

    def admit(self, slot: int) -> None:
        self.verifier.add_request(slot)

    def release(self, slot: int) -> None:
        self._relax_pending()  # it may hold this slot
        self.verifier.remove_request(slot)

    def idle(self) -> None:
        """No request is left: whatever comes next is weighed afresh."""
        if self.settler is not None:
            self.settler.unsettle()

    @property
    def settled_depth(self) -> int:
        """The depth drafting steps draft undecided now; 0 while every step decides."""
        settler = self.settler
        return settler.depth if settler is not None and settler.is_settled else 0

    # ---- a step ---------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """A new step: nothing decided yet. A round or timing still waiting for the
        look-ahead was left by a step that failed before its forward."""
        self._step = step
        self._priced = self._cut = None
        self.plan = StepPlan()
        if self.lookahead is not None:
            self.lookahead.pending_round = self.lookahead.pending_draft = None

    def plan_step(
        self,
        chunks: list[ScheduledChunk],
        decode_index: list[int],
        limits: np.ndarray,
        propose: Propose,
    ) -> StepPlan:
        """The step's drafting phase (module doc) for a batch with decoding requests:
        ``limits[r]`` is the most drafts the r-th of them may take (K, its token room, its
        length limit)."""
        self._num_decoding = len(decode_index)
        plan = self.plan
        settler = self.settler
        if settler is not None and settler.is_settled and not settler.holds(len(decode_index)):
            settler.unsettle()
        if settler is not None and settler.is_settled:
            return self._settled_step(plan, chunks, decode_index, limits, propose)
        begin = time.perf_counter()
        batch = batch_shape(chunks, decode_index)
        shaped = time.perf_counter()
        depth = self._decide_depth(batch, limits)
        plan.decided = True
        plan.shape_ms, plan.decide_ms = (shaped - begin) * 1e3, elapsed_ms(shaped)
        self.stats.schedule_ms.append(plan.shape_ms + plan.decide_ms)
        if depth == 0:
            self.stats.undrafted_steps += 1
            return plan
        limits = np.minimum(limits, depth)
        plan.depth = int(limits.max())
        begin = time.perf_counter()
        overlap = self._plan_while_drafting(batch, limits)
        plan.plan_ms = elapsed_ms(begin)
        run = propose(limits, overlap)
        self._learn_proposal(len(chunks), run, plan.depth)
        plan.proposal = run.proposal
        self._admit(batch, _drafted(run.proposal, limits), plan)
        return plan

    def _settled_step(self, plan, chunks, decode_index, limits, propose) -> StepPlan:
        """A step of the settled stretch: its depth, every draft verified; the stretch's
        last step hands the verifier its round, as a decided step would, so the next
        decision reads this round's confidences."""
        settler = self.settler
        limits = np.minimum(limits, settler.depth)
        if not limits.any():  # every request at its length limit: nothing to draft
            return plan
        settler.take_step()
        self.stats.settled_steps += 1
        plan.settled = True
        plan.depth = int(limits.max())
        run = propose(limits, None)
        plan.proposal = run.proposal
        plan.admitted = _drafted(run.proposal, limits)
        plan.source = BudgetSource.ALL
        if not settler.is_settled:
            self._learn_proposal(len(chunks), run, plan.depth)
            rows = self._confidence_rows(run.proposal, len(decode_index))
            slots = np.array([chunks[i].request.slot for i in decode_index], dtype=np.int64)
            self._hand_round(slots, rows, plan.admitted)
        return plan

    def _decide_depth(self, batch: BatchShape, limits: np.ndarray) -> int:
        """How deep to draft (0: not at all); see the module doc. An undrafted step's
        requests are relaxed (``AdaptiveVerifier.relax``): nothing is recorded for them, so
        they are retried as the population suggests, never given up for good."""
        self._relax_pending()  # left by a step that failed before its forward
        verifier = self.verifier
        num_reqs = batch.num_reqs
        decision = None if self.lookahead is None else self.lookahead.take_decision(self._step)
        if (
            decision is not None
            and decision.budget is not None
            and batch.num_sampling == num_reqs == len(batch.decode_list)
            and decision.slot_list == batch.slot_list
            # Decided for limits of K: the same answer for any limits that leave room for
            # the best drafted depth.
            and int(limits.min()) >= decision.probe_depth
        ):
            depth, verifier.probe_depth = decision.depth, decision.probe_depth
            self.stats.lookahead_hits += 1
            if depth:
                counts = [depth] * num_reqs
                self._early = (self._step, counts, decision.budget, BudgetSource.AHEAD)
        elif decision is not None and self.lookahead.reuses(
            decision, batch.slots[batch.decode_index]
        ):
            depth, verifier.probe_depth = decision.depth, decision.probe_depth
            self.stats.lookahead_reused += 1
        else:
            num_drafts = np.zeros(num_reqs, dtype=np.int64)
            num_drafts[batch.decode_index] = limits
            depth = verifier.drafting_pays(
                batch.slots, num_drafts, batch.non_draft, batch.num_sampling, batch.context
            )
        mixed = batch.num_tokens != num_reqs  # a prompt chunk shares the step
        gate = self.gate
        if depth and gate is not None and not gate.should_draft(num_reqs, mixed):
            depth = 0  # measured: undrafted steps emit more tokens per ms at this size
            self.stats.gate_vetoes += 1
        elif not depth and gate is not None and gate.should_probe(num_reqs, mixed):
            depth = verifier.probe_depth  # keep the price of drafting measured
            self.stats.probes += bool(depth)
            self.plan.probe = bool(depth)
        self.stats.depth_steps[depth] += 1
        self._priced = PricedStep(num_reqs, batch.num_tokens, depth, batch.context)
        if depth == 0:
            self._to_relax = batch.slots[batch.decode_index]
            if self.lookahead is None:
                self._relax_pending()
        return depth

    def _plan_while_drafting(self, batch: BatchShape, limits: np.ndarray):
        """The budget, planned while the drafter's device passes run, where nothing planned
        it earlier: the look-ahead's shares or ranking when they cover the batch, else
        ``plan`` on the recorded rounds (``_admit`` takes it if the drafts are these)."""
        early = self._early
        if not self.overlaps_drafting or (early is not None and early[0] == self._step):
            return None
        counts = limits.tolist()
        step = self._step

        def plan() -> None:
            start = time.perf_counter()
            shared = self.lookahead.shares_budget(batch, counts, self._priced, step)
            if shared is None:
                shared = self._plan_budget(batch, counts), BudgetSource.DRAFTING
            self._early = (step, counts, *shared)
            self.stats.lookahead_ms.append(elapsed_ms(start))

        return plan

    def _admit(self, batch: BatchShape, counts: list[int], plan: StepPlan) -> None:
        """The budget (stale confidences), its padding fill, then the allocation (fresh)."""
        start = time.perf_counter()
        rows = self._confidence_rows(plan.proposal, len(counts))
        total = sum(counts)
        early, self._early = self._early, None
        if early is not None and early[0] == self._step and early[1] == counts:
            budget, source = early[2], early[3]
        else:
            shared = None
            if self.lookahead is not None:
                shared = self.lookahead.shares_budget(batch, counts, self._priced, self._step)
            budget, source = shared or (self._plan_budget(batch, counts), BudgetSource.STEP)
        if source in PLAN_STATS:
            name = PLAN_STATS[source]
            setattr(self.stats, name, getattr(self.stats, name) + 1)
        self._hand_round(batch.slots[batch.decode_index], rows, counts)
        if budget < total and self.fill_graphs is not None:
            budget = self._filled_budget(batch, counts, budget, total)
        self.stats.budgets.append(budget)
        admitted = counts
        if budget < total:
            if self.settler is not None:  # priced at the step's end
                self._cut = StepCut(batch.num_reqs, batch.num_tokens, batch.context, budget, total)
            self.stats.budget_cuts += 1
            if budget <= 0:
                admitted = [0] * len(counts)
            else:  # positions no request drafted never win: ranked without them
                deepest = max(counts)
                admitted = allocate_drafts(rows[:, :deepest], np.array(counts), budget).tolist()
        plan.budget, plan.admitted, plan.source = budget, admitted, source
        plan.schedule_ms = elapsed_ms(start)
        self.stats.schedule_ms.append(plan.schedule_ms)

    def _plan_budget(self, batch: BatchShape, counts: list[int]) -> int:
        """``plan(..., ahead=True)``: the budget from what recording this round turns stale."""
        num_drafts = np.zeros(batch.num_reqs, dtype=np.int64)
        num_drafts[batch.decode_index] = counts
        return self.verifier.plan(
            batch.slots, num_drafts, batch.non_draft, batch.num_sampling, batch.context, ahead=True
        )

    def _filled_budget(self, batch: BatchShape, counts: list[int], budget: int, total: int) -> int:
        """The budget raised to as many drafts as the step's CUDA graph has room for: its
        tokens pad to a captured size (or a larger shape covering its own), and the
        device computes that padding anyway. The graph is looked up with every request's
        key span counted with all its drafts, so the step fits it whichever drafts the
        allocation admits; nothing here reads this round's confidences, and top-b sets
        nest, so every draft the budget admitted stays admitted."""
        runner = self.fill_graphs
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
        filled = min(total, runner.fill_shape(shape).num_tokens - batch.num_tokens)
        if filled <= budget:
            return budget
        self.stats.filled_steps += 1
        self.stats.filled_drafts += filled - budget
        return filled

    def _confidence_rows(self, proposal: Proposal, num_decoding: int) -> np.ndarray:
        confidences = proposal.confidences
        if confidences is None:
            confidences = self.acceptance.confidences(num_decoding)
        return np.asarray(confidences)[:, : self.num_drafts]

    def _hand_round(self, slots: np.ndarray, rows: np.ndarray, counts: list[int]) -> None:
        """Record the round of the requests that drafted (one at its length limit proposed
        none); with the look-ahead, during the forward."""
        if all(counts):  # the usual case: no copies to select the drafted rows
            drafted = (slots, rows)
        elif any(counts):
            mask = np.array(counts) > 0
            drafted = (slots[mask], rows[mask])
        else:
            return
        if self.lookahead is not None:
            self.lookahead.pending_round = drafted
        else:
            self.verifier.record(*drafted)

    def _learn_proposal(self, num_reqs: int, run: ProposalRun, depth: int) -> None:
        """The proposal's time, for the drafter's price (a capture is no measure of it)."""
        if not isinstance(self.cost_model, ObservedDraftCost) or depth <= 0 or run.captured:
            return
        if self.lookahead is not None:
            self.lookahead.pending_draft = (num_reqs, run.ms, depth)
        else:
            self.cost_model.record(num_reqs, run.ms, depth)

    def _relax_pending(self) -> None:
        if self._to_relax is not None:
            slots, self._to_relax = self._to_relax, None
            self.verifier.relax(slots)

    # ---- around the forward and after the step --------------------------------------

    def look_ahead(self, chunks: list[ScheduledChunk]) -> None:
        """While the device computes this step's forward (``lookahead``)."""
        lookahead = self.lookahead
        if lookahead is None or (self.plan.settled and self.settler.is_settled):
            return  # off, or the next step is settled too
        start = time.perf_counter()
        lookahead.record_step_timing()
        self._relax_pending()
        lookahead.record_round()
        lookahead.decide_next(chunks, self._step)
        self.stats.lookahead_ms.append(elapsed_ms(start))

    def finish_step(
        self, wall_ms: float, emitted: int, num_drafts: int, captured: bool, padded: int
    ) -> None:
        """The step ran for ``wall_ms`` (its held-back upkeep's share included) and emitted
        ``emitted`` tokens, verifying ``num_drafts`` drafts; ``padded``: tokens its forward
        ran on a larger graph than its own."""
        priced, plan = self._priced, self.plan
        if priced is None:  # undecided: settled, or nothing to decode
            return
        if self.settler is not None:
            if priced.depth == 0 or plan.probe:
                self.settler.unsettle()  # drafting, or its depth, is in question again
            else:
                host_ms = plan.shape_ms + plan.decide_ms + plan.schedule_ms
                settler = self.settler
                if settler.weigh(
                    priced.depth,
                    priced.num_reqs,
                    priced.num_tokens,
                    priced.context,
                    self._num_decoding,
                    self._cut,
                    host_ms,
                ):
                    self.stats.settles += 1
        if captured or not priced.num_tokens >= priced.num_reqs > 0:
            return  # a step that captured a graph is not a typical step of its kind
        mixed = priced.num_tokens != priced.num_reqs
        if self.gate is not None:  # steps with a prompt chunk in buckets of their own
            self.gate.record(priced.num_reqs, priced.depth > 0, emitted, wall_ms, mixed, plan.probe)
        record_step = getattr(self.cost_model, "record_step", None)
        if record_step is None or mixed:  # the cost model learns from decoding steps
            return
        args = (priced.num_reqs, priced.num_tokens, num_drafts, priced.depth, wall_ms)
        args += (priced.context,)
        extra = {"padded_tokens": padded} if padded else {}
        if self.lookahead is not None:  # learnt while the next step's forward runs
            self.lookahead.pending_step = (args, extra)
        else:
            record_step(*args, **extra)


def _drafted(proposal: Proposal, limits: np.ndarray) -> list[int]:
    """Drafts per decoding request: its proposal up to its limit."""
    return [len(tokens[:limit]) for tokens, limit in zip(proposal.tokens, limits, strict=True)]
