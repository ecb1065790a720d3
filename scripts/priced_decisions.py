"""What adaptive's decisions are worth under a saved GPU profile's own prices, against
fixed K, on this CPU.

    cd scripts; PYTHONPATH=../src python priced_decisions.py PROFILE.json CONCURRENCY \
        REQUESTS [--overhead MS] [--undrafted MS] [--fixed K ...] [--learn [--sigma MS]
        [--slow-ms MS] [--slow-steps N] [--seed N] [--model NAME=VALUE,...]] [FIELD=VALUE ...]

A tiny random target and drafter run the closed loop with acceptance replayed from
``published:chat`` (``depth_decisions.frozen_engine``, the look-ahead on as on a GPU), and
every step is priced by the profile: the target's verify price at the step's tokens,
plus the drafter's price at its depth and request count, plus ``--overhead`` ms for a
drafted step (``--undrafted`` for an undrafted one): what a real step pays beyond the
profile, which the GPU engine learns (``ObservedDraftCost``; at 16 requests of the 8B
shape the learnt lines held 1.4-2.7 ms). Adaptive decides with those same prices frozen
(the overheads included, nothing learnt), so this asks whether its decisions pay where
its prices are right: tokens per priced millisecond, adaptive against each fixed K on the
same prompts and the same replayed rounds.

``--learn`` instead lets adaptive learn its prices as the engine does (``ObservedDraftCost``)
from step times made of the same prices plus the overheads and a wandering host: Gaussian
noise of ``--sigma`` ms a step, and stretches of ``--slow-steps`` steps that run
``--slow-ms`` slower half the time (the H200 machines' hosts switch between two speeds,
``host_probe_ms``); ``--model`` changes its options from the engine's defaults
(``slope_memory=on``; ``slope_noise=off``, on in the engine since session 36, reproduces
session 35's plain runs). Session 34, the
8B shape's H200 profile at 16 requests: with known overheads adaptive drafted 7 deep in
123 of 124 decided steps and made 1.024x K = 7's tokens per priced ms; learning from noisy
steps it drafted 5-6 deep in about a third of them, as on the H200
(``docs/results/sim/priced_decisions_c16_session34.txt``).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from depth_decisions import FrozenCost, config_field, frozen_engine  # this directory

from dspark.engine.engine import EngineConfig
from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace
from dspark.engine.sampling import SamplingParams
from dspark.scheduling.cost import ObservedDraftCost


class KnownOverhead(FrozenCost):
    """The profile's prices plus a known overhead per step (drafted or not), frozen."""

    def __init__(self, tables, depth_ms, num_positions, drafted: float, undrafted: float):
        super().__init__(tables, depth_ms=depth_ms, num_positions=num_positions)
        self.drafted_ms, self.undrafted_ms = drafted, undrafted

    def _fit(self, num_reqs, undrafted):
        return (self.undrafted_ms if undrafted else self.drafted_ms, 0.0)

    def _fit_key(self, num_reqs, undrafted):
        return (0, undrafted)

    def _drafted_overhead(self, num_reqs, depths):
        return self.drafted_ms + 0.0 * np.asarray(depths, dtype=np.float64)


class SyntheticWalls(ObservedDraftCost):
    """The engine's own learning (``ObservedDraftCost``), fed step times made from the
    profile's prices plus the overheads and a host whose speed wanders: Gaussian noise of
    ``sigma`` ms a step, and stretches of ``slow_steps`` steps that run ``slow_ms``
    slower half the time (the H200 machines' hosts switch between two speeds)."""

    def __init__(self, profile, args, rng):
        engine = EngineConfig()  # the engine's own defaults, then --model's changes
        options = {
            "slope_memory": engine.overhead_slope_memory,
            "slope_noise": engine.overhead_slope_noise,
            **args.model,
        }
        super().__init__(profile.tables, depth_ms=profile.depth_costs(), num_positions=7, **options)
        self.args, self.rng, self.steps, self.slow = args, rng, 0, False

    def record(self, num_reqs, drafting_ms, depth=None):
        super().record(num_reqs, self._profiled(num_reqs, depth), depth)

    def record_step(self, num_reqs, num_tokens, num_drafts, depth, wall_ms, context_tokens=0, **kw):
        a = self.args
        if self.steps % a.slow_steps == 0:
            self.slow = bool(self.rng.random() < 0.5)
        self.steps += 1
        t = min(num_tokens + num_drafts, self.base.verify_ms.shape[0] - 1)
        wall = float(self.base.verify_ms[t])
        wall += self._profiled(num_reqs, depth) + a.overhead if depth else a.undrafted
        wall += (a.slow_ms if self.slow else 0.0) + self.rng.normal(0.0, a.sigma)
        super().record_step(num_reqs, num_tokens, num_drafts, depth, max(wall, 0.0), context_tokens)


def run(profile, concurrency, requests, args, fields, fixed_k=None):
    torch.manual_seed(0)
    trace = AcceptanceTrace.resolve("published:chat")
    if fixed_k is not None:
        fields = fields | {"spec": "fixed", "num_drafts": fixed_k}
    engine = frozen_engine(profile, concurrency, trace, 131072, 131072, **fields)
    if engine.verifier is not None:
        if args.learn:
            engine.verifier.cost_model = SyntheticWalls(
                profile, args, np.random.default_rng(args.seed)
            )
        else:
            engine.verifier.cost_model = KnownOverhead(
                profile.tables, profile.depth_costs(), 7, args.overhead, args.undrafted
            )
        engine.lookahead = True  # as on a GPU
    tables, depth_ms = profile.tables, profile.depth_costs()
    steps = []  # (num_reqs, tokens, depth)
    pending_depth = [0]
    propose = engine.drafter.propose

    def logged_propose(reqs, limits, *rest, **kw):
        pending_depth[0] = int(np.max(limits)) if len(limits) else 0
        return propose(reqs, limits, *rest, **kw)

    engine.drafter.propose = logged_propose
    forward = engine.forward

    def logged_forward(tables_, num_cached, num_query, tokens):
        steps.append((len(num_query), int(np.sum(num_query)), pending_depth[0]))
        pending_depth[0] = 0
        return forward(tables_, num_cached, num_query, tokens)

    engine.forward = logged_forward
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    pending = [rng.integers(5, 200, rng.integers(20, 200)).tolist() for _ in range(requests)]
    live = []
    while pending or engine.has_unfinished():
        while pending and sum(not r.is_finished for r in live) < concurrency:
            live.append(engine.add_request(pending.pop(), params))
        engine.step()
    priced = 0.0
    for n, t, d in steps:
        priced += float(tables.verify_ms[min(t, tables.verify_ms.shape[0] - 1)])
        if d:
            priced += float(depth_ms[min(d, depth_ms.shape[0] - 1), min(n, depth_ms.shape[1] - 1)])
            priced += args.overhead
        else:
            priced += args.undrafted
    stats = engine.stats
    rounds = max(stats.num_decode_rounds, 1)
    return {
        "tokens": stats.num_generated,
        "priced_ms": priced,
        "tok_per_ms": stats.num_generated / priced,
        "steps": len(steps),
        "accepted": stats.num_accepted / rounds,
        "verified": stats.num_verified / rounds,
        "depths": dict(sorted(stats.depth_steps.items())) if stats.depth_steps else {},
    }


def _keywords(text: str) -> dict:
    """``NAME=VALUE[,NAME=VALUE]``: on/off as switches, numbers as floats, else words."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if value in ("on", "off"):
            out[name] = value == "on"
        else:
            try:
                out[name] = float(value)
            except ValueError:
                out[name] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile")
    parser.add_argument("concurrency", type=int)
    parser.add_argument("requests", type=int)
    parser.add_argument("--overhead", type=float, default=2.0)
    parser.add_argument("--undrafted", type=float, default=0.5)
    parser.add_argument("--fixed", type=int, nargs="*", default=[7])
    parser.add_argument("--learn", action="store_true", help="learn prices from synthetic walls")
    parser.add_argument("--sigma", type=float, default=0.3)
    parser.add_argument("--slow-ms", type=float, default=1.3)
    parser.add_argument("--slow-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model",
        type=_keywords,
        default={},
        help="ObservedDraftCost keyword arguments with --learn, e.g. slope_memory=on",
    )
    args, rest = parser.parse_known_args()
    fields = dict(config_field(*arg.split("=", 1)) for arg in rest)
    profile = EngineProfile.load(args.profile)
    torch.set_num_threads(2)
    results = {"adaptive": run(profile, args.concurrency, args.requests, args, fields)}
    for k in args.fixed:
        results[f"K={k}"] = run(profile, args.concurrency, args.requests, args, {}, fixed_k=k)
    base = results["adaptive"]["tok_per_ms"]
    for name, r in results.items():
        print(
            f"{name:>9}: {r['tok_per_ms']:.4f} tok/ms ({base / r['tok_per_ms']:.4f}x adaptive"
            f" over it), {r['tokens']} tokens, {r['priced_ms']:.1f} ms priced, {r['steps']} steps,"
            f" accepted {r['accepted']:.3f}, verified {r['verified']:.3f} a round,"
            f" depths {r['depths']}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
