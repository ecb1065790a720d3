import json

import numpy as np
import pytest

from dspark.scheduling import CostTables
from dspark.sim.acceptance import AcceptanceModel, accepted_drafts, expected_tokens
from dspark.sim.policies import Adaptive, FixedK, NoSpeculation, Policy
from dspark.sim.simulator import SimConfig, simulate
from dspark.sim.surface import CostSurface, SurfaceCostModel
from dspark.sim.sweep import SweepConfig, make_policy, run_sweep
from dspark.sim.workload import Workload


class FlatCost:
    """Every step costs the same: throughput is then tokens per step over that cost."""

    def __init__(self, ms):
        self.ms, self.calls = ms, 0

    def step_costs_ms(self, num_reqs, num_tokens, max_drafts, context_tokens=0):
        self.calls += 1
        return np.full(max_drafts + 1, self.ms)

    def step_ms(self, num_reqs, num_tokens, context_tokens):
        return float(self.step_costs_ms(num_reqs, num_tokens, 0, context_tokens)[0])


def constant_acceptance(rates):
    rates = np.array(rates, dtype=np.float64)
    return AcceptanceModel(rates={"chat": rates}, request_spread=0.0, round_spread=0.0)


def test_expected_tokens_by_hand():
    probs = np.array([[0.5, 0.5, 0.5], [0.9, 0.8, 0.1]])
    # 1 + 0.5 + 0.25 with two drafts; 1 + 0.9 + 0.72 + 0.072 with three.
    assert expected_tokens(probs, np.array([2, 3])).tolist() == pytest.approx([1.75, 2.692])


def test_acceptance_draws_follow_survival():
    rng = np.random.default_rng(0)
    probs = np.tile([0.9, 0.5, 0.8], (200_000, 1))
    accepted = accepted_drafts(probs, rng.random(probs.shape), np.full(200_000, 3))
    # P(A = a): 0.1, 0.9*0.5, 0.45*0.2, 0.36.
    freq = np.bincount(accepted, minlength=4) / accepted.shape[0]
    assert freq == pytest.approx([0.1, 0.45, 0.09, 0.36], abs=0.004)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_single_request_accounting_matches_closed_form(k):
    rates = [0.8, 0.7, 0.75, 0.9, 0.6, 0.85, 0.7]
    acceptance = constant_acceptance(rates)
    cost = FlatCost(10.0)
    workload = Workload(context_len=100, output_len=(1000, 1000), max_output_len=1000)
    result = simulate(
        FixedK(k),
        SimConfig(1, num_steps=3000, warmup_steps=0, jitter=0.0),
        workload,
        acceptance,
        cost,
        cost,
    )
    tau = 1 + np.cumprod(rates)[:k].sum()
    # Rounds near the end of a request verify fewer drafts, so allow a little below tau.
    assert result.acceptance_length == pytest.approx(tau, rel=0.03)
    assert result.throughput_tok_s == pytest.approx(100 * tau, rel=0.03)
    assert result.mean_step_ms == pytest.approx(10.0)
    assert result.verified_per_step == pytest.approx(k + 1, rel=0.01)


def test_no_speculation_makes_one_token_per_step_and_skips_draft_cost():
    draft_priced, plain = FlatCost(12.0), FlatCost(10.0)
    result = simulate(
        NoSpeculation(),
        SimConfig(4, num_steps=200, warmup_steps=10, jitter=0.0),
        Workload(),
        constant_acceptance([0.9] * 7),
        draft_priced,
        plain,
    )
    assert result.throughput_tok_s == pytest.approx(4 * 100)
    assert result.acceptance_length == 1.0 and draft_priced.calls == 0


def test_seed_policy_never_prices_with_the_true_cost():
    surface = CostSurface.load()
    truth = SurfaceCostModel(surface)
    seed = make_policy("seed", 8, truth, None)
    assert seed.verifier.cost_model is None  # built from the tables it was given, nothing else
    from dspark.sim.surface import seed_tables_from_surface

    tables = seed_tables_from_surface(surface)
    seed = make_policy("seed", 8, truth, tables)
    assert isinstance(seed.verifier.cost_model, CostTables)
    spy = FlatCost(20.0)
    simulate(
        seed, SimConfig(8, num_steps=50, warmup_steps=0), Workload(), AcceptanceModel(), spy, spy
    )
    assert spy.calls == 50  # the simulator's clock, once a step; the policy never asked


class Recorder(Policy):
    def __init__(self, inner):
        self.inner, self.decisions, self.views = inner, [], []
        self.name, self.num_positions = inner.name, inner.num_positions

    def begin(self, slot):
        self.inner.begin(slot)

    def end(self, slot):
        self.inner.end(slot)

    def decide(self, step):
        admitted = self.inner.decide(step)
        self.views.append(step)
        self.decisions.append(np.array(admitted))
        return admitted


class FlipRound(AcceptanceModel):
    """Flips the coins of request 0 in round 5 (and nothing else)."""

    def draw_request(self, rng, domain, num_rounds):
        draws = super().draw_request(rng, domain, num_rounds)
        if self.conf_bias == 0.0 and getattr(self, "_flip", False) and not self._flipped[0]:
            self._flipped[0] = True
            draws.uniforms[5] = 1.0 - draws.uniforms[5]
        return draws


def run_recorded(flip):
    acceptance = FlipRound()
    object.__setattr__(acceptance, "_flip", flip)
    object.__setattr__(acceptance, "_flipped", [False])
    truth = SurfaceCostModel(CostSurface.load())
    policy = Recorder(Adaptive("ours", truth, 7, 16))
    simulate(
        policy, SimConfig(16, num_steps=30, warmup_steps=0), Workload(), acceptance, truth, truth
    )
    return policy


def test_no_policy_sees_outcomes_before_deciding():
    plain, flipped = run_recorded(False), run_recorded(True)
    # Request 0 plays its round 5 in step 5: every decision up to and including that
    # step is the same, though that step's outcome (and so the later contexts) differs.
    for step in range(6):
        assert (plain.decisions[step] == flipped.decisions[step]).all()
        assert plain.views[step].context_tokens == flipped.views[step].context_tokens
    assert plain.views[6].context_tokens != flipped.views[6].context_tokens
    assert all(view.true_probs is None for view in plain.views)


def test_runs_are_deterministic_given_the_seed():
    truth = SurfaceCostModel(CostSurface.load())
    results = [
        simulate(
            Adaptive("ours", truth, 7, 8),
            SimConfig(8, num_steps=60, seed=3),
            Workload(),
            AcceptanceModel(conf_noise=0.3),
            truth,
            truth,
        ).to_dict()
        for _ in range(2)
    ]
    assert results[0] == results[1]


def test_sweep_writes_json_table_and_plots(tmp_path):
    from dspark.sim.report import checks, save

    config = SweepConfig(
        domains=("code",),
        contexts=(1024,),
        concurrency=(1, 32),
        num_steps=40,
        warmup_steps=5,
        jobs=1,
        out_dir=tmp_path,
        calibration_study=False,
    )
    result = run_sweep(config)
    assert len(result.runs) == 2 * 11
    paths = save(result)
    payload = json.loads((tmp_path / "sim.json").read_text())
    assert len(payload["runs"]) == 22
    assert {r["policy"] for r in payload["runs"]} >= {"no-spec", "fixed-7", "seed", "ours", "ideal"}
    for path in paths:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    found = checks(result)
    # At concurrency 1 every adaptive policy verifies all 7 drafts: same coins, same result.
    at_one = {r.policy: r.throughput_tok_s for r in result.runs if r.concurrency == 1}
    assert at_one["ours"] == at_one["fixed-7"] == at_one["ideal"]
    assert found["ours_vs_ideal_min"]["ratio"] > 0.9
