"""Replayed acceptance (``dspark.engine.replay``) and random-weight shapes."""

import json

import numpy as np
import pytest
import torch

from dspark.engine import lookahead as lookahead_module
from dspark.engine.config import EngineConfig
from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import LLMEngine
from dspark.engine.policy import AdaptivePolicy
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter, random_draft_model
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams
from dspark.engine.scheduler import Scheduler
from dspark.models.shapes import SHAPES, random_model
from tests.conftest import engine_config

PARAMS = SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)


class CheapCost:
    """Drafts nearly free: every scheduled draft pays, budgets stay large."""

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 1.0 + 1e-4 * np.arange(max_drafts + 1)


@pytest.fixture(scope="module")
def shaped():
    return random_model("tiny", torch.float32)


@pytest.fixture(scope="module")
def draft_model(shaped):
    return random_draft_model(shaped)


def constant_trace(accepted: int, k: int = 7, rounds: int = 50) -> AcceptanceTrace:
    rng = np.random.default_rng(accepted)
    conf = rng.uniform(0.05, 0.95, (rounds, k)).astype(np.float32)
    return AcceptanceTrace(conf, np.full(rounds, accepted), "test")


def run(shaped, draft_model, trace, prompts, **config):
    cost = config.pop("cost_model", None)
    if cost is not None:  # the injected cost model is under test, not the gate
        config.setdefault("throughput_gate", False)
    inner = DSparkDrafter(draft_model, 8192, 16)
    engine = LLMEngine(
        shaped,
        engine_config(kv_cache_tokens=4096, **config),
        drafter=ReplayDrafter(inner, trace, seed=1),
        cost_model=cost,
    )
    engine.round_log = []
    requests = [engine.add_request(p, PARAMS) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return engine, requests


@pytest.mark.parametrize(("k", "accepted"), [(7, 3), (2, 3), (5, 0), (7, 7)])
def test_each_round_accepts_the_replayed_count_capped_by_what_was_verified(
    shaped, draft_model, k, accepted
):
    prompts = [list(range(10 + i, 40 + i)) for i in range(3)]
    engine, requests = run(
        shaped, draft_model, constant_trace(accepted), prompts, spec="fixed", num_drafts=k
    )
    for _, admitted, got in engine.round_log:
        assert got == min(accepted, admitted)
    # Rounds cut short by max_tokens verify fewer drafts; all others accept min(accepted, K).
    full = [got for _, admitted, got in engine.round_log if admitted == k]
    assert full and set(full) == {min(accepted, k)}
    assert all(len(r.output_ids) == PARAMS.max_tokens for r in requests)


def test_confidences_come_from_the_trace(shaped, draft_model):
    trace = constant_trace(2)
    engine, _ = run(shaped, draft_model, trace, [list(range(5, 30))], spec="fixed", num_drafts=7)
    rows = {tuple(np.round(c, 6)) for c, _, _ in engine.round_log}
    known = {tuple(np.round(c, 6)) for c in trace.confidences}
    assert rows and rows <= known


def test_rounds_are_common_random_numbers_of_request_and_output_point(draft_model):
    """The round a request meets depends on the seed, its id and how many tokens it has
    generated, not on the batch around it or on what was drawn before."""
    trace = constant_trace(2, rounds=50)

    def requests(lengths):
        made = []
        for i, length in lengths:
            request = Request(f"req-{i}", [1, 2, 3], PARAMS, 0.0)
            request.output_ids = [0] * length
            made.append(request)
        return made

    first = ReplayDrafter(DSparkDrafter(draft_model, 1024, 16), trace, seed=3)
    second = ReplayDrafter(DSparkDrafter(draft_model, 1024, 16), trace, seed=3)
    batch = requests([(0, 5), (1, 9), (2, 5), (3, 0)])
    alone = np.concatenate([second.rounds_for(requests([p])) for p in [(3, 0), (1, 9)]])
    together = first.rounds_for(batch)
    assert list(alone) == [together[3], together[1]]
    # Requests 0 and 2 at the same point, and request 0 one token later: other rounds.
    assert len({together[0], together[2], first.rounds_for(requests([(0, 6)]))[0]}) == 3
    other_seed = ReplayDrafter(DSparkDrafter(draft_model, 1024, 16), trace, seed=4)
    assert (other_seed.rounds_for(batch) != together).any()
    # Over many (request, point) pairs the rounds are uniform: chi-square with 49 degrees
    # of freedom (mean 49, sd 9.9) far below 49 + 6 sd.
    many = requests([(i, t) for i in range(200) for t in range(250)])
    counts = np.bincount(first.rounds_for(many), minlength=50)
    expected = len(many) / 50
    assert ((counts - expected) ** 2 / expected).sum() < 49 + 6 * 9.9


def test_trace_from_rounds_applies_the_drafters_calibration(tmp_path):
    path = tmp_path / "rounds.npz"
    logits = np.array([[0.0, 2.0], [-2.0, 4.0]])
    np.savez(path, source="unit", eval_logits=logits, eval_accepted=np.array([0, 2]))
    trace = AcceptanceTrace.from_rounds(path, temperatures=[1.0, 2.0], shifts=[np.log(3), 0.0])
    # sigmoid(0 + ln 3) = 3/4; sigmoid(2 / 2) = e / (1 + e); sigmoid(-2 + ln 3) = 3 / (3 + e²)
    expected = [[0.75, np.e / (1 + np.e)], [3 / (3 + np.e**2), np.e**2 / (1 + np.e**2)]]
    np.testing.assert_allclose(trace.confidences, expected, rtol=1e-6)
    assert trace.acceptance_length == 2.0
    trace.save(tmp_path / "trace.npz")
    again = AcceptanceTrace.load(tmp_path / "trace.npz")
    np.testing.assert_array_equal(again.accepted, [0, 2])
    assert again.source == "unit, eval split"


@pytest.mark.parametrize(
    ("conf", "accepted", "match"),
    [
        (np.full((3, 2), 0.5), np.array([0, 1]), "N"),
        (np.full((2, 2), 1.5), np.array([0, 1]), r"\[0, 1\]"),
        (np.full((2, 2), np.nan), np.array([0, 1]), "finite"),
        (np.full((2, 2), 0.5), np.array([0, 3]), r"\[0, 2\]"),
    ],
)
def test_bad_traces_are_refused(conf, accepted, match):
    with pytest.raises(ValueError, match=match):
        AcceptanceTrace(conf, accepted, "bad")


def test_shipped_trace_is_the_smollm2_drafters_held_out_rounds():
    trace = AcceptanceTrace.load()
    assert trace.num_positions == 7 and trace.accepted.shape[0] > 5000
    assert "eval split" in trace.source
    assert 1.5 < trace.acceptance_length < 2.5


def test_random_model_is_seeded_and_has_the_named_shape():
    a = random_model("tiny", torch.float32, seed=3)
    b = random_model("tiny", torch.float32, seed=3)
    c = random_model("tiny", torch.float32, seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.model.embed_tokens.weight.shape == (SHAPES["tiny"].vocab_size, 64)
    assert torch.equal(a.model.norm.weight, torch.ones(64))
    llama = SHAPES["llama3-8b"]
    with torch.device("meta"):
        from dspark.models.llama import LlamaModel

        params = sum(p.numel() for p in LlamaModel(llama).parameters())
    assert params == 8_030_261_248  # Meta-Llama-3-8B's parameter count
    with pytest.raises(ValueError, match="known"):
        random_model("llama-70b")


def test_bench_with_a_shape_says_acceptance_is_replayed(tmp_path):
    import argparse

    from dspark.bench.sweep import add_cli_args, main

    trace_path = tmp_path / "trace.npz"
    constant_trace(2).save(trace_path)
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--concurrency",
            "2",
            "--fixed",
            "1",
            "3",
            "--no-adaptive",
            "--max-tokens",
            "9",
            "--trace",
            str(trace_path),
            "--out",
            str(tmp_path / "out"),
            "--slice-ms",
            "0",
        ]
    )
    main(args)
    payload = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert payload["acceptance"].startswith("REPLAYED") and "random weights" in payload["model"]
    by_label = {row["label"]: row for row in payload["rows"]}
    # Every full round accepts min(2, K); rounds cut short by max_tokens accept less.
    assert by_label["K=1"]["acceptance_length"] == pytest.approx(2.0)
    assert 2.5 < by_label["K=3"]["acceptance_length"] <= 3.0
    assert by_label["no spec"]["tokens"] == by_label["K=3"]["tokens"] == 9 * 4


@pytest.mark.parametrize(
    ("spec", "switch"), [("adaptive", "--spec fixed"), ("fixed", "--spec none")]
)
def test_k_beyond_the_drafters_block_is_refused_naming_the_switch(
    shaped, draft_model, spec, switch
):
    drafter = ReplayDrafter(DSparkDrafter(draft_model, 1024, 16), constant_trace(1))
    with pytest.raises(ValueError, match=rf"K=8 \(--k.*at most 7.*{switch}"):
        LLMEngine(shaped, EngineConfig(spec=spec, num_drafts=8), drafter=drafter)


@pytest.mark.parametrize("domain", ["chat", "math"])
def test_published_trace_matches_the_published_rates_and_is_calibrated(domain):
    from dspark.resources import PUBLISHED_ACCEPTANCE, load_json

    rates = load_json(PUBLISHED_ACCEPTANCE)["conditional_acceptance_per_position"][domain]
    trace = AcceptanceTrace.from_published(domain, num_rounds=40_000, seed=1)
    accepted, conf = trace.accepted, trace.confidences.astype(np.float64)
    for k, rate in enumerate(rates["dspark"]):
        reached = accepted >= k
        observed = (accepted[reached] > k).mean()
        # Binomial standard error over the rounds reaching k: well under 0.01 here.
        error = np.sqrt(rate * (1 - rate) / reached.sum())
        assert abs(observed - rate) < 5 * error + 1e-3
        # Calibrated: the confidence the scheduler sees is the acceptance probability.
        assert abs(conf[reached, k].mean() - observed) < 5 * error + 1e-3
    # The spread is per round: confidences of one round move together.
    assert np.corrcoef(conf[:, 0], conf[:, 3])[0, 1] > 0.9
    flat = AcceptanceTrace.from_published(domain, num_rounds=1000, spread=0.0)
    assert np.ptp(flat.confidences, axis=0).max() == 0.0


def test_published_trace_spec_and_its_errors():
    trace = AcceptanceTrace.resolve("published:code:eagle3")
    assert "eagle3 code" in trace.source and trace.num_positions == 7
    with pytest.raises(ValueError, match="domain must be one of"):
        AcceptanceTrace.resolve("published:poetry")
    with pytest.raises(ValueError, match="drafter must be one of"):
        AcceptanceTrace.resolve("published:chat:medusa")
    with pytest.raises(ValueError, match="DOMAIN"):
        AcceptanceTrace.resolve("published:")


class DepthCost:
    """Verifying costs per token and drafting per depth (the drafter's sequential heads),
    fixed: nothing is learnt between a decision taken ahead and the step it is for."""

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        return 8.0 + 0.1 * num_tokens + 0.4 * np.arange(max_drafts + 1) + self.draft_cost_ms(0)

    def draft_cost_ms(self, num_reqs, depth=None):
        return 0.5 + 0.2 * (7 if depth is None else depth)


def _adaptive_run(shaped, draft_model, lookahead, monkeypatch, exact=True, cost=None, **config):
    """Ten requests through four slots, with staggered lengths: batches change as requests
    finish and join, and limits fall below K near each request's end. Each request's
    latest round is taken as it is (predictiveness held at 1), so a decision depends on
    which requests are in the batch, not only on how many. ``exact``: the look-ahead's
    decisions are taken only by the batch they were made for, and its shares never (a
    changed batch decides and plans in the step); otherwise as the engine runs."""
    import dspark.scheduling.verifier as verifier_module

    monkeypatch.setattr(verifier_module, "PREDICTIVENESS_MIN_PAIRS", 10**9)
    if exact:
        monkeypatch.setattr(lookahead_module, "REUSE_SHARE", 2.0)  # no batch reaches 200%
        monkeypatch.setattr(lookahead_module.LookAhead, "shares_budget", lambda *args: None)
    inner = DSparkDrafter(draft_model, 8192, 16)
    engine = LLMEngine(
        shaped,
        engine_config(
            kv_cache_tokens=4096,
            spec="adaptive",
            num_drafts=7,
            max_num_seqs=4,
            max_num_batched_tokens=28,  # four decodes with K drafts each do not fit
            throughput_gate=False,
            lookahead=lookahead,
            **config,
        ),
        drafter=ReplayDrafter(inner, AcceptanceTrace.load(), seed=1),
        cost_model=cost or DepthCost(),
    )
    engine.round_log = []
    requests = [
        engine.add_request(
            list(range(3 + i, 15 + 2 * i)),
            SamplingParams(temperature=0.0, max_tokens=12 + 5 * i, ignore_eos=True),
        )
        for i in range(10)
    ]
    depths = []
    policy = engine.policy
    decide = policy._decide_depth
    engine.hits_below_k = 0  # decisions taken ahead for a batch with a limit below K

    def logged(batch, limits):
        hits = engine.stats.lookahead_hits
        depths.append(decide(batch, limits))
        if engine.stats.lookahead_hits > hits and (limits < 7).any():
            engine.hits_below_k += 1
        return depths[-1]

    policy._decide_depth = logged
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        running = [r for r in requests if not r.is_finished and r.output_ids]
        if steps % 9 == 0 and len(running) > 1:  # a client goes away mid-decode
            engine.abort(running[0].request_id)
    return engine, requests, depths


def test_drafting_decisions_taken_ahead_are_the_ones_taken_in_step(
    shaped, draft_model, monkeypatch
):
    """``AdaptiveConfig.lookahead``: the next step's drafting depth and budget, decided
    during this step's forward, are used for the same decoding batch, and then they are
    what the step itself would decide (a fixed cost model, nothing learnt in between)."""
    off, off_requests, off_depths = _adaptive_run(shaped, draft_model, "off", monkeypatch)
    on, on_requests, on_depths = _adaptive_run(shaped, draft_model, "on", monkeypatch)
    assert on_depths == off_depths  # step by step
    # Budgets planned ahead (their rounds recorded during the forward) are the step's own.
    assert list(on.stats.budgets) == list(off.stats.budgets)
    assert len(set(on.stats.budgets)) > 2
    # So are those planned while the drafter ran (the budgets not planned ahead, every
    # one whose proposal held the drafts the plan assumed), and any planned in the step
    # before its round is recorded (the record waits for the forward with the look-ahead
    # on).
    not_ahead = len(on.stats.budgets) - on.stats.lookahead_plans
    assert 10 <= on.stats.drafting_plans <= not_ahead
    assert 10 <= on.stats.lookahead_plans <= on.stats.lookahead_hits
    assert off.stats.lookahead_plans == off.stats.drafting_plans == 0
    assert [r[1:] for r in on.round_log] == [r[1:] for r in off.round_log]
    assert [r.output_ids for r in on_requests] == [r.output_ids for r in off_requests]
    assert len(set(on_depths)) > 2  # the decision varied, so agreeing is no coincidence
    # Undrafted steps too: with the look-ahead their ``relax`` waits for the forward, and
    # the later decisions read the same state as relaxing at once.
    assert on_depths.count(0) >= 3
    assert off.stats.lookahead_hits == 0
    # Some decisions were taken ahead, not all: batches changed and limits fell below K,
    # some of them with room still for the depth decided (taken ahead all the same).
    assert 10 <= on.stats.lookahead_hits < len(on_depths)
    assert on.hits_below_k >= 3


def test_the_step_after_a_prompt_finishes_takes_the_decision_made_ahead(
    shaped, draft_model, monkeypatch
):
    """The look-ahead also decides for the prompts whose last chunk runs in its step (they
    decode next): a step whose batch is the previous step's decodes plus such a prompt
    takes the depth and budget decided ahead, as a step of unchanged decodes does."""
    after_prompt = []  # per step that follows one ending a prompt: taken ahead?
    step, schedule = LLMEngine.step, Scheduler.schedule
    scheduled = []  # this step's chunks as scheduled: (decoding, samples)

    def logged_schedule(self, *args):
        chunks = schedule(self, *args)
        scheduled.append([(c.is_decode, c.samples) for c in chunks])
        return chunks

    def logged_step(self):
        scheduled.clear()
        hits = self.stats.lookahead_hits
        out = step(self)
        chunks = scheduled[0] if scheduled else []
        if chunks and getattr(self, "_prompt_ended", False):
            after_prompt.append(self.stats.lookahead_hits > hits)
        # This step ran the last chunk of a prompt, and every request in it sampled.
        self._prompt_ended = any(not decoding for decoding, _ in chunks) and all(
            samples for _, samples in chunks
        )
        return out

    monkeypatch.setattr(Scheduler, "schedule", logged_schedule)
    monkeypatch.setattr(LLMEngine, "step", logged_step)
    _adaptive_run(shaped, draft_model, "on", monkeypatch)
    # Before the look-ahead covered finishing prompts none of these steps could take the
    # decision ahead (it was for the decodes alone); some still miss (a request finished,
    # or another prompt joined).
    assert len(after_prompt) >= 4
    assert sum(after_prompt) >= len(after_prompt) // 2


def test_the_step_log_accounts_for_every_step_token_and_draft(shaped, draft_model, monkeypatch):
    """``EngineStats.step_log`` (``dspark bench --step-log``): one row a step whose
    emitted tokens and verified drafts add up to the engine's counts, whose forward ran
    on the step's non-draft tokens plus its drafts, whose phases fit inside its time, and
    which drafts only as deep as it decided."""
    from dspark.engine.stats import STEP_FIELDS

    engine, _, depths = _adaptive_run(shaped, draft_model, "on", monkeypatch)
    stats = engine.stats
    rows = [dict(zip(STEP_FIELDS, row, strict=True)) for row in stats.step_log]
    assert len(rows) == stats.num_steps == len(stats.forward_ms)
    assert sum(r["emitted"] for r in rows) == stats.num_generated
    assert sum(r["drafts"] for r in rows) == stats.num_verified - stats.num_decode_rounds
    assert rows[0]["chunk_tokens"] > 0  # the first step computes prompts
    assert any(r["chunk_tokens"] == 0 for r in rows)  # decodes alone
    assert sorted(r["depth"] for r in rows if r["depth"]) == sorted(d for d in depths if d)
    for r in rows:
        assert r["tokens"] == r["requests"] + r["chunk_tokens"] + r["drafts"]
        assert r["drafts"] <= r["depth"] * r["requests"] <= 7 * r["requests"]
        assert r["wall_ms"] >= r["draft_ms"] + r["forward_ms"] + r["apply_ms"] - 1e-6
        assert r["draft_ms"] >= r["before_ms"] + r["propose_ms"] + r["schedule_ms"] - 1e-6
        parts = r["shape_ms"] + r["decide_ms"] + r["plan_ms"] + r["sync_ms"]
        assert min(r["shape_ms"], r["decide_ms"], r["plan_ms"], r["sync_ms"]) >= 0.0
        assert parts <= r["before_ms"] + 1e-6 <= r["draft_ms"] + 2e-6
        assert r["depth"] == 0 or r["propose_ms"] > 0.0  # a drafted step proposed
        assert r["before_ms"] >= r["shape_ms"] + r["decide_ms"] - 1e-6  # undrafted ones too
        assert r["schedule_ms"] == 0.0 or r["depth"] > 0  # only drafted steps allocate
        assert r["graph_tokens"] == r["covered"] == r["captured"] == 0  # CPU: eager


class TimedDepthCost(DepthCost):
    """``DepthCost`` that keeps the steps it is told about and learns nothing from them."""

    def __init__(self) -> None:
        self.steps = []

    def record_step(self, num_reqs, num_tokens, num_drafts, depth, wall_ms, context_tokens=0):
        self.steps.append((num_reqs, num_tokens, num_drafts, depth))


def test_step_timings_reach_the_cost_model_with_the_lookahead_too(shaped, draft_model, monkeypatch):
    """With the look-ahead on, a step's timing is handed to the cost model during the next
    step's forward, off the host's critical path: the same steps, each one step later
    (the last one never)."""
    off_cost, on_cost = TimedDepthCost(), TimedDepthCost()
    _adaptive_run(shaped, draft_model, "off", monkeypatch, cost=off_cost)
    _adaptive_run(shaped, draft_model, "on", monkeypatch, cost=on_cost)
    assert len(off_cost.steps) > 20
    assert len({depth for *_, depth in off_cost.steps}) > 2
    assert on_cost.steps == off_cost.steps[:-1]


def test_only_requests_with_drafts_record_confidences(shaped, draft_model, monkeypatch):
    """A decode at its length limit proposes no drafts: its (zero) row is not a round, and
    recording it would feed the round-to-round correlation a fake pair."""
    engine, _, _ = _adaptive_run(shaped, draft_model, "off", monkeypatch)
    proposed, recorded = [], []
    propose, record = engine.drafter.propose, engine.verifier.record

    def spy_propose(requests, max_drafts):
        proposal = propose(requests, max_drafts)
        proposed.append(sum(1 for tokens in proposal.tokens if len(tokens)))
        return proposal

    def spy_record(slots, confidences):
        recorded.append(len(slots))
        return record(slots, confidences)

    engine.drafter.propose, engine.verifier.record = spy_propose, spy_record
    limits = []
    draft_limit = engine._draft_limit
    engine._draft_limit = lambda chunk: limits.append(draft_limit(chunk)) or limits[-1]
    for i in range(4):
        engine.add_request(
            list(range(5 + i, 20 + i)),
            SamplingParams(temperature=0.0, max_tokens=9 + 3 * i, ignore_eos=True),
        )
    while engine.has_unfinished():
        engine.step()
    assert 0 in limits  # some decodes could draft nothing
    assert recorded == [count for count in proposed if count]


def test_a_changed_batch_may_take_the_depth_decided_ahead(shaped, draft_model, monkeypatch):
    """When the next batch is not the same decodes (a prompt chunk joined, a request left
    or nears its limit) but at least ``REUSE_SHARE`` of its decoding requests were
    decided for, it takes that depth instead of deciding in the step (its budget is still
    planned in the step). Replayed acceptance is not verification, so outputs follow the
    decisions here; ``test_engine`` checks greedy output with it."""
    ahead_log, taken, shares = {}, [], []
    decide_next = lookahead_module.LookAhead.decide_next

    def logged_ahead(self, chunks, step):
        decide_next(self, chunks, step)
        if self.decision is not None:
            ahead_log[self.decision.step] = (self.decision.slots, self.decision.depth)

    decide = AdaptivePolicy._decide_depth

    def logged_depth(self, batch, limits):
        reused, hits = self.stats.lookahead_reused, self.stats.lookahead_hits
        decision = self.lookahead.decision
        ahead = decision if decision is not None and decision.step == self._step else None
        depth = decide(self, batch, limits)
        if ahead is not None and self.stats.lookahead_hits == hits:  # not the same decodes
            decoding = batch.slots[batch.decode_index]
            share = np.isin(decoding, ahead.slots).mean() if decoding.size else 0.0
            shares.append((share, self.stats.lookahead_reused > reused))
        if self.stats.lookahead_reused > reused:
            taken.append((depth, ahead_log[self._step][1]))
        return depth

    monkeypatch.setattr(lookahead_module.LookAhead, "decide_next", logged_ahead)
    monkeypatch.setattr(AdaptivePolicy, "_decide_depth", logged_depth)
    monkeypatch.setattr(lookahead_module, "REUSE_SHARE", 0.8)
    monkeypatch.setattr(lookahead_module.LookAhead, "shares_budget", lambda *args: None)
    on, _, _ = _adaptive_run(shaped, draft_model, "on", monkeypatch, exact=False)
    assert on.stats.lookahead_reused == len(taken) >= 5
    assert all(depth == decided for depth, decided in taken)
    assert len({decided for _, decided in taken}) > 1  # the decisions taken varied
    # Every changed batch with a decision ahead took it exactly when 80% or more of its
    # decoding requests were decided for (some were not: the rule was exercised).
    assert all(used == (share >= 0.8) for share, used in shares)
    assert any(not used for _, used in shares)
    assert on.stats.lookahead_hits >= 10 and on.stats.lookahead_plans <= on.stats.lookahead_hits
    exact, _, _ = _adaptive_run(shaped, draft_model, "on", monkeypatch)
    assert exact.stats.lookahead_reused == 0 and exact.stats.lookahead_hits >= 10


def test_a_batch_that_lost_requests_takes_their_shares_of_the_budget_planned_ahead(
    shaped, draft_model, monkeypatch
):
    """A step whose decoding requests were all planned for ahead, at the depth planned,
    but whose batch is not exactly them takes the sum of their shares (each capped at its
    drafts) as its budget, and plans nothing while the drafter runs; a step that carries
    a prompt chunk takes the look-ahead's ranking cut again at its own prices, which is
    the budget it would plan itself (predictiveness held at 1)."""
    ahead_shares, taken, recut = {}, [], []
    decide_next, admit = lookahead_module.LookAhead.decide_next, AdaptivePolicy._admit

    def logged_ahead(self, chunks, step):
        decide_next(self, chunks, step)
        if self.shares is not None:
            ahead_shares[self.shares.step] = self.shares
            # The shares are the plan's: they sum to its budget (the exact batch's).
            if self.decision.budget is not None:
                assert sum(self.shares.share_of.values()) == self.decision.budget
            assert all(0 <= share <= self.shares.depth for share in self.shares.share_of.values())

    def logged_admit(self, batch, counts, plan):
        shared, planned_while = self.stats.share_plans, self.stats.drafting_plans
        recuts = self.stats.recut_plans
        own = self._plan_budget(batch, counts)  # what the step would plan itself
        admit(self, batch, counts, plan)
        if self.stats.recut_plans > recuts:
            assert batch.num_tokens != len(batch.slot_list)  # a prompt chunk shares it
            recut.append(self.stats.budgets[-1] == own)
            assert self.stats.drafting_plans == planned_while
        if self.stats.share_plans > shared:
            shares = ahead_shares[self._step]
            slots = [batch.slot_list[i] for i in batch.decode_list]
            expected = sum(min(shares.share_of[s], c) for s, c in zip(slots, counts, strict=True))
            exact = slots == list(shares.share_of) and len(slots) == len(batch.slot_list)
            taken.append((self.stats.budgets[-1] == expected, exact))
            assert batch.num_tokens == len(batch.slot_list)  # decodes alone
            assert max(counts) <= shares.depth
            assert self.stats.drafting_plans == planned_while

    monkeypatch.setattr(lookahead_module.LookAhead, "decide_next", logged_ahead)
    monkeypatch.setattr(AdaptivePolicy, "_admit", logged_admit)
    monkeypatch.setattr(lookahead_module, "REUSE_SHARE", 0.8)
    engine, _, _ = _adaptive_run(shaped, draft_model, "on", monkeypatch, exact=False)
    assert engine.stats.share_plans == len(taken) >= 1
    assert all(right for right, _ in taken)
    assert not all(exact for _, exact in taken)  # changed batches among them
    assert engine.stats.recut_plans == len(recut) >= 1 and all(recut)
    monkeypatch.setattr(lookahead_module.LookAhead, "shares_budget", lambda *args: None)
    off, _, _ = _adaptive_run(shaped, draft_model, "on", monkeypatch, exact=False)
    assert off.stats.share_plans == off.stats.recut_plans == 0
    # Fewer budgets planned while the drafter ran.
    assert engine.stats.drafting_plans < off.stats.drafting_plans
