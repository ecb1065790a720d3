"""Where each request's tokens and logits sit in the packed verification batch."""

from __future__ import annotations

import numpy as np

from dspark.scheduling._checks import as_counts, as_non_negative_int


def verification_layout(
    admitted: np.ndarray,
    num_non_draft: np.ndarray,
    num_bonus_tokens: int = 1,
    padded_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative offsets of the packed batch once the drafts are admitted.

    Returns ``(query_start_loc, cu_num_logits)``:
    ``query_start_loc = [0, cumsum(admitted + num_non_draft)]``, padded to
    ``padded_len + 1`` entries by repeating the total (graph-captured batches are
    padded with empty requests), and ``cu_num_logits = [0, cumsum(admitted + bonus)]``.
    """
    admitted = as_counts("admitted", admitted)
    num_reqs = admitted.shape[0]
    non_draft = as_counts("num_non_draft", num_non_draft, num_reqs)
    num_bonus_tokens = as_non_negative_int("num_bonus_tokens", num_bonus_tokens)
    num_slots = num_reqs if padded_len is None else as_non_negative_int("padded_len", padded_len)
    if num_slots < num_reqs:
        raise ValueError(f"padded_len must be at least num_reqs={num_reqs}, got {num_slots}")
    query_start_loc = np.zeros(num_slots + 1, dtype=np.int64)
    np.add.accumulate(admitted + non_draft, out=query_start_loc[1 : num_reqs + 1])
    query_start_loc[num_reqs + 1 :] = query_start_loc[num_reqs]
    cu_num_logits = np.zeros(num_reqs + 1, dtype=np.int64)
    np.add.accumulate(admitted + num_bonus_tokens, out=cu_num_logits[1:])
    return query_start_loc, cu_num_logits


def upper_bound_split(
    num_drafts: np.ndarray,
    num_non_draft: np.ndarray,
    budget: int,
    num_bonus_tokens: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The host's view of the batch before the device has allocated the budget.

    Returns ``(num_tokens_per_req, cu_num_logits)``. The token total is exact
    (``sum(num_non_draft) + budget``); the per-request split spreads the budget evenly
    over the requests that have drafts, in batch order, so buffers can be sized before
    the device decides. ``cu_num_logits`` keeps the scheduled layout (an upper bound),
    except when nothing or everything is admitted, where it is exact.
    """
    drafts = as_counts("num_drafts", num_drafts)
    non_draft = as_counts("num_non_draft", num_non_draft, drafts.shape[0])
    budget = as_non_negative_int("budget", budget)
    num_bonus_tokens = as_non_negative_int("num_bonus_tokens", num_bonus_tokens)
    total = int(drafts.sum())
    if budget > total:
        raise ValueError(f"budget must be at most the scheduled drafts ({total}), got {budget}")
    num_reqs = drafts.shape[0]
    if budget == 0:
        return non_draft.copy(), np.arange(num_reqs + 1, dtype=np.int64) * num_bonus_tokens
    cu_num_logits = np.zeros(num_reqs + 1, dtype=np.int64)
    np.add.accumulate(drafts + num_bonus_tokens, out=cu_num_logits[1:])
    if budget == total:
        return non_draft + drafts, cu_num_logits
    verifying = np.flatnonzero(drafts > 0)
    spread = np.full(verifying.shape[0], budget // verifying.shape[0], dtype=np.int64)
    spread[: budget % verifying.shape[0]] += 1
    tokens = non_draft.copy()
    tokens[verifying] += spread
    return tokens, cu_num_logits
