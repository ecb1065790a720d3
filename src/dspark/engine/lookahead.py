"""The look-ahead: the host's share of the policy while the device runs a step's forward.

On a device the forward runs asynchronously, and the host spends that time on what the
next step would otherwise do on its critical path: it records this step's round and
timings (nothing reads them in between), decides the next step's depth for the requests
that decode then, each at a full K (``drafting_pays`` on rounds recorded now: as
lossless as deciding then), and plans that step's budget (``plan_ranking``, from rounds
that the next round turns stale). The next step takes the budget as is when its batch is
exactly these decodes, each request's share when it lost some, and the plan's ranking
cut at its own prices when a prompt chunk joined.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark.engine.plan import BatchShape, BudgetSource, PricedStep
from dspark.engine.scheduler import ScheduledChunk
from dspark.scheduling import AdaptiveVerifier

REUSE_SHARE = 0.75
"""A batch that is not the decodes decided for still takes the depth decided ahead when
at least this share of its decoding requests were among them."""


@dataclass(slots=True)
class AheadDecision:
    """The next step's depth, decided during this step's forward."""

    step: int  # the step it is for
    slots: np.ndarray  # [n] slots of the requests it was decided for
    slot_list: list[int]
    depth: int
    probe_depth: int  # the best drafted depth, even where not drafting won
    budget: int | None  # for exactly these decodes, ``depth`` drafts each; None: none


@dataclass(slots=True)
class AheadShares:
    """The plan taken ahead, per request: for a next batch that is not exactly its own."""

    step: int
    depth: int
    share_of: dict[int, int]  # slot -> its admitted drafts in the plan
    survival: np.ndarray | None  # [n, K] the survival the plan ranked
    row_of: dict[int, int]  # slot -> its row of ``survival``


class LookAhead:
    """Decisions taken ahead, and the records that wait for the next forward."""

    def __init__(self, verifier: AdaptiveVerifier, num_drafts: int) -> None:
        self.verifier = verifier
        self.num_drafts = num_drafts
        self.decision: AheadDecision | None = None
        self.shares: AheadShares | None = None
        self.pending_round: tuple[np.ndarray, np.ndarray] | None = None  # slots, confidences
        self.pending_draft: tuple[int, float, int] | None = None  # requests, ms, depth
        self.pending_step: tuple[tuple, dict] | None = None  # ``record_step`` arguments
        self._marks = np.zeros(verifier.max_num_slots, dtype=bool)  # scratch, by slot

    def record_step_timing(self) -> None:
        """The last step's wall time, for the cost model."""
        if self.pending_step is not None:
            args, extra = self.pending_step
            self.verifier.cost_model.record_step(*args, **extra)
            self.pending_step = None

    def record_round(self) -> None:
        """This step's proposal time, then the round it drafted."""
        if self.pending_draft is not None:
            self.verifier.cost_model.record(*self.pending_draft)
            self.pending_draft = None
        if self.pending_round is not None:
            self.verifier.record(*self.pending_round)
            self.pending_round = None

    def decide_next(self, chunks: list[ScheduledChunk], step: int) -> None:
        """The depth and budget of step ``step + 1`` for the requests that decode then:
        this step's decodes and the prompts whose last chunk runs now."""
        self.shares = None
        decoding = [c for c in chunks if c.samples]
        if not decoding:
            return
        exact = len(decoding) == len(chunks)  # the next batch can be exactly these
        num_reqs = len(decoding)
        slot_list = [c.request.slot for c in decoding]
        slots = np.array(slot_list, dtype=np.int64)
        # Their context next step (a decode adds its token; accepted drafts are not known).
        context = sum(c.request.num_computed + c.num_tokens for c in decoding)
        ones = np.ones(num_reqs, dtype=np.int64)
        verifier = self.verifier
        depth = verifier.drafting_pays(slots, ones * self.num_drafts, ones, num_reqs, context)
        probe_depth = verifier.probe_depth
        budget = None
        if depth:
            budget, shares, ranked = verifier.plan_ranking(
                slots, ones * depth, ones, num_reqs, context
            )
            self.shares = AheadShares(
                step + 1,
                depth,
                dict(zip(slot_list, shares.tolist(), strict=True)),
                ranked,
                dict(zip(slot_list, range(num_reqs), strict=True)),
            )
            if not exact:
                budget = None
        elif exact:
            budget = 0
        self.decision = AheadDecision(step + 1, slots, slot_list, depth, probe_depth, budget)

    def take_decision(self, step: int) -> AheadDecision | None:
        """The decision for ``step``, once; None if it was for a step that never ran."""
        decision, self.decision = self.decision, None
        return decision if decision is not None and decision.step == step else None

    def reuses(self, decision: AheadDecision, decoding: np.ndarray) -> bool:
        """Whether a batch whose decoding requests sit in ``decoding`` takes ``decision``'s
        depth though it is not exactly the batch decided for."""
        if decoding.shape[0] == 0:
            return False
        marks = self._marks  # all False between calls; cheaper than np.isin, which sorts
        marks[decision.slots] = True
        known = np.count_nonzero(marks[decoding])
        marks[decision.slots] = False
        return known >= REUSE_SHARE * decoding.shape[0]

    def shares_budget(
        self, batch: BatchShape, counts: list[int], priced: PricedStep | None, step: int
    ) -> tuple[int, BudgetSource] | None:
        """The budget the plan ahead gives this step without planning it (``counts``:
        drafts per decoding request), or None where that plan does not cover it. Decodes
        alone take the sum of their shares; a step with a prompt chunk takes the plan's
        ranking of its decodes cut at its own prices (``AdaptiveVerifier.recut``), since
        the chunk's tokens move the step along the captured sizes."""
        shares = self.shares
        if shares is None or shares.step != step or not counts:
            return None
        if priced is None or priced.depth != shares.depth:
            return None
        slot_list = batch.slot_list
        if priced.num_tokens != priced.num_reqs:
            if shares.survival is None:
                return None
            rows = [shares.row_of.get(slot_list[i]) for i in batch.decode_list]
            if None in rows:
                return None
            picked = shares.survival[rows]  # a copy, in decoding order
            if min(counts) < shares.depth:  # a request near its length limit drafted fewer
                picked *= np.arange(picked.shape[1]) < np.array(counts)[:, None]
            budget = self.verifier.recut(
                picked,
                num_drafts=sum(counts),
                num_reqs=priced.num_reqs,
                num_tokens=priced.num_tokens,
                num_sampling=batch.num_sampling,
                depth=max(counts),
                context_tokens=batch.context,
            )
            return budget, BudgetSource.RECUT
        budget = 0
        for i, count in zip(batch.decode_list, counts, strict=True):
            share = shares.share_of.get(slot_list[i])
            if share is None:
                return None
            budget += min(share, count)
        # Within what the logits buffer leaves room for, as any plan is.
        verifier = self.verifier
        room = verifier.max_total_logits - len(slot_list) * verifier.num_bonus_tokens
        return max(0, min(budget, room)), BudgetSource.SHARES
