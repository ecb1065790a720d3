"""Adaptive decisions under a saved GPU profile with the look-ahead on, for any source tree.

    PYTHONPATH=<tree>/src python scripts/frozen_decisions.py PROFILE.json CONCURRENCY REQUESTS \
        [FIELD=VALUE ...]

Like ``depth_decisions.py`` (a tiny random target and drafter on this CPU, acceptance
replayed from ``published:chat``, the profile's prices frozen: nothing learnt from this
CPU's timings, no throughput gate), but with the look-ahead on as on a GPU, a closed loop
of REQUESTS prompts at CONCURRENCY, extra ``EngineConfig`` fields from the command line,
and only what every tree since session 21 reports (``EngineStats``' depth counts, rounds,
plan sources), so that an older commit's ``src`` (``git archive REV src``) runs it too.
Session 25: with the 8B shape's H200 profile at 256 requests, 2415998, b6e3c79^ and
c1f747f decide alike, so their different depths on the GPU come from learnt prices or
step costs, not the decision logic.
"""

import sys
import time
from collections import Counter

import numpy as np
import torch
from depth_decisions import config_field, frozen_engine  # this directory

from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace
from dspark.engine.sampling import SamplingParams

PLAN_COUNTS = ("lookahead_hits", "lookahead_reused", "drafting_plans", "share_plans")


def main() -> None:
    profile = EngineProfile.load(sys.argv[1])
    concurrency, num_requests = int(sys.argv[2]), int(sys.argv[3])
    fields = dict(config_field(*arg.split("=", 1)) for arg in sys.argv[4:])
    torch.manual_seed(0)
    torch.set_num_threads(2)
    trace = AcceptanceTrace.resolve("published:chat")
    engine = frozen_engine(profile, concurrency, trace, 131072, 131072, **fields)
    engine.lookahead = True  # as on a GPU
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    pending = [rng.integers(5, 200, rng.integers(20, 200)).tolist() for _ in range(num_requests)]
    live, start = [], time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and sum(not r.is_finished for r in live) < concurrency:
            live.append(engine.add_request(pending.pop(), params))
        engine.step()
    stats = engine.stats
    depths = stats.depth_steps
    depths = dict(depths) if isinstance(depths, (dict, Counter)) else dict(enumerate(depths))
    rounds = max(stats.num_decode_rounds, 1)
    print("steps by depth:", {d: n for d, n in sorted(depths.items()) if n})
    print(
        f"tokens a round: verified {stats.num_verified / rounds:.3f}, "
        f"accepted {stats.num_accepted / rounds:.3f} ({rounds} rounds)"
    )
    print("plans:", {name: getattr(stats, name, None) for name in PLAN_COUNTS})
    budgets = np.array(stats.budgets)
    print(
        f"budgets: {budgets.size}, mean {budgets.mean() if budgets.size else 0:.1f}; "
        f"{time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
