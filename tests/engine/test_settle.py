"""``dspark.engine.settle``: when the engine stops deciding, by hand."""

import numpy as np

from dspark.engine.settle import SETTLE_STEPS, SETTLE_WINDOW, Settler, StepCut


class DepthCost:
    """A draft's verification 0.4 ms, a depth of drafting 0.2 ms."""

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 8.0 + 0.1 * num_tokens + 0.4 * np.arange(max_drafts + 1) + self.draft_cost_ms(0)

    def draft_cost_ms(self, num_reqs, depth=None):
        return 0.5 + 0.2 * (7 if depth is None else depth)


def test_the_engine_settles_where_decisions_buy_less_than_they_cost():
    """Each decided step's host time 0.5 ms, a step of one request unless said (a draft
    more a request then costs 0.4 ms, less than a step's host time)."""
    settler = Settler(DepthCost())

    def weigh(depth, cut=None, host_ms=0.5, reqs=1):
        cut = None if cut is None else StepCut(reqs, reqs, 0, *cut)  # (budget, total)
        settler.weigh(depth, reqs, reqs, 0, reqs, cut, host_ms)
        return settler.steps_left, settler.depth

    # Cuts of one draft each: 16 x 0.4 = 6.4 ms bought for 16 x 0.5 = 8 ms: settles at
    # the window's full length, not before.
    settler.unsettle()
    assert [weigh(5, (9, 10))[0] for _ in range(SETTLE_WINDOW - 1)] == [0] * (SETTLE_WINDOW - 1)
    assert weigh(5, (9, 10)) == (SETTLE_STEPS, 5)
    assert settler.is_settled and settler.holds(1) and not settler.holds(3)
    # Cuts of two drafts (12.8 ms bought): never settles.
    settler.unsettle()
    assert {weigh(5, (8, 10))[0] for _ in range(3 * SETTLE_WINDOW)} == {0}
    # No cuts, depths 3 and 7 alternating: the lower median of the window is 3, and
    # eight steps 0.8 ms of drafting away from it buy 6.4 ms: below 8 ms, settles at 3;
    # with the host time measured at 0.3 ms a step (4.8 ms), not.
    settler.unsettle()
    for i in range(SETTLE_WINDOW):
        left, depth = weigh(3 if i % 2 else 7)
    assert (left, depth) == (SETTLE_STEPS, 3)
    settler.unsettle()
    for i in range(SETTLE_WINDOW):
        left, _ = weigh(3 if i % 2 else 7, host_ms=0.3)
    assert left == 0
    # Nothing cut and one depth throughout, but a draft more a request priced at or
    # above a step's host time: two requests (0.8 ms against 0.5), or one request whose
    # decision took 0.35 ms: never settles.
    settler.unsettle()
    assert {weigh(5, reqs=2)[0] for _ in range(2 * SETTLE_WINDOW)} == {0}
    settler.unsettle()
    assert {weigh(5, host_ms=0.35)[0] for _ in range(2 * SETTLE_WINDOW)} == {0}
    # One slow step (20 ms: a collection, the process descheduled) does not price
    # deciding up: a step's host time is the window's median. Two requests, cuts of two
    # drafts (0.8 ms bought a step against 0.5 ms): never settles, slow step or not.
    settler.unsettle()
    for i in range(2 * SETTLE_WINDOW):
        host_ms = 20.0 if i == SETTLE_WINDOW - 1 else 0.5
        assert weigh(5, (8, 10), host_ms=host_ms, reqs=2)[0] == 0
    # Once settled, the stretch runs its steps; ending it forgets the window.
    settler.unsettle()
    for _ in range(SETTLE_WINDOW):
        weigh(5)
    for _ in range(SETTLE_STEPS):
        settler.take_step()
    assert not settler.is_settled
    assert weigh(5)[0] == SETTLE_STEPS  # the window still holds: it settles again at once
    settler.unsettle()
    assert [weigh(5)[0] for _ in range(SETTLE_WINDOW)][-2:] == [0, SETTLE_STEPS]


def test_a_cut_beyond_the_cost_models_tables_is_taken_to_matter():
    class OutOfTables(DepthCost):
        def step_costs_ms(self, *args):
            raise ValueError("outside the tables")

    settler = Settler(OutOfTables())
    for _ in range(2 * SETTLE_WINDOW):
        settler.weigh(5, 1, 1, 0, 1, StepCut(1, 1, 0, 9, 10), 0.5)
    assert not settler.is_settled
