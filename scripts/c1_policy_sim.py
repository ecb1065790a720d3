"""Batch-of-one policies replayed on recorded per-request rounds, at an H200's step costs.

At one request adaptive verification decides, step by step, whether to draft and how
deep, from the request's own recent rounds, the population's and the gate's timings.
This replays those decisions (the real ``AdaptiveVerifier`` and ``ThroughputGate``) and
every fixed K on the rounds ``record_request_rounds.py`` recorded, request by request, and
prices every step with the H200 costs the session 13 decision log measured for SmolLM2 at
one request. A step that begins at token ``p`` of a request meets the recorded round that
began at or before ``p``, shifted by the tokens since (its drafts past ``p`` matched the
target, so they are taken as the drafter's guess from ``p``): fixed K and adaptive meet
the same rounds where their paths cross.

    PYTHONPATH=src python scripts/c1_policy_sim.py ROUNDS.npz [MAX_TOKENS]

``PRICES=session30`` prices steps as session 30's H200 run measured them instead
(``CATCH_UP_MS`` sets the held-back upkeep's catch-up, 0.3 ms by default there), and
``PRICES=cpu31`` as session 31's main job on the 2-core CPU did (catch-up 5 ms),
``PRICES=session38`` as session 38's H200 run at one request (greedy heads as graphs);
``ACCEPT_SCALE`` makes the drafter overconfident (below).

Prints tokens per ms by policy and each adaptive variant's ratio to the best fixed K.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from dspark.scheduling import AdaptiveVerifier
from dspark.scheduling.gate import ALONE_CONFIDENCE, ALONE_WINDOW, ThroughputGate

K = 7
# The cost model's prices at one request (session 13 decision log, H200, SmolLM2):
# the target with b drafts, and what drafting d deep adds (d = 0: an undrafted step).
VERIFY_MS = np.array([3.224, 3.382, 3.455, 3.455, 3.531, 3.531, 3.531, 3.531])
DRAFT_MS = np.array([0.526, 2.13, 2.406, 2.682, 2.958, 3.237, 3.516, 3.794])
# What steps took there (medians): undrafted 3.75 ms, drafted d deep about the price,
# and a drafted step right after an undrafted one 0.4 ms more (held-back context).
UNDRAFTED_WALL = 3.75
CATCH_UP_MS = 0.4
if os.environ.get("PRICES") == "session30":
    # What whole steps took in session 30's c1 run (H200, b476565; medians of five
    # repeats): undrafted 3.34 ms, K = 3 4.89 and K = 5 5.28, so drafting d deep about
    # 4.31 + 0.19 d; the target's share nearly flat in its tokens (the profile: 3.40 ms
    # at 4 tokens, launch-bound).
    VERIFY_MS = 3.34 + 0.02 * np.arange(8)
    DRAFT_MS = 4.31 + 0.19 * np.arange(8) - VERIFY_MS
    DRAFT_MS[0] = 0.0
    UNDRAFTED_WALL = 3.34
    CATCH_UP_MS = float(os.environ.get("CATCH_UP_MS", "0.3"))
elif os.environ.get("PRICES") == "session38":
    # Session 38's first c1 run (H200, 3be362f's greedy heads replayed as graphs; medians
    # of five repeats, docs/results/bench/h200/session38/s38_c1): K = 3 4.38 ms a step,
    # K = 4 4.54, K = 5 4.60; the forward phase 3.15 ms at 4 tokens and 3.23-3.24 at 5-6
    # (the 8-token graph); the drafter phase 0.70-0.81 ms, about 0.535 + 0.055 d. Taken
    # as walls of fwd(d) + 0.535 + 0.055 d + 0.53 (the rest of K = 3's step), fwd 3.10
    # at 2 tokens, 3.15 at 3-4, 3.23 at 5-8; undrafted 3.25 (no speculation's 3.17 and
    # session 37's measured 0.08 ms more for adaptive's undrafted step).
    depth = np.arange(8)
    forward = np.array([3.05, 3.10, 3.15, 3.15, 3.23, 3.23, 3.23, 3.23])
    walls = forward + 0.535 + 0.055 * depth + 0.53
    VERIFY_MS = 3.25 + forward - forward[0]
    DRAFT_MS = walls - VERIFY_MS
    DRAFT_MS[0] = 0.0
    UNDRAFTED_WALL = 3.25
    CATCH_UP_MS = float(os.environ.get("CATCH_UP_MS", "0.3"))
elif os.environ.get("PRICES") == "cpu31":
    # Session 31's main job on the 2-core CPU (one repeat each, step medians): undrafted
    # 45.0 ms, K = 1 50.6, K = 3 66.0, K = 5 103.4, K = 7 123.7 (even depths midway); the
    # target's share taken as 42 + 4 ms a verified token (its forward phase grew about
    # that much from K = 1 to K = 3).
    VERIFY_MS = 42.0 + 4.0 * np.arange(8)
    walls = np.array([45.0, 50.6, 58.3, 66.0, 84.7, 103.4, 113.55, 123.7])
    DRAFT_MS = walls - VERIFY_MS
    DRAFT_MS[0] = 0.0
    UNDRAFTED_WALL = 45.0
    CATCH_UP_MS = float(os.environ.get("CATCH_UP_MS", "5.0"))


class PricedCosts:
    """A fixed cost model with the engine's interface (``ObservedDraftCost``'s methods)."""

    def step_costs_ms(self, num_reqs, num_tokens, cap, context_tokens=0):
        return VERIFY_MS[: cap + 1] + DRAFT_MS[K]

    def draft_cost_ms(self, num_reqs, depth=None):
        return float(DRAFT_MS[K if depth is None else depth])

    def draft_costs_by_depth(self, num_reqs, num_positions):
        return DRAFT_MS[: num_positions + 1].copy()


ACCEPT_SCALE = float(os.environ.get("ACCEPT_SCALE", "1"))
"""``ACCEPT_SCALE=0.5``: each round accepts that share of its recorded drafts (rounded
down) while its confidences stay as recorded: a drafter far more confident than it
should be (sampling at temperature 1 with a drafter trained greedily), where drafting
can lose to not drafting."""


def drafted_wall(depth: int) -> float:
    """A drafted step d deep, without catching up held-back upkeep (``CATCH_UP_MS``)."""
    return VERIFY_MS[depth] + DRAFT_MS[depth]


class Request:
    def __init__(self, conf, accepted, start, max_tokens):
        self.conf, self.accepted, self.start = conf, accepted, start
        self.length = min(max_tokens, int(start[-1] + accepted[-1] + 1))

    def round_at(self, p: int):
        g = int(np.searchsorted(self.start, p, side="right")) - 1
        shift = p - int(self.start[g])
        left = int(self.accepted[g]) - shift
        if left < 0:  # past this round's accepted span (the recorded one ended earlier)
            return self.conf[g], 0
        conf = np.concatenate([self.conf[g][shift:], np.repeat(self.conf[g][-1:], shift)])
        return conf, int(left * ACCEPT_SCALE)


def load(path: str, max_tokens: int) -> list[Request]:
    data = np.load(path)
    out = []
    for r in np.unique(data["request"]):
        m = data["request"] == r
        out.append(
            Request(data["confidences"][m], data["accepted"][m], data["start"][m], max_tokens)
        )
    return out


def fixed_totals(req: Request, k: int) -> tuple[float, float]:
    """Tokens and milliseconds of one request decoded with a fixed K (0: undrafted)."""
    tokens = ms = 0.0
    p = 0
    while p < req.length:
        if k == 0:
            got, wall = 1, UNDRAFTED_WALL
        else:
            _, acc = req.round_at(p)
            got, wall = min(acc, k) + 1, drafted_wall(k)
        got = min(got, req.length - p)
        p += got
        tokens += got
        ms += wall
    return tokens, ms


def run_fixed(requests, k):
    totals = np.array([fixed_totals(req, k) for req in requests]).sum(axis=0)
    return totals[0] / totals[1], {}


def best_k_per_request(requests) -> float:
    """A bound no batch-of-one policy of fixed depths beats: each request decoded with the
    fixed K (or none) that is fastest for it, known in advance."""
    totals = np.zeros(2)
    for req in requests:
        options = [fixed_totals(req, k) for k in range(K + 1)]
        totals += max(options, key=lambda o: o[0] / o[1])
    return totals[0] / totals[1]


def run_adaptive(
    requests,
    decay=None,
    round_decay=None,
    relax=0.5,
    gate=True,
    rho=None,
    catch_up=True,
    charge=True,
    calibrate=False,
    margin=0.0,
    alone_confidence=ALONE_CONFIDENCE,
    alone_window=ALONE_WINDOW,
    max_depth=K,
):
    verifier = AdaptiveVerifier(1, K, PricedCosts(), max_total_logits=64)
    verifier.depth_margin = margin
    if decay is not None:
        verifier.population_decay = decay
    if round_decay is not None:
        verifier.population_round_decay = round_decay
    the_gate = (
        ThroughputGate(alone_confidence=alone_confidence, alone_window=alone_window)
        if gate
        else None
    )
    tokens = ms = 0.0
    counts = {"undrafted": 0, "drafted": 0, "probes": 0, "vetoes": 0}
    one = np.array([0])
    per_step = None  # the engine's upkeep_ms_per_step: a catch-up's share per held step

    def catch_up_ms(held: int) -> float:
        nonlocal per_step
        if not (catch_up and held):
            return 0.0
        share = CATCH_UP_MS / held
        per_step = share if per_step is None else per_step + 0.25 * (share - per_step)
        return CATCH_UP_MS

    for req in requests:
        verifier.add_request(0)
        p, held = 0, 0  # undrafted steps whose context update is held back
        while p < req.length:
            if rho is not None:
                verifier._predictiveness = rho
            depth = verifier.drafting_pays(one, np.array([max_depth]), np.array([1]), 1)
            overruled = False
            if depth and the_gate is not None and not the_gate.should_draft(1):
                depth = 0
                counts["vetoes"] += 1
            elif not depth and the_gate is not None and the_gate.should_probe(1):
                depth = verifier.probe_depth
                overruled = bool(depth)
                counts["probes"] += overruled
            if depth == 0:
                verifier.relax(one, relax)
                got, wall = 1, UNDRAFTED_WALL
                counts["undrafted"] += 1
                held += 1
                # The engine catches up after DEFER_LIMIT (32) undrafted steps anyway; the
                # gate sees this step without that flush, priced by the running share.
                priced_wall = wall + (per_step if charge and per_step is not None else 0.0)
                if held == 32:
                    wall += catch_up_ms(held)
                    held = 0
            else:
                conf, acc = req.round_at(p)
                verifier.record(one, conf[None, :])
                budget = verifier.plan(one, np.array([depth]), np.array([1]), 1)
                got = min(acc, depth, budget) + 1
                if calibrate:  # learnt one step late in the engine; at once here
                    admitted = np.array([min(depth, budget)])
                    accepted = np.minimum(admitted, acc)
                    verifier.record_outcomes(conf[None, :], admitted, accepted)
                # The engine times a step without the held-back upkeep it runs (other
                # steps' work): the gate sees the drafted step without the catch-up.
                priced_wall = drafted_wall(depth)
                wall = priced_wall + catch_up_ms(held)
                held = 0
                counts["drafted"] += 1
            got = min(got, req.length - p)
            if the_gate is not None:
                the_gate.record(1, depth > 0, got, priced_wall, False, overruled)
            p += got
            tokens += got
            ms += wall
        verifier.remove_request(0)
    return tokens / ms, counts


def main() -> None:
    path = sys.argv[1]
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    requests = load(path, max_tokens)
    halves = {
        "all": requests,
        "first half": requests[: len(requests) // 2],
        "second half": requests[len(requests) // 2 :],
    }
    variants = {
        "adaptive (as shipped)": {},
        "  no catch-up cost": {"catch_up": False},
        "  undrafted steps not charged": {"charge": False},
        "  no gate": {"gate": False},
        "  population by calls (0.9)": {"round_decay": 0.0},
        "  population by calls, no gate": {"round_decay": 0.0, "gate": False},
        "  population by rounds 0.98": {"round_decay": 0.98},
        "  population by rounds 0.999": {"round_decay": 0.999},
        "  relax 1.0": {"relax": 1.0},
        "  relax 0.2": {"relax": 0.2},
        "  predictiveness 0.3": {"rho": 0.3},
        "  predictiveness 0": {"rho": 0.0},
        "  calibrated survival": {"calibrate": True},
        "  calibrated, no gate": {"calibrate": True, "gate": False},
        "  depth margin 0.02": {"margin": 0.02},
        "  depth margin 0.05": {"margin": 0.05},
        "  calibrated, margin 0.02": {"calibrate": True, "margin": 0.02},
        "  the gate before s31 (window 16)": {"alone_window": 16},
        "  window 16, veto 2 errors wide": {"alone_window": 16, "alone_confidence": 2.0},
        "  window 16, veto 3 errors wide": {"alone_window": 16, "alone_confidence": 3.0},
        "  window 64": {"alone_window": 64},
        "  window 256": {"alone_window": 256},
        "  window 128, veto 3 errors wide": {"alone_confidence": 3.0},
        "  at most 3 deep": {"max_depth": 3},
        "  at most 4 deep": {"max_depth": 4},
        "  at most 5 deep": {"max_depth": 5},
    }
    for name, subset in halves.items():
        fixed = {k: run_fixed(subset, k)[0] for k in range(K + 1)}
        best_k = max(range(1, K + 1), key=fixed.get)
        print(
            f"\n{name}: {len(subset)} requests; tokens/ms: none {fixed[0]:.4f}, "
            + ", ".join(f"K{k} {fixed[k]:.4f}" for k in range(1, K + 1))
            + f"; best K{best_k}"
        )
        bound = best_k_per_request(subset)
        label = "best K per request (bound)"
        print(f"  {label:<28} {bound:.4f}  {bound / fixed[best_k]:.3f}x K{best_k}")
        for label, kwargs in variants.items():
            rate, counts = run_adaptive(subset, **kwargs)
            print(
                f"  {label:<28} {rate:.4f}  {rate / fixed[best_k]:.3f}x K{best_k}  "
                f"{rate / fixed[0]:.3f}x none  {counts}"
            )


if __name__ == "__main__":
    main()
