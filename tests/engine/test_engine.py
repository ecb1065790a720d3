import time

import numpy as np
import pytest
import torch
from scipy import stats

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.llm import RequestOutput
from dspark.engine.request import PromptTooLongError
from dspark.engine.sampling import SamplingParams
from dspark.scheduling.gate import DECLINED, DRAFTED
from tests.conftest import make_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


class RandomCost:
    """Random non-decreasing step costs: forces arbitrary budgets through the verifier."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 1.0 + np.cumsum(self.rng.exponential(self.rng.uniform(0, 0.5), max_drafts + 1))


class CheapCost(RandomCost):
    """Random costs where drafts are nearly free: budgets vary but stay large."""

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 1.0 + np.cumsum(self.rng.exponential(0.002, max_drafts + 1))


def run(loaded, prompts, params=GREEDY, **config):
    cost = config.pop("cost_model", None)
    if cost is not None:  # an injected cost model is what the test exercises: no gate
        config.setdefault("throughput_gate", False)
    drafter = config.pop("drafter_model", None)
    drafter_graphs = config.pop("drafter_graphs", None)  # padded block passes
    if drafter is not None:  # a DSpark drafter model built for this (random) target
        from dspark.engine.drafter import DSparkDrafter

        heads = config.get("head_graphs", True)
        drafter = DSparkDrafter(drafter, 16384, 16, graphs=drafter_graphs, head_graphs=heads)
    engine = LLMEngine(loaded, EngineConfig(**config), drafter=drafter, cost_model=cost)
    requests = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return [RequestOutput.from_request(r) for r in requests], engine


def repetitive_prompts(n, seed=0):
    """Prompts with repeats, so the n-gram drafter finds matches and drafts."""
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(n):
        motif = rng.integers(0, 256, rng.integers(2, 6)).tolist()
        prompts.append(
            (motif * rng.integers(2, 8))[: 5 + 3 * i % 40] + rng.integers(0, 256, 3).tolist()
        )
    return prompts


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


@pytest.mark.parametrize("spec", ["fixed", "adaptive"])
def test_greedy_speculation_equals_plain_greedy_on_a_random_model(tiny, spec):
    prompts = repetitive_prompts(12)
    plain, _ = run(tiny, prompts)
    budgets, cuts = set(), []
    for k, seed in ((1, 0), (3, 1), (6, 2)):
        cost = RandomCost(seed) if spec == "adaptive" else None
        spec_out, engine = run(tiny, prompts, spec=spec, num_drafts=k, cost_model=cost)
        assert [o.token_ids for o in spec_out] == [o.token_ids for o in plain]
        assert engine.stats.num_decode_rounds > 0
        assert sum(o.num_drafts_verified for o in spec_out) > 0  # drafts really were verified
        budgets |= set(engine.stats.budgets)
        cuts.append(engine.stats.budget_cuts)
        assert engine.stats.budget_cuts <= len(engine.stats.budgets)
    if spec == "adaptive":
        assert len(budgets) > 3, budgets  # the random costs varied the budget
        assert sum(cuts) > 0  # and some budgets verified fewer drafts than were proposed


def test_the_drafter_products_follow_a_plan_measured_on_its_own_weights(tmp_path):
    """On the CPU the drafter's weights are tuned after the target's: its own shapes
    follow the plan timed on its weights, the shapes it shares with the target keep the
    plan timed on the target's."""
    from dspark.ops import linear as ops
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=2)
    drafter = random_drafter(target, block_size=3)
    _, engine = run(target, [[1, 2, 3]], spec="fixed", num_drafts=2, drafter_model=drafter)
    weights = engine.drafter.linear_weights()
    target_weights = target.model.linear_weights()

    def key_of(weight_set):  # as tune_small_rows keys its plans
        shapes = tuple(tuple(w.shape) for w in weight_set)
        return shapes, weight_set[0].dtype, torch.get_num_threads()

    def plan_of(weight_set):
        return ops._TUNED[key_of(weight_set)]

    target_shapes = {tuple(w.shape) for w in target_weights}
    own = [w for w in weights if tuple(w.shape) not in target_shapes]
    shared = [w for w in weights if tuple(w.shape) in target_shapes]
    try:
        assert own and shared  # both kinds of shape are met
        for w in own:
            assert ops.row_plan(tuple(w.shape)) is plan_of(weights)
        for w in shared:
            assert ops.row_plan(tuple(w.shape)) is plan_of(target_weights)
        head = engine.drafter.head_weight  # None: drafting from the whole vocabulary
        assert weights[-1] is (target.model.lm_head.weight if head is None else head)
    finally:
        ops.forget_small_rows(weights)
        for weight_set in (weights, target_weights):
            ops._TUNED.pop(key_of(weight_set), None)


@pytest.mark.parametrize(
    ("spec", "lookahead", "block"),
    [
        ("fixed", "off", "auto"),
        ("adaptive", "off", "auto"),
        ("adaptive", "on", "auto"),
        ("fixed", "off", "full"),
        ("adaptive", "off", "full"),
    ],
)
def test_greedy_speculation_with_a_dspark_drafter_equals_plain_greedy(
    tmp_path, spec, lookahead, block
):
    """With the look-ahead on, depths decided ahead are taken by the same decodes and,
    most of the time, by batches that changed (``lookahead_reuse``), and such batches take
    their shares of the budget planned ahead (``lookahead_shares``): still lossless. The
    drafter's block cut to each step's depth (``draft_block`` "auto") or whole."""
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=5)
    prompts = repetitive_prompts(10)
    plain, _ = run(target, prompts)
    reused = shared = 0
    for k, seed in ((2, 0), (5, 1)):
        cost = RandomCost(seed) if spec == "adaptive" else None
        out, engine = run(
            target,
            prompts,
            spec=spec,
            num_drafts=k,
            cost_model=cost,
            drafter_model=drafter,
            lookahead=lookahead,
            max_num_seqs=4,
            draft_block=block,
        )
        assert engine.drafter.block_cut == (block == "auto")
        assert [o.token_ids for o in out] == [o.token_ids for o in plain]
        assert engine.stats.num_verified > engine.stats.num_decode_rounds
        reused += engine.stats.lookahead_reused
        shared += engine.stats.share_plans
    assert (reused > 0) == (lookahead == "on")
    assert (shared > 0) == (lookahead == "on")


@pytest.mark.parametrize("regions", ["on", "off"])
def test_kv_regions_read_attention_in_place_and_change_no_token(tmp_path, monkeypatch, regions):
    """``EngineConfig.kv_regions``: the target's and the drafter's caches give each slot
    a region, batches of decodes read their keys in place (counted), and greedy
    speculation still equals plain greedy; "off" gathers every batch."""
    from dspark.engine.drafter import DSparkDrafter
    from dspark.engine.kv_cache import PagedKVCache
    from tests.models.test_drafter import random_drafter

    in_place = {"target": 0, "drafter": 0}
    build = PagedKVCache.attention_batch

    def counted(self, tables, num_cached, num_query, causal=True):
        batch = build(self, tables, num_cached, num_query, causal)
        in_place["target" if causal else "drafter"] += sum(g.read_stride > 0 for g in batch.groups)
        return batch

    monkeypatch.setattr(PagedKVCache, "attention_batch", counted)
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    prompts = repetitive_prompts(10)
    plain, _ = run(target, prompts, kv_regions="off")
    engine = LLMEngine(
        target,
        EngineConfig(spec="adaptive", num_drafts=3, max_num_seqs=4, kv_regions=regions),
        drafter=DSparkDrafter(
            random_drafter(target, block_size=5), 16384, 16, regions=4 * (regions == "on")
        ),
    )
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    assert [r.output_ids for r in requests] == [o.token_ids for o in plain]
    assert engine.stats.num_verified > engine.stats.num_decode_rounds
    assert engine.kv_regions == (4 if regions == "on" else 0)
    if regions == "on":
        assert in_place["target"] > 20 and in_place["drafter"] > 5
    else:
        assert in_place == {"target": 0, "drafter": 0}
    with pytest.raises(ValueError, match="kv_regions must be 'auto', 'on' or 'off'"):
        EngineConfig(kv_regions="maybe")


def test_greedy_speculation_with_cuts_left_unmade_equals_plain_greedy(tmp_path, monkeypatch):
    """``EngineConfig.cheap_cuts``: a step that verifies all its drafts where its budget
    would cut them (here every such step: ``_cut_is_dear`` forced) stays lossless."""
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=5)
    prompts = repetitive_prompts(10)
    plain, _ = run(target, prompts)
    monkeypatch.setattr(LLMEngine, "_cut_is_dear", lambda self, batch, budget, total: True)
    out, engine = run(
        target,
        prompts,
        spec="adaptive",
        num_drafts=5,
        cost_model=RandomCost(0),
        drafter_model=drafter,
        lookahead="on",
        max_num_seqs=4,
        cheap_cuts="on",
    )
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    assert engine.stats.cheap_cuts > 0


def restless_ceiling(k):
    """A depth ceiling that moves on any measured difference after two steps an arm and
    searches again two steps after it settles: its steps draft at many depths below what
    the cost model chose. It counts the arms it hands out and the records it gets."""
    from dspark.scheduling.ceiling import DepthCeiling

    class Counting(DepthCeiling):
        handed = recorded = 0

        def decide(self, num_reqs, depth):
            capped, arm = super().decide(num_reqs, depth)
            self.handed += arm is not None
            return capped, arm

        def record(self, arm, tokens, wall_ms):
            self.recorded += 1
            super().record(arm, tokens, wall_ms)

    return Counting(k, window=4, min_steps=2, explore_every=2, confidence=0.0, reopen_after=2)


@pytest.mark.parametrize(
    ("lookahead", "forced", "settle_depth"),
    [
        ("off", None, "median"),
        ("on", None, "median"),
        ("on", 2, "median"),
        ("on", None, "measured"),
    ],
)
def test_greedy_speculation_settled_equals_plain_greedy(
    tmp_path, monkeypatch, lookahead, forced, settle_depth
):
    """``EngineConfig.settle``: with drafts priced nearly free (``CheapCost``) the cuts
    buy less than scheduling costs, so the engine settles; its settled steps draft the
    settled depth (less only where a request's length limit is lower; ``forced``: every
    stretch settled at that depth instead of the window's, K = 5), verify every draft
    and schedule nothing, one step in ``SETTLE_STEPS + 1`` decides again, every verified
    round's outcome reaches the verifier (the one before a stretch waits through it),
    a stretch's last step records its round, and greedy output is plain greedy's.
    ``settle_depth="measured"``: every timed settled step's tokens are kept, under the
    depth its stretch drafted (every stretch kept here, not only the latest few)."""
    import dspark.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "SETTLE_RECORDS", 10_000)
    from dspark.engine.drafter import DSparkDrafter
    from dspark.engine.engine import SETTLE_STEPS, SETTLE_WINDOW, STEP_FIELDS
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=5)
    prompts = repetitive_prompts(24)
    plain, _ = run(target, prompts)
    config = EngineConfig(
        spec="adaptive",
        num_drafts=5,
        max_num_seqs=4,
        throughput_gate=False,
        lookahead=lookahead,
        calibrate_survival=True,
        settle="on",
        settle_depth=settle_depth,
    )
    engine = LLMEngine(
        target, config, drafter=DSparkDrafter(drafter, 16384, 16), cost_model=CheapCost(0)
    )
    proposed = []  # drafts proposed a step, for the steps that drafted
    propose = engine.drafter.propose

    def counted(requests, limits, **kwargs):
        proposal = propose(requests, limits, **kwargs)
        proposed.append(
            sum(min(len(t), int(n)) for t, n in zip(proposal.tokens, limits, strict=True))
        )
        return proposal

    engine.drafter.propose = counted
    weigh = engine._weigh_settling

    def weighed(depth):
        weigh(depth)
        if forced is not None and engine._settled_left == SETTLE_STEPS:
            engine._settled_depth = forced

    engine._weigh_settling = weighed
    outcomes = {"made": 0, "recorded": 0}
    learn, record = engine._learn_outcome, engine.verifier.record_outcomes

    def learnt(admitted, accepted):
        before = engine._outcome
        learn(admitted, accepted)
        outcomes["made"] += engine._outcome is not None and engine._outcome is not before

    def recorded(*outcome):
        outcomes["recorded"] += 1
        record(*outcome)

    engine._learn_outcome, engine.verifier.record_outcomes = learnt, recorded
    rounds = []  # the rounds the verifier recorded
    record_round = engine.verifier.record
    engine.verifier.record = lambda *round_: (rounds.append(round_), record_round(*round_))
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    drafted = []  # per step: whether the drafter ran
    stretch = []  # per settled step: whether it was a stretch's last, rounds it recorded
    shown = set()  # ``settled_depth`` after each step (the server's gauge)
    while engine.has_unfinished():
        runs, recorded_rounds = len(proposed), len(rounds)
        engine.step()
        drafted.append(len(proposed) > runs)
        shown.add(engine.settled_depth)
        if engine._coasting:
            stretch.append((engine._settled_left == 0, len(rounds) - recorded_rounds))
    out = [RequestOutput.from_request(r) for r in requests]
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    stats = engine.stats
    assert stats.settles > 1
    assert SETTLE_STEPS < stats.settled_steps <= stats.settles * SETTLE_STEPS
    rows = [dict(zip(STEP_FIELDS, row, strict=True)) for row in stats.step_log]
    settled = [r for r in rows if r["settled"]]
    assert len(settled) == stats.settled_steps
    assert all(r["schedule_ms"] == r["shape_ms"] == r["decide_ms"] == 0.0 for r in settled)
    # A settled step verifies every draft it proposed, drafting the settled depth.
    depth = 5 if forced is None else forced
    proposed_by_step = iter(proposed)
    for row, ran in zip(rows, drafted, strict=True):
        count = next(proposed_by_step) if ran else 0
        if row["settled"]:
            assert ran and row["drafts"] == count and 0 < row["depth"] <= depth
    assert max(r["depth"] for r in settled) == depth
    assert shown == {0, depth}
    # A stretch holds batches of half to twice the window's size (here 2-4 decoding).
    assert min(r["requests"] for r in settled if r["chunk_tokens"] == 0) >= 2
    # Decided steps: at least the first SETTLE_WINDOW and one after each stretch (and
    # more where the batch left the window's size, which forgets the window).
    decided = sum(stats.depth_steps.values())
    assert decided >= SETTLE_WINDOW + stats.settles - 1
    # Settled steps record no round, but each stretch's last, for the step deciding next.
    assert set(stretch) == {(False, 0), (True, 1)}
    # Every outcome made was recorded, but for one still waiting at the end.
    assert outcomes["made"] > stats.settles
    assert outcomes["recorded"] + (engine._outcome is not None) == outcomes["made"]
    kept = [(d, *record) for d, records in engine._stretches.items() for record in records]
    if settle_depth == "median":
        assert not kept and engine._stretch == [0, 0.0]
    else:
        # Every timed settled step's tokens, kept under its stretch's depth (or in the
        # stretch still open at the end), at the batch size its window was weighed at.
        timed = [r for r in settled if not r["captured"]]
        assert sum(k[2] for k in kept) + engine._stretch[0] == sum(r["emitted"] for r in timed)
        assert {k[0] for k in kept} <= {r["depth"] for r in settled}
        assert all(2 <= k[1] <= 4 and k[3] > 0.0 for k in kept)
        assert len(kept) >= stats.settles - 1
    # "auto" by default, which is off on a CPU; only "auto", "on" or "off".
    _, plain_adaptive = run(
        target,
        prompts[:4],
        spec="adaptive",
        num_drafts=5,
        cost_model=CheapCost(0),
        drafter_model=drafter,
        max_num_seqs=4,
    )
    assert plain_adaptive.stats.settled_steps == 0 and not plain_adaptive._settles
    assert EngineConfig().settle == "auto"
    with pytest.raises(ValueError, match="settle"):
        EngineConfig(settle="sometimes")
    assert EngineConfig().settle_depth == "median"
    with pytest.raises(ValueError, match="settle_depth must be 'median' or 'measured'"):
        EngineConfig(settle_depth="deepest")
    with pytest.raises(ValueError, match="draft_block must be 'auto', 'full' or 'cut'"):
        EngineConfig(draft_block="half")


class RandomCeiling:
    """A depth ceiling that caps each step at a random depth (seeded, blind to the
    drafts): whatever a ceiling decides, sampling must stay lossless."""

    def __init__(self, max_depth, seed=0):
        self.max_depth = max_depth
        self.rng = np.random.default_rng(seed)

    def decide(self, num_reqs, depth):
        return int(self.rng.integers(1, depth + 1)), None


def test_greedy_speculation_under_a_depth_ceiling_equals_plain_greedy(tmp_path):
    """``depth_ceiling``: the ceiling caps the depth before the drafter runs, from past
    steps' timings only, so greedy output is unchanged while the depths it drafts move."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=5)
    prompts = repetitive_prompts(24)  # many join while others decode: steps with a chunk
    plain, _ = run(target, prompts)
    for lookahead in ("off", "on"):
        config = EngineConfig(
            spec="adaptive",
            num_drafts=5,
            max_num_seqs=4,
            throughput_gate=False,
            lookahead=lookahead,
            depth_ceiling=True,
        )
        engine = LLMEngine(
            target, config, drafter=DSparkDrafter(drafter, 16384, 16), cost_model=CheapCost(1)
        )
        assert engine.ceiling is not None and engine.ceiling.max_depth == 5
        engine.ceiling = restless_ceiling(5)
        requests = [engine.add_request(p, GREEDY) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        out = [RequestOutput.from_request(r) for r in requests]
        assert [o.token_ids for o in out] == [o.token_ids for o in plain]
        # the ceiling moved and cut depths the cheap cost model wanted full
        assert engine.ceiling.moves > 0 and engine.stats.ceiling_cuts > 0
        assert sum(n for depth, n in engine.stats.depth_steps.items() if 0 < depth < 5) > 0
        # Every arm handed out was recorded once, by its own step, and by no later step
        # with a prompt chunk (no graphs on this CPU: every step is timed).
        assert engine.ceiling.recorded == engine.ceiling.handed > 0
    assert EngineConfig(spec="adaptive").depth_ceiling is False  # off by default


def concentrated_model(tmp_path, live: int = 6):
    """A tiny target whose next token is almost always one of ``live`` tokens, so a
    drafter sharing its LM head gets drafts accepted often at temperature 1."""
    loaded = make_tiny_model(tmp_path / "c", num_hidden_layers=3)
    with torch.no_grad():
        head = loaded.model.lm_head.weight
        head[live:] = 0.0
        head[:live] *= 3.0
        loaded.model.embed_tokens.weight[live:] = loaded.model.embed_tokens.weight[:live].repeat(
            -(-(head.shape[0] - live) // live), 1
        )[: head.shape[0] - live]
    return loaded


def exact_first_two(loaded, prompt, live: int) -> tuple[np.ndarray, np.ndarray]:
    """The target's exact marginals of generated tokens 1 and 2 (others summed last)."""
    from tests.models.test_llama import packed_logits

    first = torch.softmax(packed_logits(loaded, [prompt])[0][-1], -1).double()
    second = torch.zeros_like(first)
    for token in range(first.shape[0]):
        if first[token] > 1e-12:
            logits = packed_logits(loaded, [[*prompt, token]])[0][-1]
            second += first[token] * torch.softmax(logits, -1).double()

    def bucket(p):
        return np.append(p[:live].numpy(), p[live:].sum().item())

    return bucket(first), bucket(second)


@pytest.mark.parametrize(
    ("draft_vocab", "padded", "ceiling", "settle"),
    [
        (None, False, False, "off"),
        (None, True, False, "off"),
        ([0, 2, 3, 6, 7, 8], False, False, "off"),
        (None, False, True, "off"),
        (None, False, False, "on"),
    ],
)
def test_adaptive_sampling_with_a_dspark_drafter_follows_the_target(
    tmp_path, draft_vocab, padded, ceiling, settle
):
    """Losslessness must survive the budget, the allocation and the drafter's own draft
    distribution: at temperature 1 the first two tokens follow the target exactly. With a
    draft vocabulary that leaves out half of the target's likely tokens (1, 4, 5), those
    can only come from the residual distribution. ``padded``: padded steps, the drafter's
    heads sampling in ``DraftHeads`` as on a GPU. ``ceiling``: a depth ceiling caps the
    depths drafted at random (``RandomCeiling``; the requests come in waves, so that steps
    of decodes alone, the ones a ceiling caps, come often). ``settle``: most steps draft
    a settled depth undecided (``EngineConfig.settle``)."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    live = 6
    target = concentrated_model(tmp_path, live)
    drafter = random_drafter(target, block_size=4).set_draft_vocab(draft_vocab)
    prompt = [3, 1, 4, 1, 5]
    exact1, exact2 = exact_first_two(target, prompt, live)
    engine = LLMEngine(
        target,
        EngineConfig(
            spec="adaptive",
            num_drafts=3,
            max_num_seqs=64,
            kv_cache_tokens=8192,
            throughput_gate=False,
            # The subset's drafts almost never survive, whatever the random drafter's
            # confidences say: plans corrected by outcomes would rightly stop verifying
            # them, and this test needs them verified.
            calibrate_survival=draft_vocab is None,
            cuda_graphs="on" if padded else "off",
            depth_ceiling=ceiling,
            settle=settle,
        ),
        drafter=DSparkDrafter(drafter, 8192, 16, graphs=(64, 256) if padded else None),
        cost_model=CheapCost(3),
    )
    wave = 64 if ceiling else 2000
    if ceiling:
        engine.ceiling = RandomCeiling(3)
    requests = []
    for first in range(0, 2000, wave):
        requests += [
            engine.add_request(
                prompt, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=i)
            )
            for i in range(first, first + wave)
        ]
        while engine.has_unfinished():
            engine.step()
    # Drafts were accepted (fewer from the subset: its tokens 6-8 are ones the target
    # almost never picks) and rejected, so both acceptance and the residual are exercised.
    extra = 300 if draft_vocab is None else 30
    assert engine.stats.num_accepted > engine.stats.num_decode_rounds + extra
    if padded:
        assert engine.drafter.heads.num_runs == len(engine.stats.drafter_ms) > 0
    if ceiling:  # the trial's steps drafted shallower than the cost model chose
        assert engine.stats.ceiling_cuts > 0
    if settle == "on":
        assert engine.stats.settled_steps > sum(engine.stats.depth_steps.values())
    for position, exact in ((0, exact1), (1, exact2)):
        tokens = np.array([r.output_ids[position] for r in requests])
        counts = np.bincount(np.minimum(tokens, live), minlength=live + 1).astype(float)
        keep = exact > 1e-4
        expected = exact[keep] / exact[keep].sum() * counts[keep].sum()
        assert stats.chisquare(counts[keep], expected).pvalue > 1e-3, (counts, exact)


def test_64_concurrent_mixed_requests_complete_with_their_single_request_outputs(tiny):
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(1, 120, 64)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=int(m), ignore_eos=True)
        for m in rng.integers(1, 30, 64)
    ]
    engine = LLMEngine(
        tiny,
        EngineConfig(
            max_num_seqs=64,
            max_num_batched_tokens=256,
            spec="adaptive",
            num_drafts=3,
            throughput_gate=False,
        ),
        cost_model=CheapCost(3),
    )
    requests = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    while engine.has_unfinished():
        engine.step()
    for request, prompt, p in zip(requests, prompts, params, strict=True):
        alone, _ = run(tiny, [prompt], p)
        assert request.finish_reason.value == "length"
        assert request.output_ids == alone[0].token_ids
        assert len(request.output_ids) == p.max_tokens


def test_small_cache_preempts_and_still_completes_everything(tiny):
    prompts = [list(range(i, i + 40)) for i in range(8)]
    expected, _ = run(tiny, prompts)
    # 12 blocks of 16 rows hold 192 tokens: not enough for 8 x 80, so requests preempt.
    outputs, engine = run(tiny, prompts, kv_cache_tokens=192, block_size=16, max_model_len=128)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    assert sum(r.num_preemptions for r in engine.requests.values()) > 0


def test_finish_reasons_eos_stop_string_and_length(tiny):
    engine = LLMEngine(tiny, EngineConfig())
    # Find what the model says greedily, then stop on a piece of it.
    probe = engine.add_request(
        [65, 66, 67], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    )
    while engine.has_unfinished():
        engine.step()
    text = tiny.tokenizer.decode(probe.output_ids)
    stop = text[5:7]
    assert stop and stop in text
    stopped = engine.add_request(
        [65, 66, 67], SamplingParams(temperature=0, max_tokens=30, stop=(stop,), ignore_eos=True)
    )
    short = engine.add_request([65, 66, 67], SamplingParams(temperature=0, max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    assert stopped.finish_reason.value == "stop"
    assert stopped.text == text[: text.find(stop)]
    assert short.finish_reason.value == "length" and len(short.output_ids) == 4
    # EOS (token 256): make it the argmax everywhere by boosting its logit bias.
    with torch.no_grad():
        tiny.model.lm_head.weight[256] = 5.0
    eos = engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=10))
    while engine.has_unfinished():
        engine.step()
    assert eos.finish_reason.value == "stop" and eos.output_ids == []


def test_bad_requests_fail_alone(tiny):
    from dspark.engine.llm import LLM

    llm = LLM.__new__(LLM)
    llm.engine, llm.tokenizer = LLMEngine(tiny, EngineConfig(max_model_len=64)), tiny.tokenizer
    outputs = llm.generate([[1] * 80, [5, 6, 7], []], SamplingParams(temperature=0, max_tokens=3))
    assert outputs[0].finish_reason == "error" and "64" in outputs[0].error
    assert outputs[1].finish_reason == "length" and len(outputs[1].token_ids) == 3
    assert outputs[2].finish_reason == "error" and "empty" in outputs[2].error
    with pytest.raises(PromptTooLongError):
        llm.engine.add_request([1] * 64, SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        llm.engine.add_request([1], SamplingParams(), request_id="x")
        llm.engine.add_request([1], SamplingParams(), request_id="x")
    with pytest.raises(ValueError, match="fit kv_cache_tokens"):
        EngineConfig(max_model_len=4096, kv_cache_tokens=1024)
    with pytest.raises(ValueError, match="sometimes"):
        EngineConfig(spec="sometimes")


def test_seeded_sampling_is_reproducible_and_seeds_differ(tiny):
    params = [
        SamplingParams(temperature=1.0, max_tokens=20, seed=s, ignore_eos=True) for s in (1, 1, 2)
    ]
    outputs = [
        run(tiny, [[10, 11, 12]], p, spec="fixed", num_drafts=3)[0][0].token_ids for p in params
    ]
    assert outputs[0] == outputs[1] != outputs[2]


def test_unseeded_requests_never_share_a_seed_when_finished_ones_are_released(tiny):
    """A server releases each finished request; requests that arrive one at a time must
    still sample from seeds of their own."""
    engine = LLMEngine(tiny, EngineConfig(seed=3))
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    seeds, outputs = [], []
    for _ in range(3):
        request = engine.add_request([10, 11, 12], params)
        seeds.append(request.generator.initial_seed())
        while engine.has_unfinished():
            engine.step()
        outputs.append(request.output_ids)
        engine.requests.pop(request.request_id)  # as the server does
    assert seeds == [3 * 1_000_003 + i for i in range(3)]
    assert len({tuple(o) for o in outputs}) > 1


def test_greedy_speculation_on_smollm2_matches_plain_greedy_up_to_exact_ties(smollm2):
    from dspark.engine.llm import LLM

    prompts = [
        "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    ]
    llm = LLM.__new__(LLM)
    llm.tokenizer = smollm2.tokenizer
    ids = [smollm2.tokenizer.encode(p) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain, _ = run(smollm2, ids, params)
    cases = (("fixed", None, "ngram"), ("adaptive", RandomCost(9), "ngram"))
    cases += (("fixed", None, "dspark"), ("adaptive", RandomCost(9), "dspark"))
    for spec, cost, drafter in cases:
        spec_out, engine = run(
            smollm2, ids, params, spec=spec, num_drafts=4, cost_model=cost, drafter=drafter
        )
        assert engine.stats.num_verified > engine.stats.num_decode_rounds  # drafts were verified
        for p, a, b in zip(ids, plain, spec_out, strict=True):
            i = first_divergence(a.token_ids, b.token_ids)
            if i is None:
                continue
            # Only an exact numerical tie may flip: the plain run's top-2 logits at i.
            context = torch.tensor(p + a.token_ids[:i])
            top2 = plain_logits(smollm2, context).topk(2).values
            assert float(top2[0] - top2[1]) < 1e-4, f"divergence at {i} is not a tie"


def plain_logits(loaded, ids):
    from tests.models.test_llama import packed_logits

    return packed_logits(loaded, [ids.tolist()])[0][-1]


def test_long_prompts_prefill_in_chunks_alongside_decodes(tiny):
    long_prompt = list(np.random.default_rng(1).integers(0, 256, 300))
    short = [5, 6, 7]
    expected = [run(tiny, [p])[0][0].token_ids for p in (long_prompt, short)]
    engine = LLMEngine(tiny, EngineConfig(max_num_batched_tokens=64))
    requests = [engine.add_request(p, GREEDY) for p in (short, long_prompt)]
    chunk_sizes = []
    while engine.has_unfinished():
        before = requests[1].num_computed
        engine.step()
        if requests[1].num_computed > before:
            chunk_sizes.append(requests[1].num_computed - before)
    # The 300-token prompt shares 64-token steps with the decoding short request.
    assert max(chunk_sizes) <= 63 and len(chunk_sizes) > 5
    assert [r.output_ids for r in requests] == [expected[1], expected[0]]


def test_throughput_gate_measures_both_arms_and_stays_lossless(tiny):
    prompts = repetitive_prompts(12)
    plain, _ = run(tiny, prompts)
    out, engine = run(
        tiny, prompts, spec="adaptive", num_drafts=3, cost_model=CheapCost(1), throughput_gate=True
    )
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    drafted, undrafted = engine.gate.rates(12)
    assert drafted is not None and undrafted is not None  # both arms were timed
    assert engine.stats.undrafted_steps >= engine.gate.min_steps
    assert len(engine.stats.drafter_ms) >= engine.gate.min_steps


class ScriptedGate:
    """A throughput gate that drafts on a fixed pattern of steps."""

    min_steps = 0

    def __init__(self, pattern):
        self.pattern, self.calls = pattern, 0

    def should_draft(self, num_reqs, mixed=False):
        self.calls += 1
        return self.pattern[self.calls % len(self.pattern)]

    def should_probe(self, num_reqs, mixed=False):
        return False  # the pattern alone decides

    def record(self, num_reqs, drafted, tokens, wall_ms, mixed=False, declined=False):
        pass


@pytest.mark.parametrize("pattern", [[True, False, False], [False] * 34 + [True] * 6])
def test_deferred_drafter_upkeep_drafts_exactly_as_eager_upkeep(tmp_path, pattern):
    """Context updates held back on undrafted steps and run batched before the next
    drafting step leave the drafter in the same state: same drafts, same acceptance."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=4)
    prompts = repetitive_prompts(8)
    # Long enough that the second pattern holds back more than DEFER_LIMIT steps.
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    results = []
    for defer in (False, True):
        engine = LLMEngine(
            target,
            EngineConfig(spec="adaptive", num_drafts=3, defer_upkeep=defer),
            drafter=DSparkDrafter(drafter, 16384, 16),
            cost_model=CheapCost(2),
        )
        engine.gate = ScriptedGate(pattern)
        engine.round_log = []  # the drafter's confidences of every drafted round
        requests = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        confidences = [c for c, _, _ in engine.round_log if c is not None]
        results.append(([r.output_ids for r in requests], confidences))
        assert engine.stats.undrafted_steps > 0 and engine.stats.num_verified > 0
        assert not engine._deferred
    assert results[0][0] == results[1][0]
    # The confidences are computed from the drafter's context: equal only if the held-back
    # updates reproduced it (up to rounding: batched products round differently).
    assert len(results[1][1]) > 10
    np.testing.assert_allclose(np.array(results[0][1]), np.array(results[1][1]), atol=1e-5)


def _prefill_beside_decodes(engine, prompt_length):
    """Two short requests decode for three steps; then a long prompt arrives. Returns the
    outputs, the long prompt's chunk sizes and, per step from its arrival, whether the step
    held its draft room back."""
    requests = [engine.add_request(p, GREEDY) for p in ([5, 6, 7], [9, 8, 7, 6])]
    for _ in range(3):
        engine.step()
    long_prompt = np.random.default_rng(1).integers(0, 256, prompt_length).tolist()
    requests.append(engine.add_request(long_prompt, GREEDY))
    sizes, held = [], []
    while engine.has_unfinished():
        before = requests[2].num_computed
        engine.step()
        held.append(engine._room_held)
        if before < prompt_length:  # a chunk of the prompt (then it decodes)
            sizes.append(requests[2].num_computed - before)
    return [r.output_ids for r in requests], sizes, held


@pytest.mark.parametrize("hold", ["on", "off"])
def test_after_an_undrafted_decision_a_prompt_chunk_takes_the_draft_room(tiny, hold):
    """``hold_draft_room``: once a decided step drafted nothing (here the gate vetoes every
    step), a step with prompt work schedules no draft room, so the chunk takes all the
    budget the two decodes leave (62 of 64 tokens), as without speculation; off, each
    decode reserves 3 drafts and the chunk gets 56. Lossless either way."""
    config = {"max_num_batched_tokens": 64}
    expected, plain_sizes, _ = _prefill_beside_decodes(LLMEngine(tiny, EngineConfig(**config)), 300)
    assert plain_sizes == [62, 62, 62, 62, 52]
    engine = LLMEngine(
        tiny,
        EngineConfig(spec="adaptive", num_drafts=3, hold_draft_room=hold, **config),
        cost_model=CheapCost(3),
    )
    engine.gate = ScriptedGate([False])  # the cost model drafts, the gate says no
    outputs, sizes, held = _prefill_beside_decodes(engine, 300)
    assert outputs == expected
    if hold == "on":
        assert sizes == plain_sizes
        assert held[:5] == [True] * 5 and not any(held[5:])  # decodes alone decide again
        assert engine.stats.held_steps == 5
    else:
        assert sizes == [56] * 5 + [20]
        assert engine.stats.held_steps == 0 and not any(held)


def test_held_steps_defer_the_drafters_upkeep_and_stay_lossless(tmp_path):
    """With a DSpark drafter (it observes every kept position), a step holding its draft
    room back keeps the drafter's context update for later, as an undrafted step does;
    drafting resumes after the prompt and the output is plain greedy's."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=4)
    expected, _, _ = _prefill_beside_decodes(
        LLMEngine(target, EngineConfig(max_num_batched_tokens=32)), 200
    )
    engine = LLMEngine(
        target,
        EngineConfig(
            spec="adaptive", num_drafts=3, max_num_batched_tokens=32, hold_draft_room="on"
        ),
        drafter=DSparkDrafter(drafter, 16384, 16),
        cost_model=CheapCost(5),
    )
    engine.gate = ScriptedGate([False, False, True])  # drafts one decided step in three
    deferred = []
    original = engine._observe

    def observe(kept, features):
        original(kept, features)
        if engine._room_held:
            deferred.append(bool(engine._deferred))

    engine._observe = observe
    outputs, _, _ = _prefill_beside_decodes(engine, 200)
    assert outputs == expected
    assert engine.stats.held_steps > 0 and len(deferred) == engine.stats.held_steps
    assert all(deferred)  # every held step's update waits
    assert engine.stats.num_verified > 0 and not engine._deferred


def test_draft_room_is_held_back_at_most_hold_limit_steps_in_a_row(tiny):
    """A long prompt (fourteen chunks of at most 30 tokens): after ``HOLD_LIMIT`` held
    steps one step reserves the room (a chunk of 24) and decides again (the gate still
    says no), then the holding resumes."""
    from dspark.engine.engine import HOLD_LIMIT

    engine = LLMEngine(
        tiny,
        EngineConfig(
            spec="adaptive", num_drafts=3, max_num_batched_tokens=32, hold_draft_room="auto"
        ),
        cost_model=CheapCost(4),
    )
    assert engine._holds_room  # "auto" on a CPU: no look-ahead
    with pytest.raises(ValueError, match="hold_draft_room"):
        EngineConfig(hold_draft_room="yes")
    engine.gate = ScriptedGate([False])
    _, sizes, held = _prefill_beside_decodes(engine, 400)
    assert HOLD_LIMIT == 8
    assert sizes == [30] * 8 + [24] + [30] * 4 + [16]
    assert held[: len(sizes)] == [True] * 8 + [False] + [True] * 5


class LedgerGate(ScriptedGate):
    """A scripted gate that keeps every step it times, in order."""

    def __init__(self, pattern):
        super().__init__(pattern)
        self.log = []

    def record(self, num_reqs, drafted, tokens, wall_ms, mixed=False, declined=False):
        self.log.append((drafted, wall_ms))


@pytest.mark.parametrize(("in_price", "lookahead"), [(True, "off"), (False, "off"), (True, "on")])
def test_held_back_upkeep_leaves_the_step_that_runs_it_and_prices_the_undrafted_ones(
    tmp_path, in_price, lookahead
):
    """The drafted step that catches the drafter up runs the undrafted steps' upkeep: the
    gate and the cost model see that time spread over the undrafted steps, not in the
    drafted step (the cost model only with ``upkeep_in_price``; with the look-ahead, as
    on a GPU, the cost model learns each step during the next one's forward)."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    pause = 0.5  # far longer than a step of the tiny model, even in a slow phase of a VM
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    engine = LLMEngine(
        target,
        EngineConfig(spec="adaptive", num_drafts=3, upkeep_in_price=in_price, lookahead=lookahead),
        drafter=DSparkDrafter(random_drafter(target, block_size=4), 16384, 16),
        cost_model=CheapCost(2),
    )
    engine.gate = gate = LedgerGate([False, False, True])  # two undrafted, one drafted
    flush, flushed = engine._flush_upkeep, []

    def slow_flush():
        if engine._deferred:
            flushed.append(len(engine._deferred))
            time.sleep(pause)
        flush()

    engine._flush_upkeep = slow_flush
    # Each timed step's host time up to the gate's record, flushes included, and whether
    # it flushed: the gate's figure is checked against the step's own time, so a stall
    # of the machine (a VM's) moves both alike.
    started, spent = [0.0, False], []
    step, record = engine.step, gate.record

    def timed_step():
        started[:] = [time.perf_counter(), len(flushed)]
        return step()

    def timed_record(*args, **kwargs):
        spent.append(((time.perf_counter() - started[0]) * 1e3, len(flushed) > started[1]))
        record(*args, **kwargs)

    engine.step, gate.record = timed_step, timed_record
    priced = []  # the cost model's steps: (depth, ms)

    def record_step(num_reqs, num_tokens, num_drafts, depth, wall_ms, *rest, **extra):
        priced.append((depth, wall_ms))

    engine.verifier.cost_model.record_step = record_step
    plain, _ = run(target, repetitive_prompts(2))
    requests = [engine.add_request(p, GREEDY) for p in repetitive_prompts(2)]
    while engine.has_unfinished():
        engine.step()
    assert [r.output_ids for r in requests] == [o.token_ids for o in plain]
    assert len(flushed) >= 3 and max(flushed) <= 3
    pause_ms = pause * 1e3
    # Each flush caught up two or three steps: an undrafted step's share is a third of
    # the pause or more, and never more than the pause.
    assert pause_ms / 3 <= engine.upkeep_ms_per_step <= pause_ms * 1.5
    first_drafted = next(i for i, (drafted, _) in enumerate(gate.log) if drafted)
    last = len(gate.log) - 1  # the step both requests finished in holds nothing back
    assert len(spent) == len(gate.log)
    assert sum(ran for _, ran in spent) == len(flushed)
    for i, ((drafted, wall), (own_ms, ran_flush)) in enumerate(zip(gate.log, spent, strict=True)):
        if drafted:
            # The flush it ran is not its own time.
            assert wall <= own_ms - (pause_ms if ran_flush else 0.0)
        elif first_drafted < i < last:
            assert not ran_flush
            assert wall >= pause_ms / 3  # priced with its share of a catch-up
        else:
            assert wall <= own_ms  # nothing caught up yet, or nothing held back: no share
    # The cost model (decoding steps only: no prompt chunk) prices the undrafted steps
    # caught up by then with their share, and the drafted ones without the catch-up
    # they ran (a step of the tiny model takes milliseconds, the pause half a second).
    assert any(depth == 0 for depth, _ in priced) and any(depth for depth, _ in priced)
    shared = [wall >= pause_ms / 3 for depth, wall in priced if depth == 0]
    assert any(shared) == in_price
    assert all(wall <= pause_ms * 1.5 for depth, wall in priced if depth == 0)
    assert all(wall < pause_ms / 3 for depth, wall in priced if depth)


def test_online_acceptance_learns_from_drafted_steps_only(tiny):
    """Undrafted steps try no position: they neither update nor decay the learnt rates."""
    engine = LLMEngine(tiny, EngineConfig(spec="adaptive", num_drafts=3), cost_model=CheapCost(2))
    engine.gate = ScriptedGate([True, False, False])
    updates = []
    update = engine.acceptance.update
    engine.acceptance.update = lambda admitted, accepted: (
        updates.append(admitted.copy()),
        update(admitted, accepted),
    )
    for prompt in repetitive_prompts(3):
        engine.add_request(prompt, GREEDY)
    while engine.has_unfinished():
        engine.step()
    drafted = sum(n for depth, n in engine.stats.depth_steps.items() if depth)
    assert engine.stats.undrafted_steps > 0 and drafted > 0
    # One update per step that verified a draft (a drafted step whose requests were all
    # at their length limit verifies none), none from the undrafted ones.
    assert 0 < len(updates) <= drafted and all(a.sum() > 0 for a in updates)


class RecordingCost(CheapCost):
    """Cheap drafts, a free drafter, and a log of the steps the engine reports."""

    def __init__(self, seed):
        super().__init__(seed)
        self.steps = []

    def draft_cost_ms(self, num_reqs, depth=None):
        return 0.0

    def record_step(self, num_reqs, num_tokens, num_drafts, depth, wall_ms, context_tokens=0):
        self.steps.append((num_reqs, num_tokens, num_drafts, depth, wall_ms))


def test_decoding_steps_report_their_price_inputs_to_a_learning_cost_model(tiny):
    prompts = repetitive_prompts(6)
    plain, _ = run(tiny, prompts)
    cost = RecordingCost(2)
    out, engine = run(tiny, prompts, spec="adaptive", num_drafts=3, cost_model=cost)
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    assert len(cost.steps) > 10
    for num_reqs, num_tokens, num_drafts, depth, wall_ms in cost.steps:
        assert num_tokens == num_reqs  # decoding steps only: prompt chunks are not priced
        assert 0 <= depth <= 3 and 0 <= num_drafts <= num_reqs * depth and wall_ms > 0
    # Every admitted draft of a reported step was verified: no more than the engine's.
    admitted = engine.stats.num_verified - engine.stats.num_decode_rounds
    assert 0 < sum(step[2] for step in cost.steps) <= admitted


class PricedOut(RecordingCost):
    """Drafting never pays by the model: only the gate's probes draft."""

    def draft_cost_ms(self, num_reqs, depth=None):
        return 1e6


def test_probes_draft_where_the_model_declines_and_stay_lossless(tiny):
    prompts = repetitive_prompts(12)
    plain, _ = run(tiny, prompts)
    cost = PricedOut(3)
    out, engine = run(
        tiny, prompts, spec="adaptive", num_drafts=3, cost_model=cost, throughput_gate=True
    )
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    stats = engine.stats
    # Every 32nd declined step of a batch-size bucket drafts, at the model's best depth.
    assert stats.probes >= 1 and stats.gate_vetoes == 0
    assert sum(n for depth, n in stats.depth_steps.items() if depth) == stats.probes
    assert stats.undrafted_steps == stats.depth_steps[0]
    # The gate measures the probes apart from drafted steps the cost model chose (none).
    buckets = engine.gate._buckets.values()
    assert all(not bucket.samples[DRAFTED] for bucket in buckets)
    assert 1 <= sum(len(bucket.samples[DECLINED]) for bucket in buckets) <= stats.probes


class CountingGate(ScriptedGate):
    def __init__(self):
        super().__init__([True])
        self.records = []

    def record(self, num_reqs, drafted, tokens, wall_ms, mixed=False, declined=False):
        self.records.append((num_reqs, drafted, tokens, mixed))


def test_the_gate_times_mixed_steps_apart_and_the_prices_learn_from_decoding_steps(tiny):
    prompts = repetitive_prompts(10)
    plain, _ = run(tiny, prompts)
    cost = RecordingCost(4)
    engine = LLMEngine(
        tiny, EngineConfig(spec="adaptive", num_drafts=3, max_num_seqs=4), cost_model=cost
    )
    engine.gate = gate = CountingGate()
    schedule = engine.scheduler.schedule
    decoding_steps = []

    def tracking(room):
        chunks = schedule(room)
        if chunks and any(c.is_decode for c in chunks):
            decoding_steps.append(all(c.is_decode for c in chunks))
        return chunks

    engine.scheduler.schedule = tracking
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    assert [r.output_ids for r in requests] == [o.token_ids for o in plain]
    # Four running at a time over ten requests: prompt chunks share steps with decodes.
    assert not all(decoding_steps)
    # The gate times every step with decodes (none captured a graph on this CPU), each
    # marked mixed exactly when a prompt chunk shared it; the cost model only the others.
    assert [mixed for *_, mixed in gate.records] == [not pure for pure in decoding_steps]
    assert len(cost.steps) == sum(decoding_steps)


@pytest.mark.parametrize(
    ("mode", "lookahead", "normalised"),
    [("auto", "off", True), ("on", "off", True), ("auto", "on", False), ("off", "off", False)],
)
def test_the_cost_model_learns_step_times_at_the_profiles_speed_on_the_cpu(
    tiny, mode, lookahead, normalised, tmp_path
):
    """``normalise_speed``: "on", or "auto" without the look-ahead (whose host work the
    forward's time would include), passes every learnt step's forward time, so the cost
    model's time scale is that of the latest step; otherwise it stays 1."""
    from dspark.scheduling.cost import ObservedDraftCost

    seen = []
    original = ObservedDraftCost.record_step

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("forward_ms"))
        return original(self, *args, **kwargs)

    ObservedDraftCost.record_step = spy
    try:
        _, engine = run(
            tiny,
            repetitive_prompts(4),
            spec="adaptive",
            num_drafts=3,
            normalise_speed=mode,
            lookahead=lookahead,
            profile_path=str(tmp_path / "profile.json"),
        )
    finally:
        ObservedDraftCost.record_step = original
    model = engine.verifier.cost_model
    assert seen  # decoding steps were learnt from
    if not normalised:
        assert set(seen) == {None} and model.time_scale == 1.0
    else:
        assert None not in seen and seen[-1] == engine.stats.forward_ms[-1]
        assert model.time_scale != 1.0
    with pytest.raises(ValueError, match="normalise_speed"):
        EngineConfig(normalise_speed="sometimes")


@pytest.mark.parametrize("noise", [None, False])
def test_the_learnt_slopes_are_shrunk_by_their_noise_unless_switched_off(tiny, noise, tmp_path):
    """``overhead_slope_noise`` is on by default (session 36's A/Bs) and reaches the cost
    model the engine builds; switched off, the slopes are learnt as the plain line."""
    options = {} if noise is None else {"overhead_slope_noise": noise}
    _, engine = run(
        tiny,
        repetitive_prompts(2),
        spec="adaptive",
        num_drafts=3,
        profile_path=str(tmp_path / "profile.json"),
        **options,
    )
    assert engine.verifier.cost_model.slope_noise is (noise is None)


@pytest.mark.parametrize("lookahead", ["off", "on"])
def test_steps_that_replayed_a_larger_graph_are_learnt_with_their_padding(
    tiny, lookahead, tmp_path, monkeypatch
):
    """The tokens a step's target forward ran beyond its own captured size (a cover,
    ``CaptureLedger``) reach ``record_step`` as ``padded_tokens``, with the look-ahead
    deferring the record or not; here every padded forward is made to report 16."""
    from dspark.engine.graphs import PaddedStepRunner
    from dspark.scheduling.cost import ObservedDraftCost

    original_run = PaddedStepRunner.run

    def covered_run(self, *args, **kwargs):
        out = original_run(self, *args, **kwargs)
        self.covered_tokens += 16
        return out

    seen = []
    original = ObservedDraftCost.record_step

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("padded_tokens", 0))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PaddedStepRunner, "run", covered_run)
    monkeypatch.setattr(ObservedDraftCost, "record_step", spy)
    run(
        tiny,
        repetitive_prompts(4),
        spec="adaptive",
        num_drafts=3,
        cuda_graphs="on",
        lookahead=lookahead,
        profile_path=str(tmp_path / "profile.json"),
    )
    assert seen and set(seen) == {16}


def test_the_gate_at_one_request_takes_the_configured_window_and_veto_width(tiny):
    """``EngineConfig.gate_alone_window`` and ``gate_alone_confidence`` reach the throughput
    gate (128 and 1 by default: ``gate.ALONE_WINDOW``, ``gate.ALONE_CONFIDENCE``); out of
    range values are refused."""
    seen = []
    for extra in ({}, {"gate_alone_window": 16, "gate_alone_confidence": 3.0}):
        config = EngineConfig(spec="adaptive", num_drafts=3, kv_cache_tokens=4096, **extra)
        gate = LLMEngine(tiny, config, cost_model=CheapCost(3)).gate
        seen.append((gate.alone_window, gate.alone_confidence))
    assert seen == [(128, 1.0), (16, 3.0)]
    with pytest.raises(ValueError, match="gate_alone_confidence"):
        EngineConfig(gate_alone_confidence=-1.0)
    with pytest.raises(ValueError, match="gate_alone_window"):
        EngineConfig(gate_alone_window=0)


def test_measured_settle_depth_picks_the_window_depth_of_the_best_stretch_rate():
    """``EngineConfig.settle_depth="measured"``: hand-computed choices. The median stands
    until it has stretches at a batch of half to twice the window's; then the window's
    depth whose stretches emitted the most tokens a request per ms wins (pooled over its
    stretches); depths outside the window and stretches at other batch sizes do not
    count."""
    from collections import deque

    from dspark.engine.engine import measured_settle_depth

    window = [2, 2, 2, 6, 6, 2, 6, 3]
    # (requests weighed at, tokens, ms), in tokens a request per ms: depth 2 950 / 64 /
    # 100 = 0.1484, 6 1080 / 60 / 100 = 0.18, 3 1040 / 64 / 100 = 0.1625.
    stretches = {
        2: deque([(64, 950, 100.0)]),
        6: deque([(60, 1080, 100.0)]),
        3: deque([(64, 1040, 100.0)]),
        4: deque([(64, 2000, 100.0)]),  # not a depth of the window
    }
    assert measured_settle_depth(window, 2, stretches, 64) == 6
    # Unmeasured median: tried first, whatever the others measured.
    assert measured_settle_depth(window, 2, {6: stretches[6]}, 64) == 2
    # The median at its best: it stays (ties too).
    assert measured_settle_depth(window, 6, stretches, 64) == 6
    level = {2: deque([(8, 10, 1.0)]), 3: deque([(8, 10, 1.0)])}
    assert measured_settle_depth([2, 3], 2, level, 8) == 2
    # Pooled: depth 6's two stretches give (1080 + 900) / 64 / (100 + 100) = 0.1547 >
    # 0.1484 (and depth 3's 0.1625 beats that, with it in the table).
    pooled = {2: stretches[2], 6: deque([(64, 1080, 100.0), (64, 900, 100.0)])}
    assert measured_settle_depth(window, 2, pooled, 64) == 6
    assert measured_settle_depth(window, 2, {**pooled, 3: stretches[3]}, 64) == 3
    # ... and (1080 + 800) / 64 / 200 = 0.1469 < 0.1484: the median stays.
    pooled[6] = deque([(64, 1080, 100.0), (64, 800, 100.0)])
    assert measured_settle_depth(window, 2, pooled, 64) == 2
    # A request's tokens, not the batch's: depth 2 at 32 requests, 1000 / 32 / 100 =
    # 0.3125, beats depth 6 at 64, 1500 / 64 / 100 = 0.234 (10 against 15 tokens a ms).
    sizes = {2: deque([(32, 1000, 100.0)]), 6: deque([(64, 1500, 100.0)])}
    assert measured_settle_depth(window, 2, sizes, 48) == 2
    assert measured_settle_depth(window, 6, sizes, 48) == 2
    # Stretches weighed at a batch outside half to twice the window's do not count: at
    # 16 requests only depth 2's 32 is near (6 has no rate there); at 129 depth 2's is
    # not (the median unmeasured: it stands).
    assert measured_settle_depth(window, 6, sizes, 16) == 6
    assert measured_settle_depth(window, 2, sizes, 16) == 2
    assert measured_settle_depth(window, 2, sizes, 129) == 2
    assert measured_settle_depth(window, 6, sizes, 128) == 6
