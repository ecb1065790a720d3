"""The CPU products of a few rows: every plan gives F.linear's rows, and the plan follows
the times measured."""

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.ops import linear as ops
from dspark.ops.linear import FLAT, PACKED, PATHS, TRANSPOSED

needs_packing = pytest.mark.skipif(
    not ops.packing_available(), reason="this torch has no oneDNN packed products"
)


@pytest.fixture
def plan_for():
    """Set the plan of a weight shape for one test (restored after)."""
    saved = {}

    def set_plan(shape, plan):
        saved.setdefault(shape, ops._ROW_PLAN.get(shape))
        ops._ROW_PLAN[shape] = tuple(plan)

    yield set_plan
    for shape, plan in saved.items():
        if plan is None:
            ops._ROW_PLAN.pop(shape, None)
        else:
            ops._ROW_PLAN[shape] = plan


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 17])
def test_untuned_products_match_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 40, generator=gen)
    torch.testing.assert_close(ops.linear(x, weight, bias), F.linear(x, weight, bias))
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight))
    # Row-major for a few rows whichever product ran: what follows runs along its rows.
    if rows <= ops.ROW_MAJOR_MAX_ROWS:
        assert ops.linear(x, weight).is_contiguous()
        assert ops.linear(x, weight, bias).is_contiguous()
    batched = x.reshape(1, rows, 40)
    assert ops.linear(batched, weight).shape == (1, rows, 96)
    torch.testing.assert_close(ops.linear(batched, weight), F.linear(batched, weight))


@pytest.mark.parametrize("shape", [(40,), (1, 40), (1, 1, 40)])
def test_one_row_doubled_through_the_transposed_product(monkeypatch, plan_for, shape):
    gen = torch.Generator().manual_seed(len(shape))
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(*shape, generator=gen)
    calls = []
    original = torch.mm

    def spy(a, b):
        calls.append(tuple(b.shape))
        return original(a, b)

    plan_for((96, 40), [None, (TRANSPOSED, 2), (TRANSPOSED, 2)])
    monkeypatch.setattr(ops.torch, "mm", spy)
    out = ops.linear(x, weight, bias)
    assert calls == [(40, 2)]  # the row and a zero row, one product
    assert out.shape == (*shape[:-1], 96)
    torch.testing.assert_close(out, F.linear(x, weight, bias))


def test_plan_from_times_pads_only_to_a_clearly_faster_larger_count():
    """Hand-made times ([F.linear, weight @ x.T, packed] per count timed): 3 runs slower
    than 4, 8 and 12 slower than 16 (by more than PAD_GAIN), 2 within it of 4's time, 24
    F.linear's and 48 faster than 24 but by less than PAD_GAIN; targets are multiples of
    PAD_MULTIPLE only; the packed product wins at 16 alone."""
    inf = float("inf")
    assert (ops.PAD_GAIN, ops.PAD_MULTIPLE) == (0.9, 4)
    best = {
        1: [60.0, 40.0, 45.0],  # weight @ x.T (the row padded to two)
        2: [50.0, 36.0, 44.0],
        3: [70.0, 49.0, 50.0],  # 4 is faster: padded to 4
        4: [80.0, 39.0, 41.0],
        8: [90.0, 84.0, 85.0],  # 16 is faster: padded to 16, and 5-7 with it
        12: [95.0, 89.0, 90.0],
        16: [99.0, 80.0, 74.0],  # packed
        24: [90.0, 96.0, inf],  # F.linear over its own rows; 48's 88 is not 10% faster
        48: [88.0, 120.0, inf],
    }
    plan = ops.plan_from_times(best)
    assert len(plan) == 49 and plan[0] is None
    assert plan[1] == (TRANSPOSED, 2) and plan[2] == (TRANSPOSED, 2)
    assert plan[3] == (TRANSPOSED, 4) and plan[4] == (TRANSPOSED, 4)
    assert plan[5:13] == ((PACKED, 16),) * 8  # 5-7 follow 8, padded to 16; 9-12 as 12
    assert plan[13:17] == tuple((PACKED, n) for n in range(13, 17))  # as 16, own rows
    assert plan[17:49] == tuple((FLAT, n) for n in range(17, 49))  # as 24 and 48
    # Two paths timed (no packing here): the same rules over those two.
    flat = ops.plan_from_times({1: [10.0, 20.0], 2: [10.0, 9.6], 3: [10.0, 9.7]})
    assert flat == (None, (FLAT, 1), (TRANSPOSED, 2), (TRANSPOSED, 3))
    # 6 is much faster than 5 but not a multiple of 4; 8 is not faster by PAD_GAIN: 5 and
    # 6 as themselves. At exactly PAD_GAIN of its time, 7 pads to 8.
    odd = ops.plan_from_times({5: [50.0, 46.0], 6: [50.0, 30.0], 7: [60.0, 50.0], 8: [60.0, 45.0]})
    assert odd[5:] == ((TRANSPOSED, 5), (TRANSPOSED, 6), (TRANSPOSED, 8), (TRANSPOSED, 8))
    # One row through the packed product is padded to two as well.
    assert ops.plan_from_times({1: [9.0, 8.0, 5.0]})[1] == (PACKED, 2)
    # Above ROW_MAJOR_MAX_ROWS (8) weight @ x.T counts COLUMN_MAJOR_COST (1.1) times its
    # time: 52 x 1.1 = 57.2 loses to 55, 49 x 1.1 = 53.9 wins; at 8 rows 54 wins as is.
    assert ops.plan_from_times({32: [60.0, 52.0, 55.0]})[32] == (PACKED, 32)
    assert ops.plan_from_times({32: [60.0, 49.0, 55.0]})[32] == (TRANSPOSED, 32)
    assert ops.plan_from_times({8: [60.0, 54.0, 55.0]})[8] == (TRANSPOSED, 8)
    # The weighting follows the count's own rows: 8 rows padded to 16 through weight @
    # x.T are copied row-major, so 73.2 at 16 is not weighed and pads 82.7 at 8 (PAD_GAIN).
    inf = float("inf")
    assert ops.plan_from_times({8: [200.0, 82.7, inf], 16: [200.0, 73.2, inf]})[8] == (
        TRANSPOSED,
        16,
    )


def _scripted_times(rows: int) -> list[float]:
    """[F.linear, weight @ x.T, packed]: weight @ x.T times fastest up to 12 rows, but
    above ROW_MAJOR_MAX_ROWS (8) its time counts 1.1x (COLUMN_MAJOR_COST), so the packed
    product leads from 10 (1.56 against 1.65); 9 rows take 2.5 whichever way (padded to
    12: 1.61 packed); F.linear leads at 64 (2.5)."""
    times = [2.0 + rows / 20, 1.0 + rows / 20, 1.31 + rows / 40]
    if rows == 9:
        times = [2.5, 2.5, 2.5]
    elif rows == 64:
        times[0] = 2.5
    return times


def _scripted_clock(times_of, paths: int):
    ticks = [t for _ in range(2) for rows in ops.TUNED_ROWS for t in times_of(rows)[:paths]]
    now, calls = [0.0], [0]

    def clock():
        if calls[0] % 2:  # an end: the scripted sweep has run
            now[0] += ticks[calls[0] // 2]
        calls[0] += 1
        return now[0]

    return clock, calls, ticks


def _forget(weights):
    ops.forget_small_rows(weights)
    for key in [k for k in ops._TUNED if k[0] == tuple(tuple(w.shape) for w in weights)]:
        del ops._TUNED[key]


@needs_packing
def test_tune_small_rows_times_every_path_and_follows_the_fastest(monkeypatch):
    """Calls come as (start, end) pairs per repeat, count and product (in PATHS' order):
    every count and product once a round, two rounds."""
    weights = [torch.randn(24, 40), torch.randn(40, 24)]
    clock, calls, ticks = _scripted_clock(_scripted_times, 3)
    try:
        assert ops.tune_small_rows(weights, clock=clock) == {64}
        assert calls[0] == 2 * len(ticks) == 2 * 2 * 3 * len(ops.TUNED_ROWS)
        # Measured once per weight set: a second engine on the model reads the answer.
        assert ops.tune_small_rows(weights, clock=clock) == {64}
        assert calls[0] == 2 * len(ticks)
        plan = ops.row_plan((24, 40))
        assert plan[1] == (TRANSPOSED, 2)
        assert plan[2:9] == tuple((TRANSPOSED, n) for n in range(2, 9))
        assert plan[9] == (PACKED, 12)
        # Counts between those timed follow the next one timed: 57-63 as 64.
        assert plan[10:57] == tuple((PACKED, n) for n in range(10, 57))
        assert plan[57:65] == tuple((FLAT, n) for n in range(57, 65))
        assert ops.row_plan((40, 24)) == plan
        assert ops.is_packed(weights[0])  # packed once, kept for the run

        seen = {path: [] for path in PATHS}
        mm, f_linear, packed = torch.mm, F.linear, ops.packed_product

        def spy_mm(a, b):
            seen[TRANSPOSED].append(b.shape[1])
            return mm(a, b)

        def spy_linear(x, w, b=None):
            seen[FLAT].append(x.shape[0])
            return f_linear(x, w, b)

        def spy_packed(x, w):
            seen[PACKED].append(x.shape[0])
            return packed(x, w)

        monkeypatch.setattr(ops.torch, "mm", spy_mm)
        monkeypatch.setattr(ops.F, "linear", spy_linear)
        monkeypatch.setattr(ops, "packed_product", spy_packed)
        for rows in (1, 3, 9, 20, 50, 60, 64, 65):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(ops.linear(x, weights[0]), f_linear(x, weights[0]))
        assert seen == {TRANSPOSED: [2, 3], PACKED: [12, 20, 50], FLAT: [60, 64, 65]}
        # Where autograd records, the packed product gives way to F.linear.
        trained = weights[0].clone().requires_grad_()
        x = torch.randn(20, 40)
        ops.linear(x, trained).sum().backward()
        assert seen[FLAT][-1] == 20 and seen[PACKED] == [12, 20, 50]
        torch.testing.assert_close(trained.grad, x.sum(0).expand(24, 40))

        ops.forget_small_rows(weights)  # back to weight @ x.T for 2 ... 16 rows
        assert ops.row_plan((24, 40)) is None
        assert not any(ops.is_packed(w) for w in weights)
        for path in PATHS:
            seen[path].clear()
        for rows in (1, 2, 16, 17):
            ops.linear(torch.randn(rows, 40), weights[0])
        assert seen == {TRANSPOSED: [2, 16], PACKED: [], FLAT: [1, 17]}
    finally:
        _forget(weights)


def test_tune_small_rows_without_packing_times_two_products(monkeypatch):
    """Where oneDNN cannot pack, two products are timed and the plan never packs."""
    monkeypatch.setattr(ops, "packing_available", lambda: False)
    weights = [torch.randn(28, 40), torch.randn(40, 28)]
    clock, calls, ticks = _scripted_clock(_scripted_times, 2)
    try:
        assert ops.tune_small_rows(weights, clock=clock) == {64}
        assert calls[0] == 2 * len(ticks) == 2 * 2 * 2 * len(ops.TUNED_ROWS)
        plan = ops.row_plan((28, 40))
        assert all(path != PACKED for path, _ in plan[1:])
        assert plan[13:29] == tuple((TRANSPOSED, n) for n in range(13, 29))
        # 32 and up pad to 64 (2.5 against 2.6 x 1.1 = 2.86 at 32; 28: 2.64, not by 0.9).
        assert plan[29:57] == ((FLAT, 64),) * 28
        assert not ops.is_packed(weights[0])
    finally:
        _forget(weights)


def test_a_stored_plan_is_followed_by_the_next_process_without_measuring(tmp_path):
    """The plan measured is kept in the store; a start that finds it there (here: the
    plan forgotten in memory, as in a new process) measures nothing; a damaged file is
    measured again and rewritten."""
    weights = [torch.randn(20, 40), torch.randn(40, 20)]
    paths = 3 if ops.packing_available() else 2
    clock, calls, ticks = _scripted_clock(_scripted_times, paths)

    def untimed():
        raise AssertionError("a stored plan was measured again")

    try:
        left_flat = ops.tune_small_rows(weights, clock=clock, store=tmp_path)
        measured = ops.row_plan((20, 40))
        assert calls[0] == 2 * len(ticks)
        (stored,) = tmp_path.iterdir()
        _forget(weights)
        assert ops.tune_small_rows(weights, clock=untimed, store=tmp_path) == left_flat
        assert ops.row_plan((20, 40)) == measured == ops.row_plan((40, 20))
        for damaged in ("[1, 2", json.dumps([None] + [["linear", "x"]] * 64)):
            _forget(weights)
            stored.write_text(damaged)
            clock, calls, ticks = _scripted_clock(_scripted_times, paths)
            ops.tune_small_rows(weights, clock=clock, store=tmp_path)
            assert calls[0] == 2 * len(ticks) and ops.row_plan((20, 40)) == measured
            _forget(weights)
            ops.tune_small_rows(weights, clock=untimed, store=tmp_path)
            assert ops.row_plan((20, 40)) == measured
    finally:
        _forget(weights)


@needs_packing
def test_packed_copy_follows_the_weight():
    """A weight changed in place (loaded, trained) is packed again; a plan that never
    takes the packed product drops the copies it timed."""
    gen = torch.Generator().manual_seed(3)
    weight, x = torch.randn(96, 40, generator=gen), torch.randn(6, 40, generator=gen)
    torch.testing.assert_close(ops.packed_product(x, weight), F.linear(x, weight))
    weight.mul_(-2.0)
    torch.testing.assert_close(ops.packed_product(x, weight), F.linear(x, weight))
    weight.data = torch.randn(96, 40, generator=gen)
    torch.testing.assert_close(ops.packed_product(x, weight), F.linear(x, weight))

    weights = [torch.randn(36, 40), torch.randn(40, 36)]
    clock, _, _ = _scripted_clock(lambda rows: [1.0 + rows / 20, 2.0 + rows / 20, 9.0], 3)
    try:
        ops.tune_small_rows(weights, clock=clock)
        assert all(path == FLAT for path, _ in ops.row_plan((36, 40))[1:])
        assert not any(ops.is_packed(w) for w in weights)
    finally:
        _forget(weights)


@needs_packing
@pytest.mark.parametrize("shape", [(576, 1536), (960, 576), (2048, 576)])
def test_packed_rows_do_not_depend_on_the_row_count(shape):
    """Every row count from 2 on gives a row the same bits through the packed product
    (one row runs as two), so a verify step's rows equal a decode step's: the greedy
    equality of speculative and plain decoding rests on this."""
    gen = torch.Generator().manual_seed(shape[0])
    weight, x = torch.randn(*shape, generator=gen), torch.randn(40, shape[1], generator=gen)
    alone = ops.packed_product(torch.cat((x[:1], x.new_zeros(1, shape[1]))), weight)[0]
    for rows in range(2, 41):
        assert torch.equal(ops.packed_product(x[:rows], weight)[0], alone), rows


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 20),
    extra=st.integers(0, 12),
    path=st.sampled_from(PATHS if ops.packing_available() else PATHS[:2]),
    leading=st.sampled_from([(), (1,)]),
    with_bias=st.booleans(),
)
def test_padded_products_match_f_linear(rows, extra, path, leading, with_bias):
    """Whatever the plan pads a row count to, and with any product, ``linear`` gives
    F.linear's rows: the zero rows added never reach the output."""
    gen = torch.Generator().manual_seed(rows * 31 + extra)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(*leading, rows, 40, generator=gen)
    plan = [None] * (rows + 1)
    plan[rows] = (path, rows + extra)
    saved = ops._ROW_PLAN.get((96, 40))
    ops._ROW_PLAN[(96, 40)] = tuple(plan)
    try:
        b = bias if with_bias else None
        out = ops.linear(x, weight, b)
        assert out.shape == (*leading, rows, 96)
        torch.testing.assert_close(out, F.linear(x, weight, b))
        if path != FLAT and rows <= ops.ROW_MAJOR_MAX_ROWS:
            assert out.is_contiguous()
    finally:
        if saved is None:
            ops._ROW_PLAN.pop((96, 40), None)
        else:
            ops._ROW_PLAN[(96, 40)] = saved


@needs_packing
def test_rows_past_the_plan_follow_its_last_count(monkeypatch, plan_for):
    gen = torch.Generator().manual_seed(5)
    weight, x = torch.randn(96, 40, generator=gen), torch.randn(70, 40, generator=gen)
    seen = []
    packed = ops.packed_product

    def spy(rows, w):
        seen.append(rows.shape[0])
        return packed(rows, w)

    monkeypatch.setattr(ops, "packed_product", spy)
    plan_for((96, 40), [None, (PACKED, 2), (PACKED, 2), (PACKED, 4), (PACKED, 4)])
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight))
    torch.testing.assert_close(ops.linear(x[:3], weight), F.linear(x[:3], weight))
    assert seen == [70, 4]  # past the plan over its own rows; 3 padded to 4 as planned


def test_a_second_weight_set_keeps_the_plans_of_shapes_it_shares():
    """A drafter tuned after its target (``keep_shapes``): the shape they share keeps the
    target's plan, its own shapes take its own, and the packed copies its plan never
    takes are freed (the shared weight's too, its kept plan not packing)."""
    paths = 3 if ops.packing_available() else 2
    target = [torch.randn(44, 40), torch.randn(40, 44)]
    drafter = [torch.randn(44, 40), torch.randn(52, 40)]
    slow_flat = _scripted_clock(lambda rows: [9.0, 1.0 + rows / 20, 9.0], paths)[0]
    fast_flat = _scripted_clock(lambda rows: [1.0 + rows / 20, 9.0, 9.0], paths)[0]
    try:
        ops.tune_small_rows(target, clock=slow_flat)
        ops.tune_small_rows(drafter, clock=fast_flat, keep_shapes=frozenset({(44, 40)}))
        assert ops.row_plan((44, 40))[5] == (TRANSPOSED, 5)  # the target's
        assert ops.row_plan((52, 40))[5] == (FLAT, 5)  # the drafter's own
        assert not any(ops.is_packed(w) for w in target + drafter)
        # Not kept: the second set's plan takes the shape.
        ops.tune_small_rows(drafter, clock=fast_flat)
        assert ops.row_plan((44, 40))[5] == (FLAT, 5)
    finally:
        _forget(target)
        _forget(drafter)


def test_a_weight_oneDNN_cannot_pack_runs_as_f_linear_and_copies_cleanly():
    """A dtype this CPU's oneDNN may not pack (float16) falls back to F.linear rather than
    failing, and a packed weight still deep-copies (the copy is kept beside it, not on
    it)."""
    import copy

    gen = torch.Generator().manual_seed(9)
    half = torch.randn(96, 40, generator=gen).half()
    x = torch.randn(4, 40, generator=gen).half()
    out = ops.packed_product(x, half)
    assert ops.is_packed(half) == (ops.packed_weight(half) is not None)
    torch.testing.assert_close(out.float(), F.linear(x.float(), half.float()), atol=0.1, rtol=0.01)
    weight = torch.randn(96, 40, generator=gen)
    ops.packed_product(torch.randn(4, 40, generator=gen), weight)
    twin = copy.deepcopy(weight)
    assert torch.equal(twin, weight) and not ops.is_packed(twin)
