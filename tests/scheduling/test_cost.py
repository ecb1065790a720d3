from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dspark.scheduling import CostTables, StepCostModel, build_cost_tables
from dspark.scheduling.cost import VERIFY_FLOOR_MS


def test_below_graph_limit_cost_is_step_function_of_padded_size():
    tables = build_cost_tables([(1, 0.5)], [(1, 1.0), (4, 2.0), (8, 4.0)], 1, 8, cudagraph_limit=8)
    # Size n costs the smallest profiled size >= n; size 0 pads to the first point.
    assert tables.verify_ms.tolist() == [1.0, 1.0, 2.0, 2.0, 2.0, 4.0, 4.0, 4.0, 4.0]


def test_above_graph_limit_interpolates_without_blending_across_it():
    verify = [(4, 1.0), (8, 2.0), (12, 10.0), (16, 14.0)]
    tables = build_cost_tables([(1, 0.0)], verify, 1, 20, cudagraph_limit=8)
    v = tables.verify_ms
    assert v[8] == 2.0
    # 9..11 lie between the limit and the first point above it: they take that point's
    # cost (no blend with the 2.0 below the limit).
    assert v[9:13].tolist() == [10.0, 10.0, 10.0, 10.0]
    assert v[14] == pytest.approx(12.0)  # halfway between 12 and 16
    # Past the last point: slope of the last two points, 1 ms/token.
    assert v[17:21].tolist() == pytest.approx([15.0, 16.0, 17.0, 18.0])


def test_without_graph_limit_extrapolates_linearly_only_past_last_point():
    tables = build_cost_tables([(1, 0.0)], [(2, 1.0), (4, 3.0)], 1, 6)
    assert tables.verify_ms.tolist() == pytest.approx([1.0, 1.0, 1.0, 3.0, 3.0, 4.0, 5.0])


def test_non_monotone_curve_is_made_non_decreasing():
    tables = build_cost_tables([(1, 1.0), (2, 0.5), (4, 2.0)], [(1, 3.0), (2, 1.0)], 4, 2)
    assert tables.verify_ms.tolist() == [3.0, 3.0, 3.0]
    # Drafts: running max [1, 1, 2] with extrapolated slope (2-1)/(4-2) = 0.5.
    assert tables.draft_ms.tolist() == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_floors_keep_draft_non_negative_and_verify_positive():
    tables = build_cost_tables([(1, 0.0)], [(1, 0.0), (2, 0.0)], 2, 3)
    assert tables.verify_ms.min() == VERIFY_FLOOR_MS
    assert tables.draft_ms.min() == 0.0


@pytest.mark.parametrize(
    ("curve", "message"),
    [
        ([], "empty"),
        ([(1, float("nan"))], "finite"),
        ([(1, float("inf"))], "finite"),
        ([(4, 1.0), (2, 2.0)], "ascending"),
        ([(2, 1.0), (2, 2.0)], "ascending"),
        ([(-1, 1.0)], "non-negative integers"),
        ([(1.5, 1.0)], "non-negative integers"),
        ([(1, -1.0)], "non-negative"),
        ([(1, 2.0, 3.0)], "pairs"),
    ],
)
def test_bad_curves_are_value_errors_naming_the_curve(curve, message):
    with pytest.raises(ValueError, match=f"verify_curve.*{message}|{message}.*verify_curve"):
        build_cost_tables([(1, 1.0)], curve, 4, 4)


def test_step_costs_are_draft_plus_verify_and_bounds_are_checked():
    tables = build_cost_tables([(1, 0.5), (2, 0.75)], [(1, 1.0), (8, 8.0)], 2, 8)
    assert isinstance(tables, StepCostModel)
    costs = tables.step_costs_ms(num_reqs=2, num_tokens=2, max_drafts=3)
    assert costs.tolist() == [8.75] * 4
    with pytest.raises(ValueError, match="outside the cost tables"):
        tables.step_costs_ms(num_reqs=2, num_tokens=6, max_drafts=3)
    with pytest.raises(ValueError, match="outside the cost tables"):
        tables.step_costs_ms(num_reqs=3, num_tokens=1, max_drafts=0)


def test_tables_are_read_only():
    tables = build_cost_tables([(1, 0.5)], [(1, 1.0)], 1, 1)
    with pytest.raises(ValueError):
        tables.verify_ms[0] = 0.0


curves = st.lists(
    st.tuples(st.integers(0, 300), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=8
).map(lambda pts: sorted({s: c for s, c in pts}.items()))


@given(curves, curves, st.integers(0, 256))
def test_tables_are_non_decreasing_and_match_profiled_points(draft, verify, limit):
    tables = build_cost_tables(draft, verify, 64, 512, cudagraph_limit=limit)
    assert isinstance(tables, CostTables)
    for table in (tables.draft_ms, tables.verify_ms):
        assert (np.diff(table) >= -1e-9).all()
    running_max = np.maximum.accumulate([c for _, c in verify])
    for (size, _), cost in zip(verify, running_max, strict=True):
        if size <= 512:
            assert tables.verify_ms[size] == pytest.approx(max(cost, VERIFY_FLOOR_MS))


def test_observed_draft_cost_follows_measurements_and_never_undercuts_the_profile():
    from dspark.scheduling.cost import ObservedDraftCost

    tables = build_cost_tables([(1, 1.0), (8, 2.0)], [(1, 5.0), (64, 5.0)], 8, 64)
    cost = ObservedDraftCost(tables, decay=0.5)
    base = tables.step_costs_ms(4, 4, 10)
    np.testing.assert_allclose(cost.step_costs_ms(4, 4, 10), base)  # nothing measured yet
    cost.record(4, 10.0)
    profiled = tables.draft_cost_ms(4)
    assert cost.draft_cost_ms(4) == 10.0
    np.testing.assert_allclose(cost.step_costs_ms(4, 4, 10), base + 10.0 - profiled)
    cost.record(4, 2.0)  # exponential average: 0.5 * 10 + 0.5 * 2
    assert cost.draft_cost_ms(4) == 6.0
    # An unmeasured count scales its profiled cost by the nearest measured ratio.
    assert cost.draft_cost_ms(8) == pytest.approx(tables.draft_cost_ms(8) * 6.0 / profiled)
    cost.record(2, 0.0)  # faster than profiled: the profile stands
    assert cost.draft_cost_ms(2) == tables.draft_cost_ms(2)
    with pytest.raises(ValueError, match="drafting_ms"):
        cost.record(4, float("nan"))


def test_depth_costs_interpolate_between_profiled_depths_and_never_fall():
    from dspark.scheduling import build_depth_costs

    # Depth 1 and 4 profiled at 1 and 4 requests; K = 5 (depth 5 takes depth 4's cost).
    curves = {1: [(1, 1.0), (4, 2.0)], 4: [(1, 4.0), (4, 8.0)]}
    table = build_depth_costs(curves, 5, 4)
    assert table.shape == (6, 5)
    assert table[0].tolist() == [0.0] * 5  # no drafting costs nothing
    assert table[1:, 1].tolist() == [1.0, 2.0, 3.0, 4.0, 4.0]
    assert table[1:, 4].tolist() == [2.0, 4.0, 6.0, 8.0, 8.0]
    # Between profiled request counts: the seed's draft table (next profiled count up).
    assert table[2, 3] == table[2, 4]
    # A deeper draft never costs less, even when the profile says so.
    inverted = build_depth_costs({1: [(1, 5.0)], 2: [(1, 3.0)]}, 2, 1)
    assert inverted[1:, 1].tolist() == [5.0, 5.0]
    with pytest.raises(ValueError, match=r"depths in 1..3"):
        build_depth_costs({4: [(1, 1.0)]}, 3, 4)
    with pytest.raises(ValueError, match="curves"):
        build_depth_costs({1: []}, 3, 4)


def test_observed_draft_cost_prices_each_depth_and_scales_them_alike():
    from dspark.scheduling import build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    tables = build_cost_tables([(1, 4.0), (8, 8.0)], [(1, 5.0), (64, 5.0)], 8, 64)
    depth = build_depth_costs({1: [(1, 1.0), (8, 2.0)], 4: [(1, 4.0), (8, 8.0)]}, 4, 8)
    cost = ObservedDraftCost(tables, decay=0.5, depth_ms=depth)
    assert cost.draft_cost_ms(1, 1) == 1.0
    assert cost.draft_cost_ms(1, 2) == 2.0
    assert cost.draft_cost_ms(1) == 4.0  # no depth: the full block, the base table's
    # Measured at depth 2 twice the profile: every depth at that count costs twice.
    cost.record(1, 4.0, depth=2)
    assert cost.draft_cost_ms(1, 1) == 2.0
    assert cost.draft_cost_ms(1, 4) == 8.0
    np.testing.assert_allclose(cost.step_costs_ms(1, 1, 3), tables.step_costs_ms(1, 1, 3) + 4.0)
    with pytest.raises(ValueError, match="depth_ms"):
        ObservedDraftCost(tables, depth_ms=np.ones(3))


def test_measured_step_overheads_by_bucket_drafted_apart_and_linear_in_depth():
    from dspark.scheduling import build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    # Verify T tokens: 10 + T ms; drafting d deep: d ms at any request count; K = 3.
    tables = build_cost_tables([(1, 3.0), (8, 3.0)], [(1, 11.0), (2, 12.0), (64, 74.0)], 8, 64, 1)
    depth = build_depth_costs({1: [(1, 1.0), (8, 1.0)], 3: [(1, 3.0), (8, 3.0)]}, 3, 8)
    cost = ObservedDraftCost(tables, depth_ms=depth)
    # Undrafted, 4 requests: priced 14 ms. Medians of what the price missed: 6, then 7.
    cost.record_step(4, 4, 0, 0, 20.0)
    assert cost.overhead_ms(4, 0) == pytest.approx(6.0)
    cost.record_step(4, 4, 0, 0, 114.0)
    cost.record_step(4, 4, 0, 0, 21.0)
    assert cost.overhead_ms(4, 0) == pytest.approx(7.0)
    # Drafted 1 deep with 4 drafts: priced 10 + 8 + 1 = 19, took 24 (missed 5); 3 deep
    # with 8 drafts: priced 10 + 12 + 3 = 25, took 34 (missed 9). Line: 3 + 2 · depth.
    cost.record_step(4, 4, 4, 1, 24.0)
    assert cost.overhead_ms(4, 2) == pytest.approx(5.0)  # one depth seen: flat
    cost.record_step(4, 4, 8, 3, 34.0)
    assert cost.overhead_ms(4, 2) == pytest.approx(7.0)
    assert cost.overhead_ms(4, None) == pytest.approx(9.0)  # the full block, K = 3
    assert cost.draft_cost_ms(4, 2) == pytest.approx(2.0 + 7.0)
    np.testing.assert_allclose(cost.draft_costs_by_depth(4, 3), [7.0, 6.0, 9.0, 12.0])
    # Requests 4..7 share a bucket; 8 is the next one, unmeasured: it takes its nearest
    # measured neighbour's lines until its own steps come in.
    assert cost.overhead_ms(7, 2) == pytest.approx(7.0)
    assert cost.overhead_ms(8, 2) == pytest.approx(7.0)
    assert cost.overhead_ms(8, 0) == pytest.approx(7.0)
    cost.record_step(8, 8, 0, 0, 20.0)  # priced 18 ms: its own undrafted line, 2 ms
    assert cost.overhead_ms(8, 0) == pytest.approx(2.0)
    assert cost.overhead_ms(8, 2) == pytest.approx(7.0)  # drafted: still the neighbour's
    # The lines as reported: 4-7 requests drafted 3 + 2 · depth, undrafted 7 (slope 0);
    # 8-15 undrafted 2.
    assert cost.overhead_lines() == {
        "drafted 4+": pytest.approx((3.0, 2.0)),
        "undrafted 4+": pytest.approx((7.0, 0.0)),
        "undrafted 8+": pytest.approx((2.0, 0.0)),
    }
    with pytest.raises(ValueError, match="cannot admit"):
        cost.record_step(4, 4, 2, 0, 10.0)
    with pytest.raises(ValueError, match="wall_ms"):
        cost.record_step(4, 4, 0, 0, float("inf"))


def test_a_step_that_replayed_a_larger_graph_is_priced_with_its_padding():
    from dspark.scheduling import build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    # Verify T tokens: 10 + T ms up to 64; drafting d deep: d ms; K = 3 (as above).
    tables = build_cost_tables([(1, 3.0), (8, 3.0)], [(1, 11.0), (2, 12.0), (64, 74.0)], 8, 64, 1)
    depth = build_depth_costs({1: [(1, 1.0), (8, 1.0)], 3: [(1, 3.0), (8, 3.0)]}, 3, 8)
    own, covered, unpriced = (ObservedDraftCost(tables, depth_ms=depth) for _ in range(3))
    own.record_step(4, 4, 4, 1, 24.0)  # 8 tokens: priced 18 + 1, missed 5
    covered.record_step(4, 4, 4, 1, 32.0, padded_tokens=8)  # ran 16: priced 26 + 1
    unpriced.record_step(4, 4, 4, 1, 32.0)  # the same step, its padding not said
    assert own.overhead_ms(4, 1) == covered.overhead_ms(4, 1) == pytest.approx(5.0)
    assert unpriced.overhead_ms(4, 1) == pytest.approx(13.0)
    # Padding past the tables is priced at their largest size (64 tokens: 74 + 1 ms).
    edge = ObservedDraftCost(tables, depth_ms=depth)
    edge.record_step(4, 4, 4, 1, 80.0, padded_tokens=100)
    assert edge.overhead_ms(4, 1) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="padded_tokens"):
        edge.record_step(4, 4, 4, 1, 80.0, padded_tokens=-1)


def test_one_measured_depth_prices_the_others_optimistically():
    from dspark.scheduling import build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    # As above: verify T tokens 10 + T ms, drafting d deep d ms, K = 3.
    tables = build_cost_tables([(1, 3.0), (8, 3.0)], [(1, 11.0), (2, 12.0), (64, 74.0)], 8, 64, 1)
    depth = build_depth_costs({1: [(1, 1.0), (8, 1.0)], 3: [(1, 3.0), (8, 3.0)]}, 3, 8)
    cost = ObservedDraftCost(tables, depth_ms=depth)
    # A new engine's first drafted step, 3 deep with 12 drafts: priced 10 + 16 + 3 = 29,
    # took 38. Shallower depths ramp up to those 9 ms from 0 (no undrafted step yet);
    # flat, one deep would have been priced 9 ms over its profile as well.
    cost.record_step(4, 4, 12, 3, 38.0)
    assert [cost.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([3.0, 6.0, 9.0])
    assert cost.overhead_ms(4, None) == pytest.approx(9.0)
    np.testing.assert_allclose(cost.draft_costs_by_depth(4, 3), [0.0, 4.0, 8.0, 12.0])
    # Undrafted steps missing 3 ms: the ramp starts there.
    cost.record_step(4, 4, 0, 0, 17.0)
    assert [cost.overhead_ms(4, d) for d in (0, 1, 2, 3)] == pytest.approx([3.0, 5.0, 7.0, 9.0])
    # A second depth measured: the line through both (3 + 2 · depth), as in the test above.
    cost.record_step(4, 4, 4, 1, 24.0)  # priced 19, missed 5
    assert [cost.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([5.0, 7.0, 9.0])
    cost.record_step(4, 4, 4, 1, 26.0)  # missed 7: the depth-1 median is 6
    assert cost.overhead_ms(4, 2) == pytest.approx(7.5)  # 4.5 + 1.5 · depth
    # Depth 1 seen three times, depth 3 once: the 3-deep step no longer shapes the line,
    # and deeper depths are priced as depth 1 (optimistically) until seen as often.
    cost.record_step(4, 4, 4, 1, 25.0)  # missed 6: the median stays 6
    assert [cost.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([6.0, 6.0, 6.0])
    cost.record_step(4, 4, 12, 3, 38.0)
    cost.record_step(4, 4, 12, 3, 38.0)  # three times now (9 ms each)
    assert cost.overhead_ms(4, 2) == pytest.approx(7.5)
    # Measured deep first, yet cheaper than undrafted steps: flat, no ramp.
    other = ObservedDraftCost(tables, depth_ms=depth)
    other.record_step(4, 4, 0, 0, 17.0)  # 3 ms
    other.record_step(4, 4, 12, 3, 31.0)  # 2 ms
    assert [other.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([2.0, 2.0, 2.0])
    # Measured shallow first: deeper depths stay at the measured overhead.
    shallow = ObservedDraftCost(tables, depth_ms=depth)
    shallow.record_step(4, 4, 4, 1, 24.0)
    assert [shallow.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([5.0, 5.0, 5.0])
    # Without K known, the full block is the measured depth's overhead.
    unknown = ObservedDraftCost(tables)
    unknown.record_step(4, 4, 12, 3, 38.0)  # priced 10 + 16 + 3 (the full block's 3 ms)
    assert unknown.overhead_ms(4, None) == pytest.approx(9.0)


def test_one_outlying_step_does_not_drag_the_learnt_depth_line():
    from dspark.scheduling.cost import _depth_line

    points = deque([(2, 4.0), (2, 4.0), (2, 400.0), (4, 8.0), (4, 8.0), (4, 9.0)])
    assert _depth_line(points) == pytest.approx((0.0, 2.0))  # medians (2, 4) and (4, 8)
    # Four depths, one of them stray: per depth the median slope to the others is 2, 2,
    # 2 and 197.3; their median is 2.
    points += [(6, 12.0)] * 3 + [(7, 600.0)] * 3
    intercept, slope = _depth_line(points)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(0.0)
    assert _depth_line(deque([(3, 5.0), (3, 7.0), (3, 90.0)])) == (7.0, 0.0)
    # Noisy steps that make deeper drafts look cheaper: the line stays flat (at the
    # median of the depths' medians), never falling.
    assert _depth_line(deque([(1, 20.0), (4, 17.0), (7, 14.0)])) == (17.0, 0.0)


def test_a_depth_seen_under_three_times_does_not_set_the_slope_beside_one_seen_more():
    """One 4-deep step that missed its price by 43 ms among fifteen 3-deep ones that
    missed it by about 16 would make the line some 27 ms steeper a depth; a depth seen
    fewer than three times is left out where another was seen three times,
    and priced from the rest (optimistically: the one depth left is flat beyond it)."""
    from dspark.scheduling.cost import LINE_MIN_STEPS, _depth_line

    assert LINE_MIN_STEPS == 3
    threes = [(3, 16.0 + 0.1 * (i % 3)) for i in range(15)]
    assert _depth_line(deque([*threes, (4, 43.0)])) == pytest.approx((16.1, 0.0))
    # Twice is not enough (a median of two is their mean, half the stray step's pull)...
    assert _depth_line(deque([*threes, (4, 43.0), (4, 23.0)])) == pytest.approx((16.1, 0.0))
    # ... three times is: the medians (3, 16.1) and (4, 30) make the line.
    fours = [(4, 43.0), (4, 23.0), (4, 30.0)]
    assert _depth_line(deque([*threes, *fours]))[1] == pytest.approx(13.9)
    # Rare depths beside a frequent one all drop out; with no depth seen three times,
    # every depth counts.
    assert _depth_line(deque([(2, 4.0)] * 3 + [(5, 90.0), (7, 1.0), (7, 1.0)])) == (4.0, 0.0)
    assert _depth_line(deque([(1, 5.0), (3, 9.0), (3, 9.0)])) == pytest.approx((3.0, 2.0))


def test_a_rare_expensive_depth_is_priced_as_the_measured_one_until_seen_three_times():
    from dspark.scheduling import build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    # Verify T tokens: 10 + T ms; drafting d deep: d ms; K = 3 (as above).
    tables = build_cost_tables([(1, 3.0), (8, 3.0)], [(1, 11.0), (2, 12.0), (64, 74.0)], 8, 64, 1)
    depth = build_depth_costs({1: [(1, 1.0), (8, 1.0)], 3: [(1, 3.0), (8, 3.0)]}, 3, 8)
    cost = ObservedDraftCost(tables, depth_ms=depth)
    cost.record_step(4, 4, 0, 0, 16.0)  # undrafted: priced 14, missed 2
    for _ in range(3):
        cost.record_step(4, 4, 4, 1, 24.0)  # 1 deep: priced 19, missed 5
    for _ in range(2):
        cost.record_step(4, 4, 12, 3, 79.0)  # 3 deep: priced 29, missed 50
        # Priced as the measured depth (flat beyond it), not 5 + 22.5 · (depth - 1).
        assert [cost.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([5.0, 5.0, 5.0])
    cost.record_step(4, 4, 12, 3, 79.0)  # the third time: now it counts
    assert [cost.overhead_ms(4, d) for d in (1, 2, 3)] == pytest.approx([5.0, 27.5, 50.0])


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["record", "step"]),
            st.integers(1, 8),  # requests
            st.integers(0, 4),  # depth (0: an undrafted step)
            st.floats(0.0, 30.0),  # ms
        ),
        max_size=12,
    )
)
def test_observed_draft_cost_prices_asked_between_measurements_are_never_stale(events):
    """Prices are kept between measurements (a step's decisions ask for the same few):
    a model asked for every price after every measurement answers as a twin that saw the
    same measurements and is asked only once, at the end."""
    from dspark.scheduling import build_depth_costs
    from dspark.scheduling.cost import ObservedDraftCost

    tables = build_cost_tables([(1, 4.0), (8, 8.0)], [(1, 5.0), (64, 6.0)], 8, 64)
    depth = build_depth_costs({1: [(1, 1.0), (8, 2.0)], 4: [(1, 4.0), (8, 8.0)]}, 4, 8)
    asked, fresh = (ObservedDraftCost(tables, decay=0.5, depth_ms=depth) for _ in range(2))
    queries = [(n, d) for n in range(1, 9) for d in (None, 1, 2, 3, 4)]

    def prices(model):
        return [model.draft_cost_ms(n, d) for n, d in queries] + [
            model.draft_costs_by_depth(n, 4).tolist() for n in range(1, 9)
        ]

    for kind, n, d, ms in events:
        for model in (asked, fresh):
            if kind == "record":
                model.record(n, ms, max(d, 1))
            else:
                model.record_step(n, n, n * d // 2, d, ms)
        prices(asked)
    assert prices(asked) == prices(fresh)
