"""Adaptive drafting decisions under a saved engine profile, replayed on this CPU.

    python scripts/depth_decisions.py PROFILE.json CONCURRENCY [TRACE]

Runs a tiny random target with a random DSpark drafter and replayed acceptance (``TRACE``:
``published:chat`` by default, see ``AcceptanceTrace.resolve``) through a closed loop at
``CONCURRENCY`` (twice as many requests, 128 tokens each), with the profile's cost tables
as a frozen cost model (nothing learnt from this CPU's timings, no throughput gate), and
prints the drafting depths it decides: overall, in steps with a prompt chunk, and in
steps where a request nears its length limit. It shows what a GPU profile makes the
scheduler do without spending GPU time (the H200 8B-shape profile at 16 requests picks
depth 6 in most steps, where depths 6 and 7 are within a fraction of a percent by it).
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import torch

from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model
from dspark.scheduling.cost import ObservedDraftCost


class FrozenCost(ObservedDraftCost):
    """The profile's prices, never corrected by measured steps."""

    def record(self, *args, **kwargs) -> None:
        pass

    def record_step(self, *args, **kwargs) -> None:
        pass


def config_field(name: str, text: str) -> tuple[str, object]:
    """``NAME=VALUE`` from a command line as the ``EngineConfig`` field, typed as its
    default is: on/off for a switch, none, a number, else the word."""
    default = getattr(EngineConfig(), name)
    if isinstance(default, bool):
        return name, {"on": True, "off": False}[text]
    if text == "none":
        return name, None
    try:
        return name, float(text)
    except ValueError:
        return name, text


def frozen_engine(
    profile: EngineProfile,
    concurrency: int,
    trace: AcceptanceTrace,
    cache_tokens: int,
    drafter_cache_tokens: int,
    **fields,
) -> LLMEngine:
    """Adaptive verification at K = 7 on a tiny random target with a random DSpark
    drafter, ``trace``'s acceptance replayed and the profile's prices frozen (no gate);
    ``fields`` override ``EngineConfig``'s."""
    target = random_model("tiny", dtype=torch.float32)
    config = dict(
        kv_cache_tokens=cache_tokens,
        spec="adaptive",
        num_drafts=7,
        max_num_seqs=concurrency,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        throughput_gate=False,
    )
    drafter = DSparkDrafter(random_draft_model(target), drafter_cache_tokens, 16)
    return LLMEngine(
        target,
        EngineConfig(**(config | fields)),
        drafter=ReplayDrafter(drafter, trace, seed=0),
        cost_model=FrozenCost(profile.tables, depth_ms=profile.depth_costs(), num_positions=7),
    )


def main() -> None:
    profile = EngineProfile.load(sys.argv[1])
    concurrency = int(sys.argv[2])
    trace = AcceptanceTrace.resolve(sys.argv[3] if len(sys.argv) > 3 else "published:chat")
    engine = frozen_engine(profile, concurrency, trace, 32768, 65536)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    pending = [rng.integers(5, 200, rng.integers(20, 200)).tolist() for _ in range(2 * concurrency)]
    decisions = []  # (depth, has a prompt chunk, smallest draft limit)
    decide = engine._drafting_depth

    def logged(batch, limits, *rest):
        depth = decide(batch, limits, *rest)
        mixed = int(batch.non_draft.sum()) != batch.slots.shape[0]
        decisions.append((depth, mixed, int(limits.min())))
        return depth

    engine._drafting_depth = logged
    live = []
    while pending or engine.has_unfinished():
        while pending and sum(not r.is_finished for r in live) < concurrency:
            live.append(engine.add_request(pending.pop(), params))
        engine.step()
    print("depths (depth, steps):", sorted(Counter(d for d, _, _ in decisions).items()))
    print("  with a prompt chunk:", sorted(Counter(d for d, m, _ in decisions if m).items()))
    print(
        "  a request near its limit:",
        sorted(Counter(d for d, _, lim in decisions if lim < 7).items()),
    )
    stats = engine.stats
    rounds = max(stats.num_decode_rounds, 1)
    verified, accepted = stats.num_verified / rounds, stats.num_accepted / rounds
    print(f"verified per round {verified:.2f}, accepted {accepted:.2f}")


if __name__ == "__main__":
    main()
