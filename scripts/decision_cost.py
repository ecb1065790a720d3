"""What adaptive verification's per-step decisions cost on the host, with the caches
thrashed between calls, as they are inside an engine step (a tight benchmark loop keeps
NumPy's code and data hot and reads 3-4x lower: ``dspark bench-scheduler``).

For each batch size: ``drafting_pays`` (how deep to draft), ``record`` (this step's
confidences), ``plan`` (the stale budget) and ``allocate`` (the fresh allocation), on a
saved engine profile as the cost model, after 120 steps of learnt prices and published
chat confidences. Medians of 200 calls, microseconds.

    PYTHONPATH=src python scripts/decision_cost.py \
        docs/results/profiles/h200_8b_7768e0e/profile-llama3-8b-c16-k7-cuda.json 1 4 16
"""

import sys
import time

import numpy as np

from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace
from dspark.scheduling import AdaptiveVerifier
from dspark.scheduling.cost import ObservedDraftCost

K = 7


def main() -> None:
    profile = EngineProfile.load(sys.argv[1])
    sizes = [int(n) for n in sys.argv[2:]] or [1, 4, 16]
    trace = AcceptanceTrace.resolve("published:chat")
    rng = np.random.default_rng(0)
    junk = np.ones(4_000_000)  # 32 MB: more than the last-level cache
    objects = [{"a": i} for i in range(20_000)]

    def thrash() -> None:
        junk.sum()
        sum(o["a"] for o in objects[::7])

    for n in sizes:
        if n > profile.tables.max_num_reqs:
            raise SystemExit(f"{n} requests exceed the profile's {profile.tables.max_num_reqs}")
        cost = ObservedDraftCost(profile.tables, depth_ms=profile.depth_costs(), num_positions=K)
        verifier = AdaptiveVerifier(n, K, cost, max_total_logits=n * (K + 1))
        slots = np.arange(n)
        for slot in slots:
            verifier.add_request(int(slot))
        drafts, non_draft = np.full(n, K), np.ones(n, dtype=np.int64)
        for _ in range(120):  # learnt state, as an engine in steady state has it
            verifier.record(slots, trace.confidences[rng.integers(0, 20_000, n)])
            cost.record_step(n, n, n * 4, K, 12.0 + rng.normal(), 100 * n)
            cost.record_step(n, n, 0, 0, 8.0 + rng.normal(), 100 * n)
            cost.record(n, 2.0, K)
        times: dict[str, list[float]] = {
            name: [] for name in ("drafting_pays", "record", "plan", "allocate", "total")
        }
        for _ in range(200):
            confidences = trace.confidences[rng.integers(0, 20_000, n)]
            thrash()
            t0 = time.perf_counter()
            verifier.drafting_pays(slots, drafts, non_draft, n, 100 * n)
            t1 = time.perf_counter()
            verifier.record(slots, confidences)
            t2 = time.perf_counter()
            budget = verifier.plan(slots, drafts, non_draft, n, 100 * n)
            t3 = time.perf_counter()
            if 0 < budget < n * K:
                verifier.allocate(slots, drafts, budget)
            t4 = time.perf_counter()
            spans = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)
            for name, seconds in zip(times, spans, strict=True):
                times[name].append(seconds * 1e6)
        row = " ".join(f"{name} {np.median(v):6.1f}" for name, v in times.items())
        print(f"n={n:4d} {row}")


if __name__ == "__main__":
    main()
