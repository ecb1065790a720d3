"""A plain port of the seed's host-side budget, kept as the baseline and as an oracle.

It follows the seed's data flow on purpose (per-request dicts keyed by request id,
``np.fromiter`` over them, a full descending sort of the survival scores, the ratio
over every budget) so that the benchmark measures what a straightforward port costs,
and the tests can check that ``dspark.scheduling`` takes the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SeedRequestTable:
    """The engine state the seed's budget reads: slot indices and prefill progress."""

    req_id_to_index: dict[str, int]
    num_computed_tokens: np.ndarray  # [max_num_reqs]
    prefill_len: np.ndarray  # [max_num_reqs]
    stale_confidences: np.ndarray  # [max_num_reqs, K] float32


def seed_budget(
    table: SeedRequestTable,
    num_tokens_per_req: dict[str, int],
    draft_tokens: dict[str, list[int]],
    draft_ms: np.ndarray,
    verify_ms: np.ndarray,
    max_total_logits: int,
    num_bonus_tokens: int = 1,
) -> int:
    """The budget, computed the way the seed computes it."""
    req_ids = list(num_tokens_per_req)
    num_reqs = len(req_ids)
    num_positions = table.stale_confidences.shape[1]
    scheduled = np.fromiter(num_tokens_per_req.values(), dtype=np.int32, count=num_reqs)
    drafts = np.fromiter(
        (len(draft_tokens.get(r, ())) for r in req_ids), dtype=np.int32, count=num_reqs
    )
    non_draft = scheduled - drafts
    slots = np.fromiter(
        map(table.req_id_to_index.__getitem__, req_ids), dtype=np.int32, count=num_reqs
    )
    survival = np.cumprod(table.stale_confidences[slots].astype(np.float64), axis=1)
    is_valid = np.arange(num_positions)[None, :] < drafts[:, None]
    scores = np.sort(survival[is_valid])[::-1]
    non_draft_total = int(non_draft.sum())
    cap = min(int(drafts.sum()), max(0, max_total_logits - num_reqs * num_bonus_tokens))
    scores = scores[:cap]
    num_sampling = np.count_nonzero(
        table.num_computed_tokens[slots] + non_draft >= table.prefill_len[slots]
    )
    gain = np.concatenate(([num_sampling], num_sampling + np.cumsum(scores)))
    cost = draft_ms[num_reqs] + verify_ms[non_draft_total : non_draft_total + cap + 1]
    # The seed also keeps per-request dicts of drafts and non-draft tokens for the
    # allocation that follows; building them is part of its per-step cost.
    per_req = (
        {r: int(d) for r, d in zip(req_ids, drafts, strict=True)},
        {r: int(t) for r, t in zip(req_ids, non_draft, strict=True)},
    )
    del per_req
    return int(np.argmax(gain / cost))
