"""Settling: stop deciding every step where deciding buys less than it costs.

Deciding (the batch's shape, the depth decision, the budget and the cut) costs host time
on every drafted step, and on a launch-bound target it buys little back. Once
``SETTLE_WINDOW`` decided steps in a row drafted and the cost model prices what their
decisions bought below what they cost on the host, the next ``SETTLE_STEPS`` drafting
steps draft the window's lower median depth and verify every draft, as a fixed K does;
then one step decides again and is weighed with the window. As lossless as any step that
verifies every draft it proposed.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import NamedTuple

SETTLE_WINDOW = 16
"""Decided drafting steps weighed before settling."""

SETTLE_STEPS = 32
"""Drafting steps run at the settled depth, undecided, before one decides again."""


class StepCut(NamedTuple):
    """A step's budget below its drafts: what a cut prices against verifying them all."""

    num_reqs: int
    num_tokens: int  # non-draft tokens
    context: int  # tokens cached over the batch
    budget: int
    total: int  # drafts proposed


def cut_saving_ms(cost_model, cut: StepCut) -> float:
    """Forward time the cost model prices ``cut`` to save; infinite beyond its tables (the
    cut is taken to matter). The drafter's share does not depend on the budget, so the
    target's tables alone (``ObservedDraftCost.base``) price the difference."""
    model = getattr(cost_model, "base", cost_model)
    try:
        costs = model.step_costs_ms(cut.num_reqs, cut.num_tokens, cut.total, cut.context)
    except ValueError:
        return math.inf
    return float(costs[cut.total] - costs[max(cut.budget, 0)])


class Settler:
    """The settle window and the settled stretch under way."""

    def __init__(self, cost_model) -> None:
        self.cost_model = cost_model
        # Latest decided drafting steps: (depth, requests, decoding requests, the cut's
        # priced saving, the decision's host ms).
        self._window: deque[tuple[int, int, int, float, float]] = deque(maxlen=SETTLE_WINDOW)
        self.depth = 0  # the settled depth
        self._num_decoding = 0.0  # the window's median of decoding requests
        self.steps_left = 0

    @property
    def is_settled(self) -> bool:
        return self.steps_left > 0

    def holds(self, num_decoding: int) -> bool:
        """Whether the stretch suits a batch of ``num_decoding`` decoding requests: half to
        twice the window's (a stretch weighed at one request must not carry 256)."""
        return self._num_decoding / 2 <= num_decoding <= 2 * self._num_decoding

    def take_step(self) -> None:
        self.steps_left -= 1

    def unsettle(self) -> None:
        """End the stretch and forget the window: its batch is gone, or drafting is in
        question again."""
        self.steps_left = 0
        self._window.clear()

    def weigh(
        self,
        depth: int,
        num_reqs: int,
        num_tokens: int,
        context: int,
        num_decoding: int,
        cut: StepCut | None,
        host_ms: float,
    ) -> bool:
        """A decided drafting step ends: log it, and settle when the last ``SETTLE_WINDOW``
        decided steps bought less than their host time. Bought, at the cost model's prices:
        the forward time their cuts saved, and the drafter time between each step's depth
        and the window's lower median. And a bound on what deciding could buy: one draft
        more a decoding request must also be priced below one step's host time (where it
        is not, a large target's forward grows with its tokens, and per-step decisions
        move the depth and cut by amounts that matter). True when it settles."""
        window = self._window
        saving = 0.0 if cut is None else cut_saving_ms(self.cost_model, cut)
        window.append((depth, num_reqs, num_decoding, saving, host_ms))
        if len(window) < SETTLE_WINDOW:
            return False
        # The median step: one slow step (a collection, a descheduled process) must not
        # price deciding up for the stretches it stays in the window.
        step_ms = statistics.median(entry[4] for entry in window)
        host = step_ms * len(window)
        bought = sum(entry[3] for entry in window)
        if bought >= host:
            return False
        settled = sorted(entry[0] for entry in window)[(len(window) - 1) // 2]  # lower median
        drafts = num_decoding * settled
        deeper = StepCut(num_reqs, num_tokens, context, drafts, drafts + num_decoding)
        if cut_saving_ms(self.cost_model, deeper) >= step_ms:
            return False
        price = getattr(self.cost_model, "draft_cost_ms", None)
        if price is not None:  # priced by the step's requests, as drafter times are recorded
            for entry_depth, entry_reqs, *_ in window:
                if entry_depth != settled:
                    bought += abs(price(entry_reqs, entry_depth) - price(entry_reqs, settled))
            if bought >= host:
                return False
        self.depth = settled
        self._num_decoding = statistics.median(entry[2] for entry in window)
        self.steps_left = SETTLE_STEPS
        return True
