"""What a saved GPU profile makes the budget do, offline, with replayed acceptance.

    python scripts/profile_budget.py PROFILE.json NUM_REQS [--prompt TOKENS] [--drop SIZE]

Draws batches of ``NUM_REQS`` decoding requests from the synthetic published-chat trace
(stale confidences from one draw, fresh from another, as replayed rounds are
independent), takes ``choose_draft_budget`` on the profile's cost tables and the
allocation on the fresh confidences, and prints the mean budget per request, the
accepted drafts a round it gives up against verifying every draft (by the fresh
survival) and the verify time it saves. ``--prompt``: one of the requests is instead a
prompt chunk of that many tokens. ``--drop``: also price the tables without the profiled
size ``SIZE`` (as if steps padded past it). Also prints the trace's expected accepted
drafts by drafting depth.
"""

from __future__ import annotations

import argparse
import copy

import numpy as np

from dspark.engine.profiling import EngineProfile
from dspark.engine.replay import AcceptanceTrace
from dspark.scheduling import allocate_drafts, choose_draft_budget


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile")
    parser.add_argument("num_reqs", type=int)
    parser.add_argument("--prompt", type=int, default=0)
    parser.add_argument("--drop", type=int, default=None)
    parser.add_argument("--batches", type=int, default=2000)
    args = parser.parse_args()
    profile = EngineProfile.load(args.profile)
    tables = {"profile": profile.tables}
    if args.drop is not None:
        pruned = copy.deepcopy(profile)
        pruned.samples = [s for s in pruned.samples if s.num_target_tokens != args.drop]
        tables[f"without {args.drop}"] = pruned.tables
    confidences = AcceptanceTrace.from_published("chat").confidences.astype(np.float64)
    survival = np.cumprod(confidences, axis=1)
    print("expected accepted drafts by depth:", np.cumsum(survival.mean(0)).round(3).tolist())
    n, k = args.num_reqs, confidences.shape[1]
    num_drafts = np.full(n, k)
    num_non_draft = np.ones(n, dtype=np.int64)
    if args.prompt:
        num_drafts[-1], num_non_draft[-1] = 0, args.prompt
    decoding = num_drafts > 0
    num_sampling = int(decoding.sum())
    rng = np.random.default_rng(1)
    draws = [
        (confidences[rng.integers(0, len(confidences), n)], rng.integers(0, len(confidences), n))
        for _ in range(args.batches)
    ]
    for name, table in tables.items():
        budgets, lost, saved = [], [], []
        for stale, fresh_rows in draws:
            fresh = confidences[fresh_rows]
            budget = choose_draft_budget(
                stale, num_drafts, num_non_draft, num_sampling, table, 10**9
            )
            admitted = allocate_drafts(fresh, num_drafts, budget)
            kept = np.arange(k) < admitted[:, None]
            all_drafts = num_drafts[:, None] > np.arange(k)
            lost.append((survival[fresh_rows] * (all_drafts & ~kept)).sum() / num_sampling)
            budgets.append(budget)
            tokens = int(num_non_draft.sum())
            saved.append(
                table.verify_ms[tokens + num_drafts.sum()] - table.verify_ms[tokens + budget]
            )
        print(
            f"{name}: {np.mean(budgets) / num_sampling:.2f} drafts a decoding request, "
            f"{np.mean(lost):.3f} accepted drafts a round given up, "
            f"{np.mean(saved):.2f} ms of verify saved"
        )


if __name__ == "__main__":
    main()
