import numpy as np
import pytest
import torch
from scipy import stats

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.llm import RequestOutput
from dspark.engine.request import PromptTooLongError
from dspark.engine.sampling import SamplingParams
from tests.conftest import engine_config, make_tiny_model

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

        heads = config.pop("head_graphs", True)
        drafter = DSparkDrafter(drafter, 16384, 16, graphs=drafter_graphs, head_graphs=heads)
    engine = LLMEngine(loaded, engine_config(**config), drafter=drafter, cost_model=cost)
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
    ("spec", "lookahead"), [("fixed", "off"), ("adaptive", "off"), ("adaptive", "on")]
)
def test_greedy_speculation_with_a_dspark_drafter_equals_plain_greedy(tmp_path, spec, lookahead):
    """With the look-ahead on, depths decided ahead are taken by the same decodes and,
    most of the time, by batches that changed a little, and such batches take their
    shares of the budget planned ahead: still lossless. The drafter's block pass is cut
    to each step's depth."""
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
        )
        assert engine.drafter.block_cut
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
    assert engine.runner.kv_regions == (4 if regions == "on" else 0)
    if regions == "on":
        assert in_place["target"] > 20 and in_place["drafter"] > 5
    else:
        assert in_place == {"target": 0, "drafter": 0}
    with pytest.raises(ValueError, match="kv_regions must be 'auto', 'on' or 'off'"):
        EngineConfig(kv_regions="maybe")


@pytest.mark.parametrize(("lookahead", "forced"), [("off", None), ("on", None), ("on", 2)])
def test_greedy_speculation_settled_equals_plain_greedy(tmp_path, lookahead, forced):
    """``AdaptiveConfig.settle``: with drafts priced nearly free (``CheapCost``) the cuts
    buy less than deciding costs, so the engine settles; its settled steps draft the
    settled depth (less only where a request's length limit is lower; ``forced``: every
    stretch settled at that depth instead of the window's, K = 5), verify every draft and
    schedule nothing, one step in ``SETTLE_STEPS + 1`` decides again, a stretch's last
    step records its round, and greedy output is plain greedy's."""
    from dspark.engine.drafter import DSparkDrafter
    from dspark.engine.settle import SETTLE_STEPS, SETTLE_WINDOW
    from dspark.engine.stats import STEP_FIELDS
    from tests.models.test_drafter import random_drafter

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=5)
    prompts = repetitive_prompts(24)
    plain, _ = run(target, prompts)
    config = engine_config(
        spec="adaptive",
        num_drafts=5,
        max_num_seqs=4,
        throughput_gate=False,
        lookahead=lookahead,
        settle="on",
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
    settler = engine.policy.settler
    weigh = settler.weigh

    def weighed(*args):
        settled = weigh(*args)
        if settled and forced is not None:
            settler.depth = forced
        return settled

    settler.weigh = weighed
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
        if engine.policy.plan.settled:
            if lookahead == "on":  # this step's round is recorded in the next forward
                engine.policy.look_ahead([])
            stretch.append((not settler.is_settled, len(rounds) - recorded_rounds))
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
    assert plain_adaptive.stats.settled_steps == 0 and plain_adaptive.policy.settler is None
    assert EngineConfig().adaptive.settle == "auto"
    with pytest.raises(ValueError, match="settle"):
        engine_config(settle="sometimes")


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
    ("draft_vocab", "padded", "settle", "lookahead"),
    [
        (None, False, "off", "off"),
        (None, True, "off", "off"),
        ([0, 2, 3, 6, 7, 8], False, "off", "off"),
        (None, False, "on", "off"),
        (None, False, "off", "on"),
    ],
)
def test_adaptive_sampling_with_a_dspark_drafter_follows_the_target(
    tmp_path, draft_vocab, padded, settle, lookahead
):
    """Losslessness must survive the budget, the allocation and the drafter's own draft
    distribution: at temperature 1 the first two tokens follow the target exactly. With a
    draft vocabulary that leaves out half of the target's likely tokens (1, 4, 5), those
    can only come from the residual distribution. ``padded``: padded steps, the drafter's
    heads sampling in ``DraftHeads`` as on a GPU. ``settle``: most steps draft a settled
    depth undecided. ``lookahead``: depths and budgets decided during the forward."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    live = 6
    target = concentrated_model(tmp_path, live)
    drafter = random_drafter(target, block_size=4).set_draft_vocab(draft_vocab)
    prompt = [3, 1, 4, 1, 5]
    exact1, exact2 = exact_first_two(target, prompt, live)
    engine = LLMEngine(
        target,
        engine_config(
            spec="adaptive",
            num_drafts=3,
            max_num_seqs=64,
            kv_cache_tokens=8192,
            throughput_gate=False,
            cuda_graphs="on" if padded else "off",
            settle=settle,
            lookahead=lookahead,
        ),
        drafter=DSparkDrafter(drafter, 8192, 16, graphs=(64, 256) if padded else None),
        cost_model=CheapCost(3),
    )
    requests = [
        engine.add_request(
            prompt, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=i)
        )
        for i in range(2000)
    ]
    while engine.has_unfinished():
        engine.step()
    # Drafts were accepted (fewer from the subset: its tokens 6-8 are ones the target
    # almost never picks) and rejected, so both acceptance and the residual are exercised.
    extra = 300 if draft_vocab is None else 30
    assert engine.stats.num_accepted > engine.stats.num_decode_rounds + extra
    if padded:
        assert engine.drafter.heads.num_runs == len(engine.stats.drafter_ms) > 0
    if settle == "on":
        assert engine.stats.settled_steps > sum(engine.stats.depth_steps.values())
    assert_first_two_follow(requests, (exact1, exact2), live)


def assert_first_two_follow(requests, exacts, live: int) -> None:
    """The requests' first two tokens follow ``exact_first_two``'s marginals (chi-square)."""
    for position, exact in enumerate(exacts):
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
        engine_config(
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
    small = dict(kv_cache_tokens=4096)  # the default 3 GB would take seconds to zero
    plain, _ = run(smollm2, ids, params, **small)
    cases = (("fixed", None, "ngram"), ("adaptive", RandomCost(9), "ngram"))
    cases += (("fixed", None, "dspark"), ("adaptive", RandomCost(9), "dspark"))
    for spec, cost, drafter in cases:
        spec_out, engine = run(
            smollm2,
            ids,
            params,
            spec=spec,
            num_drafts=4,
            cost_model=cost,
            drafter=drafter,
            **small,
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
