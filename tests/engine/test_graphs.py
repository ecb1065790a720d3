"""The padded step layout (what a CUDA graph replays), run eagerly on the CPU, against the
unpadded path: same hidden states, same greedy outputs."""

import numpy as np
import pytest
import torch

from dspark.engine.graphs import (
    CaptureLedger,
    PaddedStepRunner,
    StepShape,
    exact_shapes,
    padding_waste,
    piece_sizes,
    row_padding_waste,
    token_sizes,
)
from dspark.engine.kv_cache import BlockTable, PagedKVCache
from tests.conftest import make_tiny_model
from tests.engine.test_engine import GREEDY, RandomCost, repetitive_prompts, run


def test_sizes_are_ascending_and_end_at_the_limit():
    for limit in (1, 7, 100, 2048, 3000):
        for sizes in (token_sizes(limit), piece_sizes(limit)):
            assert sizes[-1] == limit
            assert sizes == sorted(set(sizes))


def _two_caches(loaded, num_blocks=64, block_size=4):
    return [PagedKVCache(loaded.config, num_blocks, block_size, torch.float32) for _ in range(2)]


@pytest.mark.parametrize("causal", [True, False])
def test_padded_step_matches_the_unpadded_forward(tiny, causal):
    """A mixed step (decodes with drafts, a prompt chunk cut into pieces, an empty-cache
    request) gives the same hidden states padded and unpadded, and writes the same keys."""
    model = tiny.model
    eager_cache, padded_cache = _two_caches(tiny)
    rng = np.random.default_rng(0)
    num_cached = np.array([5, 0, 13, 2, 9])
    num_query = np.array([1, 37, 4, 8, 3])  # 37 tokens: three pieces of 16, 16 and 5
    tables = []
    for cached, query in zip(num_cached, num_query, strict=True):
        table = BlockTable()
        assert eager_cache.reserve(table, int(cached + query))
        tables.append(table)
    padded_tables = []
    for table in tables:  # same blocks in the other cache (fresh pools hand out alike)
        twin = BlockTable()
        assert padded_cache.reserve(twin, len(table.blocks) * 4)
        assert twin.blocks == table.blocks
        padded_tables.append(twin)
    # Identical cached contents in both caches.
    for (k1, v1), (k2, v2) in zip(eager_cache.layers, padded_cache.layers, strict=True):
        k1.copy_(torch.randn_like(k1))
        v1.copy_(torch.randn_like(v1))
        k2.copy_(k1)
        v2.copy_(v1)
    ids = rng.integers(0, tiny.config.vocab_size, int(num_query.sum()))
    positions = np.concatenate(
        [np.arange(c, c + q) for c, q in zip(num_cached, num_query, strict=True)]
    )
    with torch.inference_mode():
        batch = eager_cache.attention_batch(tables, num_cached, num_query, causal=causal)
        expected, _ = model(
            torch.from_numpy(ids), torch.from_numpy(positions), batch, eager_cache.layers
        )

        def body(ids_t, positions_t, padded_batch):
            return model(ids_t, positions_t, padded_batch, padded_cache.layers)[0]

        runner = PaddedStepRunner(body, padded_cache, 64, 64, 64, capture=False)
        shape = runner.shape_for(num_cached, num_query)
        assert shape == StepShape(64, 8, 64)  # 53 tokens -> 64; 7 pieces -> 8; 40 keys -> 64
        got = runner.run(padded_tables, num_cached, num_query, ids, causal=causal)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # Replayed through a larger shape that holds it (a cover): the same hidden states.
    wider = PaddedStepRunner(body, padded_cache, 128, 128, 128, capture=False)
    cover = StepShape(128, 16, 128)
    assert padding_waste(shape, cover) == 1.0  # twice the tokens: the most a cover may pad
    with torch.inference_mode():
        got = wider.run(padded_tables, num_cached, num_query, ids, causal=causal, shape=cover)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    rows = np.concatenate(
        [
            t.rows(np.arange(c, c + q), 4)
            for t, c, q in zip(tables, num_cached, num_query, strict=True)
        ]
    )
    for (k1, _), (k2, _) in zip(eager_cache.layers, padded_cache.layers, strict=True):
        torch.testing.assert_close(k2[rows], k1[rows])


def test_padding_writes_only_the_scratch_block(tiny):
    cache = PagedKVCache(tiny.config, 16, 4, torch.float32)
    runner = PaddedStepRunner(
        lambda ids, positions, batch: tiny.model(ids, positions, batch, cache.layers)[0],
        cache,
        32,
        32,
        32,
        capture=False,
    )
    assert runner.scratch_block not in cache._free
    table = BlockTable()
    assert cache.reserve(table, 6)
    owned = set(table.blocks) | {runner.scratch_block}
    before = [k.clone() for k, _ in cache.layers]
    with torch.inference_mode():
        runner.run([table], np.array([3]), np.array([3]), np.array([1, 2, 3]))
    for old, (new, _) in zip(before, cache.layers, strict=True):
        changed = (old != new).any(dim=(1, 2)).nonzero().flatten() // 4
        assert set(changed.tolist()) <= owned
        assert set(changed.tolist()) >= {runner.scratch_block}  # 3 tokens pad to 4


def test_a_step_beyond_the_largest_shape_runs_eagerly(tiny):
    _, engine = run(
        tiny, [list(range(40))], cuda_graphs="on", max_num_batched_tokens=64, max_model_len=64
    )
    assert engine.graphs is not None
    assert engine.graphs.shape_for(np.array([0]), np.array([65])) is None
    assert engine.graphs.shape_for(np.array([60]), np.array([5])) is None  # 65 keys > 64


@pytest.mark.parametrize("spec", ["none", "fixed", "adaptive"])
def test_greedy_output_with_padded_steps_equals_unpadded(tmp_path, spec):
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    prompts = [*repetitive_prompts(10), list(range(3, 90))]  # a prompt longer than a piece
    plain, _ = run(target, prompts, cuda_graphs="off")
    extra = {}
    if spec != "none":
        extra = {"spec": spec, "num_drafts": 4, "drafter_model": random_drafter(target, 5)}
        extra["drafter_graphs"] = (64, 256)
        if spec == "adaptive":
            extra["cost_model"] = RandomCost(0)
    padded, engine = run(target, prompts, cuda_graphs="on", max_num_batched_tokens=128, **extra)
    assert [o.token_ids for o in padded] == [o.token_ids for o in plain]
    assert engine.graphs.num_runs >= engine.stats.num_steps - 2  # a 64+-token prompt chunk
    if spec != "none":  # every block pass but those with no request ready to draft
        assert len(engine.stats.drafter_ms) - 2 <= engine.drafter.graphs.num_runs > 0
        # and its greedy heads, padded too (``DraftHeads``), unless switched off
        assert engine.drafter.heads.num_runs == engine.drafter.graphs.num_runs
        assert engine.drafter.heads in engine.padded_runners()
        _, eager_heads = run(
            target,
            prompts,
            cuda_graphs="on",
            max_num_batched_tokens=128,
            head_graphs=False,
            **extra,
        )
        assert eager_heads.drafter.heads is None
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in padded)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", ["none", "adaptive"])
def test_cuda_graph_replays_give_the_eager_greedy_output(tmp_path, spec):
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=5)
    target.model.cuda()
    drafter.cuda()
    prompts = [*repetitive_prompts(10), list(range(3, 90))]
    extra = {}
    if spec != "none":
        extra = {"spec": spec, "num_drafts": 4, "drafter_model": drafter}
        extra |= {"cost_model": RandomCost(0), "drafter_graphs": (64, 256)}
    eager, _ = run(target, prompts, cuda_graphs="off", **{**extra, "drafter_graphs": None})
    graphed, engine = run(target, prompts, cuda_graphs="auto", max_num_batched_tokens=128, **extra)
    assert engine.graphs.capture and engine.graphs.num_captures > 0
    assert engine.graphs.num_runs >= engine.stats.num_steps - 2
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]


def test_padding_block_comes_on_top_of_the_pool_asked_for(tiny):
    from dspark.engine.config import EngineConfig
    from dspark.engine.engine import LLMEngine

    for mode in ("off", "on"):
        engine = LLMEngine(tiny, EngineConfig(kv_cache_tokens=1024, cuda_graphs=mode))
        assert engine.cache.num_free_blocks == 1024 // 16


def test_steps_gathering_too_many_keys_run_eagerly(tiny):
    cache = PagedKVCache(tiny.config, 64, 4, torch.float32)
    runner = PaddedStepRunner(lambda *a: None, cache, 256, 64, 256, False, max_key_rows=1024)
    # 4 decodes over 100 keys: 4 pieces x 128 keys = 512 rows.
    assert runner.shape_for(np.full(4, 99), np.ones(4, dtype=np.int64)) is not None
    # One 200-token chunk at 40 cached: 13 pieces (16 padded) x 256 keys = 4096 rows.
    assert runner.shape_for(np.array([40]), np.array([200])) is None


def test_padding_waste_by_hand():
    step = StepShape(32, 4, 256)  # 1,024 key rows: below SMALL_KEY_ROWS, counted as 2,048
    assert padding_waste(step, step) == 0.0
    assert padding_waste(step, StepShape(48, 4, 256)) == 0.5  # 16 more tokens over 32
    assert padding_waste(step, StepShape(32, 8, 512)) == 1.5  # 4,096 - 1,024 over 2,048
    assert padding_waste(step, StepShape(48, 8, 256)) == 0.5  # the larger of 0.5, 0.5
    assert padding_waste(step, StepShape(80, 4, 256)) is None  # 2.5 times the tokens
    assert padding_waste(step, StepShape(32, 16, 512)) is None  # 7,168 more key rows: 3.5
    assert padding_waste(step, StepShape(16, 4, 256)) is None  # does not hold it
    assert padding_waste(step, StepShape(64, 2, 256)) is None
    assert padding_waste(step, StepShape(64, 4, 128)) is None
    # Small steps pad freely up to 16 tokens: one token padded to 16 wastes 15/16.
    assert padding_waste(StepShape(1, 1, 128), StepShape(16, 1, 128)) == 15 / 16
    assert row_padding_waste(8, 16) == 0.5  # over at least 16 rows
    assert row_padding_waste(64, 96) == 0.5
    assert row_padding_waste(64, 160) is None
    assert row_padding_waste(64, 48) is None


def test_the_ledger_replays_the_least_padded_cover_until_its_waste_adds_up():
    ledger = CaptureLedger(row_padding_waste, budget=1.0)
    assert ledger.choose(64, {}) == 64  # nothing captured: capture it
    assert ledger.choose(64, {64: None, 96: None}) == 64  # captured: itself
    ledger.forget_covers()  # as a runner does when it captures
    captured = {128: None, 96: None, 40: None}
    # 96 pads 64 by 0.5, 128 by 1.0: 96, then 64 (the 1.0 spent reaches the budget).
    assert [ledger.choose(64, captured) for _ in range(2)] == [96, 64]
    assert 64 not in ledger.spent  # the ledger forgets a shape it let be captured
    assert ledger.choose(200, captured) == 200  # no cover holds it
    assert ledger.choose(30, captured) == 40  # 10/30 spent ...
    assert ledger.spent == {30: 10 / 30}
    assert ledger.choose(30, captured) == 40
    assert ledger.choose(30, captured) == 30  # ... the third cover would reach 1.0


def test_exact_shapes_holds_every_runner_to_its_shape_and_restores_them(tiny):
    cache = PagedKVCache(tiny.config, 16, 4, torch.float32)
    runners = [PaddedStepRunner(lambda *a: None, cache, 32, 32, 32, False) for _ in range(2)]
    runners[1].exact_shapes = True
    with pytest.raises(RuntimeError), exact_shapes(runners):
        assert [r.exact_shapes for r in runners] == [True, True]
        raise RuntimeError
    assert [r.exact_shapes for r in runners] == [False, True]


def test_the_ledger_looks_a_cover_up_once_per_captured_set():
    ledger = CaptureLedger(row_padding_waste, budget=100.0)
    captured = {128: None}
    assert ledger.choose(64, captured) == 128
    captured[96] = None  # captured behind the ledger's back: the cached cover stands
    assert ledger.choose(64, captured) == 128
    ledger.forget_covers()  # what a runner calls when it captures
    assert ledger.choose(64, captured) == 96
    assert ledger.spent[64] == 1.0 + 1.0 + 0.5  # waste is charged by the cover replayed


def test_a_zero_padding_budget_captures_every_new_shape_at_once(tiny):
    from dspark.engine.config import EngineConfig
    from dspark.engine.engine import LLMEngine

    assert CaptureLedger(row_padding_waste, budget=0.0).choose(64, {96: None}) == 64
    engine = LLMEngine(tiny, EngineConfig(cuda_graphs="on", graph_padding_budget=0.0))
    assert [r.ledger.budget for r in engine.padded_runners()] == [0.0]
    for bad in (-1.0, float("nan"), True, "4"):
        with pytest.raises(ValueError, match="graph_padding_budget"):
            EngineConfig(graph_padding_budget=bad)
    assert EngineConfig(graph_padding_budget=np.int64(2)).graph_padding_budget == 2


class _NoEvent:  # what the staging copy's CUDA event needs to do on the CPU: nothing
    def record(self):
        pass

    def synchronize(self):
        pass


def _fake_capture(runner):
    """``runner`` made to behave as a capturing one on the CPU: a "capture" adds the
    shape to the captured set (the ledger looks covers up again), and the body runs where
    a graph would replay."""
    runner.capture = True

    def fake_graph(shape):
        if shape not in runner.graphs:
            runner.ledger.forget_covers()
            runner.graphs[shape] = None
        return runner.body(*runner._inputs(shape))

    runner._graph = fake_graph
    return runner


def _faked_capturing_runner(tiny, monkeypatch):
    """A runner that behaves as a capturing one on the CPU: a "capture" adds the shape to
    the captured set and the body runs where a graph would replay. Returns the runner
    and two block tables of 12 rows."""
    monkeypatch.setattr(torch.cuda, "Event", _NoEvent)
    cache = PagedKVCache(tiny.config, 64, 4, torch.float32)

    def body(ids_t, positions_t, batch):
        return tiny.model(ids_t, positions_t, batch, cache.layers)[0]

    runner = _fake_capture(PaddedStepRunner(body, cache, 64, 64, 64, capture=False))
    tables = []
    for _ in range(2):
        table = BlockTable()
        assert cache.reserve(table, 12)
        tables.append(table)
    return runner, tables


def test_steps_replaying_a_cover_are_counted_with_their_padding(tiny, monkeypatch):
    """A capturing runner (its capture faked on the CPU: the body runs where a graph would
    replay) counts the steps the ledger sends to a larger captured shape, and the tokens
    that pads; a step whose own shape is captured is not counted."""
    runner, tables = _faked_capturing_runner(tiny, monkeypatch)
    num_cached, num_query = np.array([3, 5]), np.array([4, 2])  # 6 tokens, 2 pieces: (8, 2, 64)
    own = runner.shape_for(num_cached, num_query)
    assert own == StepShape(8, 2, 64)
    cover = StepShape(16, 2, 64)
    runner.graphs[cover] = None  # "captured"
    ids = np.arange(10, 16)
    with torch.inference_mode():
        runner.run(tables, num_cached, num_query, ids)  # the ledger replays the cover
        assert (runner.num_covered, runner.covered_tokens) == (1, 8)
        runner.graphs[own] = None  # now its own shape is captured
        runner.ledger.forget_covers()
        runner.run(tables, num_cached, num_query, ids)
    assert (runner.num_covered, runner.covered_tokens) == (1, 8)
    assert runner.num_runs == 2


def test_a_capture_runs_with_the_cycle_collector_off(monkeypatch):
    """No cycle collection may free CUDA memory or graphs inside a stream capture: the
    collector is off while the body is captured, and back on afterwards (also when the
    capture fails)."""
    import contextlib
    import gc

    from dspark.engine.graphs import capture_graph

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    seen = []

    def body():
        seen.append(gc.isenabled())
        return "outputs"

    assert gc.isenabled()
    assert capture_graph(body, None, warm_up=False) == ("graph", "outputs")
    assert seen == [False] and gc.isenabled()

    def failing():
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        capture_graph(failing, None, warm_up=False)
    assert gc.isenabled()
    # A caller that had turned the collector off keeps it off.
    gc.disable()
    try:
        capture_graph(body, None, warm_up=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _capturing_engine(tiny, monkeypatch, seeded: list[StepShape], drafter=None, **config):
    """An adaptive engine whose target runner behaves as a capturing one on the CPU: the
    ledger chooses covers, a "capture" adds the shape to the captured set, and the body
    runs where a graph would replay. ``seeded`` shapes start out captured."""
    from dspark.engine.engine import LLMEngine
    from tests.conftest import engine_config

    monkeypatch.setattr(torch.cuda, "Event", _NoEvent)
    engine = LLMEngine(
        tiny,
        engine_config(spec="adaptive", cuda_graphs="on", throughput_gate=False, **config),
        cost_model=RandomCost(3),
        drafter=drafter,
    )
    runner = _fake_capture(engine.graphs)
    for shape in seeded:
        runner.graphs[shape] = None
    # The policy fills padding only where graphs are captured: this runner now is.
    engine.policy.fill_graphs = runner if engine.config.adaptive.fill_padding else None
    return engine


@pytest.mark.parametrize("fill", [True, False])
def test_a_cut_budget_fills_the_padding_of_the_graph_it_replays(tiny, monkeypatch, fill):
    """With ``fill_padding`` a step whose budget cut drafts verifies as many as the graph
    it replays holds: its tokens are that graph's (or it admits every draft), and the
    greedy output is still plain greedy's. Without it the same engine leaves cut drafts
    out of padding it computes anyway."""
    prompts = repetitive_prompts(6)
    plain, _ = run(tiny, prompts)
    # Wide graphs the ledger can cover smaller steps with (a huge waste budget: covers
    # are never captured over), and key spans for every step of these prompts.
    seeded = [StepShape(t, r, 128) for t in (16, 32, 48, 64) for r in (8, 16)]
    engine = _capturing_engine(
        tiny, monkeypatch, seeded, num_drafts=6, fill_padding=fill, graph_padding_budget=1e9
    )
    runner = engine.graphs
    proposed, replayed = {}, {}
    policy = engine.policy
    admit, choose = policy._admit, runner.ledger.choose

    def spy_admit(batch, counts, plan):
        admit(batch, counts, plan)
        proposed[engine.stats.num_steps] = (sum(counts), sum(plan.admitted), batch.num_tokens)

    def spy_choose(shape, captured):
        chosen = choose(shape, captured)
        replayed[engine.stats.num_steps] = chosen.num_tokens
        return chosen

    policy._admit = spy_admit
    runner.ledger.choose = spy_choose
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    with torch.inference_mode():
        while engine.has_unfinished():
            engine.step()
    outputs = [r.output_ids for r in requests]
    assert outputs == [o.token_ids for o in plain]
    cut = {
        step: (total, admitted, tokens)
        for step, (total, admitted, tokens) in proposed.items()
        if admitted < total and step in replayed
    }
    left = [step for step, (_, kept, tokens) in cut.items() if tokens + kept < replayed[step]]
    if fill:
        assert engine.stats.filled_steps > 0 and engine.stats.filled_drafts > 0
        assert cut and not left  # every cut step runs its graph full
    else:
        assert engine.stats.filled_steps == 0
        assert left  # cut drafts left out of padding the graph computed anyway


def test_the_ledgers_peek_spends_nothing_and_agrees_with_choose():
    ledger = CaptureLedger(row_padding_waste, budget=1.0)
    captured = {96: None, 128: None}
    assert ledger.peek(96, captured) == 96
    assert ledger.peek(64, captured) == 96 and ledger.spent == {}
    assert ledger.peek(64, captured) == ledger.choose(64, captured) == 96  # spends 0.5
    assert ledger.peek(64, captured) == 64  # the next cover would reach the budget
    assert ledger.choose(64, captured) == 64
    assert ledger.peek(300, captured) == 300  # nothing holds it
    # charge spends what choose spends for the cover peek found, so the shape is still
    # captured after as many (filled) covered steps as unfilled ones.
    charged = CaptureLedger(row_padding_waste, budget=1.0)
    assert charged.peek(64, captured) == 96
    charged.charge(64, captured)
    assert charged.spent == {64: 0.5}
    assert charged.peek(64, captured) == 64 == charged.choose(64, captured)


def test_a_filled_cover_still_gets_its_own_shape_captured(tiny, monkeypatch):
    """A step that fills a cover charges the ledger for its own shape: after as many
    filled covers as unfilled ones would take, ``fill_shape`` offers the own shape
    alone and the next step of it is captured (its covers would be never charged
    otherwise: each filled step runs the cover's own, captured shape)."""
    runner, tables = _faked_capturing_runner(tiny, monkeypatch)
    runner.ledger.budget = 1.0
    own, cover = StepShape(8, 2, 64), StepShape(16, 2, 64)  # waste 8 / 16 = 0.5
    runner.graphs[cover] = None
    assert [runner.fill_shape(own) for _ in range(3)] == [cover, own, own]
    assert runner.ledger.spent == {own: 0.5}  # the second cover would have reached 1.0
    with torch.inference_mode():  # the step of its own shape, unfilled: captured now
        runner.run(tables, np.array([3, 5]), np.array([4, 2]), np.arange(10, 16))
    assert own in runner.graphs and runner.num_covered == 0
    assert runner.fill_shape(own) == own and runner.ledger.spent == {}
    runner.capture = False  # no graphs (the CPU): nothing to fill
    assert runner.fill_shape(StepShape(4, 2, 64)) == StepShape(4, 2, 64)


def test_filled_steps_charge_their_own_shapes_and_stay_lossless(tmp_path, monkeypatch):
    """In the engine, with a DSpark drafter drafting every step: steps fill covers and
    charge their own shapes, and greedy output is plain greedy's."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = DSparkDrafter(random_drafter(target, block_size=5), 16384, 16)
    prompts = repetitive_prompts(6)
    plain, _ = run(target, prompts)
    # Covers for steps of 8 and 16 tokens (6 requests drafting up to 4 each).
    seeded = [StepShape(t, r, 128) for t in (16, 32) for r in (4, 8)]
    engine = _capturing_engine(
        target, monkeypatch, seeded, drafter, num_drafts=4, graph_padding_budget=2.5
    )
    runner = engine.graphs
    charged = []
    charge = runner.ledger.charge

    def spy(shape, captured):
        charged.append(shape)
        charge(shape, captured)

    runner.ledger.charge = spy
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    with torch.inference_mode():
        while engine.has_unfinished():
            engine.step()
    assert [r.output_ids for r in requests] == [o.token_ids for o in plain]
    assert engine.stats.filled_steps > 0 and charged


def test_the_engine_builds_its_drafter_with_padded_greedy_heads(tmp_path):
    """A drafter directory loaded by the engine itself (``EngineConfig.drafter``), padded
    steps on: the greedy heads run padded, with a draft vocabulary, and greedy
    speculation still equals plain greedy."""
    from dspark.models.drafter import save_drafter, write_draft_vocab
    from tests.engine.test_draft_vocab import SUBSET
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    directory = save_drafter(random_drafter(target, block_size=5), tmp_path / "d")
    write_draft_vocab(directory, SUBSET, {"size": len(SUBSET)})
    prompts = repetitive_prompts(6)
    plain, _ = run(target, prompts)
    out, engine = run(
        target,
        prompts,
        spec="fixed",
        num_drafts=5,
        drafter=str(directory),
        draft_vocab="on",
        cuda_graphs="on",
    )
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    heads = engine.drafter.heads
    assert heads.vocab_ids.tolist() == SUBSET.tolist()
    assert heads.num_runs == engine.drafter.graphs.num_runs > 0
    assert heads in engine.padded_runners()
