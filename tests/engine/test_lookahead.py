"""``dspark.engine.lookahead``: the budget a step takes from the plan made ahead."""

import numpy as np

from dspark.engine.lookahead import AheadShares, LookAhead
from dspark.engine.plan import BatchShape, BudgetSource, PricedStep
from dspark.scheduling import AdaptiveVerifier


class DepthCost:
    """Verifying costs per token and drafting per depth, fixed."""

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 8.0 + 0.1 * num_tokens + 0.4 * np.arange(max_drafts + 1) + self.draft_cost_ms(0)

    def draft_cost_ms(self, num_reqs, depth=None):
        return 0.5 + 0.2 * (7 if depth is None else depth)


def batch_of(slots, non_draft, num_decoding):
    return BatchShape(
        chunks=[],
        slots=np.array(slots),
        decode_index=np.arange(num_decoding),
        non_draft=np.array(non_draft, dtype=np.int64),
        num_sampling=num_decoding,
        context=0,
        slot_list=list(slots),
        decode_list=list(range(num_decoding)),
        num_tokens=int(sum(non_draft)),
    )


def test_a_shared_budget_covers_only_the_step_and_depth_planned_for():
    """By hand: each request's share capped at its drafts, within the logits room; None
    for another step, another depth or a request the look-ahead did not plan for. A step
    that carries a prompt chunk takes the look-ahead's survival rows of its decoding
    requests (in its own order, zero past each one's drafts) cut at its own prices."""
    verifier = AdaptiveVerifier(8, 7, DepthCost(), max_total_logits=1000)
    lookahead = LookAhead(verifier, 7)
    # The look-ahead planned slots 0, 1, 2 (rows in that order) 3 deep, K = 7: its rows
    # are zero past position 3.
    ranked = np.zeros((3, 7))
    ranked[:, :3] = [[0.5, 0.45, 0.4], [0.3, 0.1, 0.05], [0.9, 0.8, 0.7]]
    lookahead.shares = AheadShares(5, 3, {0: 3, 1: 2, 2: 0}, ranked, {0: 0, 1: 1, 2: 2})
    batch = batch_of([2, 0, 1], [1, 1, 1], 3)
    priced = PricedStep(3, 3, 3, 0)  # three requests, drafting 3 deep
    shares = BudgetSource.SHARES
    assert lookahead.shares_budget(batch, [3, 1, 3], priced, 5) == (0 + 1 + 2, shares)
    verifier.max_total_logits = 3 + 2  # two drafts beside the three bonus tokens
    assert lookahead.shares_budget(batch, [3, 3, 3], priced, 5) == (2, shares)
    verifier.max_total_logits = 1000
    assert lookahead.shares_budget(batch, [2, 2, 2], PricedStep(3, 3, 2, 0), 5) is None
    assert lookahead.shares_budget(batch, [3, 3, 3], priced, 6) is None  # another step
    # A prompt chunk of 5 tokens beside the three decodes (slot 3, not decoding), slot 0
    # drafting 1. ``DepthCost`` prices the step, with its chunk's tokens paid whatever is
    # drafted and the drafter 3 deep, at 9.5 + 0.4 b ms for b drafts; the rows give
    # 0.9, 0.8, 0.7, 0.5 (slot 0's first), 0.3, 0.1, 0.05, and (3 + their top-b sum) /
    # (9.5 + 0.4 b) peaks at b = 5 (6.2 / 11.5). Slot 0's rows past its one draft
    # counted (0.45, 0.4) would make it 7.
    mixed = batch_of([2, 0, 1, 3], [1, 1, 1, 5], 3)
    with_chunk = PricedStep(4, 8, 3, 0)
    assert lookahead.shares_budget(mixed, [3, 1, 3], with_chunk, 5) == (5, BudgetSource.RECUT)
    lookahead.shares = AheadShares(5, 3, {0: 3, 1: 2, 2: 0}, None, {0: 0, 1: 1, 2: 2})
    assert lookahead.shares_budget(mixed, [3, 1, 3], with_chunk, 5) is None  # none ranked
    unplanned = batch_of([2, 0, 3], [1, 1, 1], 3)  # slot 3 was not planned for
    assert lookahead.shares_budget(unplanned, [3, 3, 3], priced, 5) is None
