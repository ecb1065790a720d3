"""Drafters and the verification rule.

Verification, per request with ``a`` admitted drafts and ``a + 1`` target distributions:
greedy accepts draft i while it equals the target's argmax and then emits the argmax;
sampling accepts draft x with probability ``min(1, p(x) / q(x))``, and on the first
rejection emits a token from ``norm(max(0, p - q))``; if every draft is accepted, a bonus
token comes from the last distribution. Either way the output follows the target
distribution exactly, whatever ``a`` is, provided ``a`` does not depend on the drafts
being verified (``dspark.scheduling.verifier`` explains why adaptive verification keeps
that true).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams, target_probs


@dataclass
class Proposal:
    """Drafts for a batch of requests (one list per request, possibly empty)."""

    tokens: list[list[int]]
    draft_probs: list[torch.Tensor | None]  # [d, V] per request; None: deterministic drafts
    confidences: np.ndarray | None  # [n, K] from a confidence head; None: the drafter has none
    # The same confidences where the drafter computed them (the engine's device), for the
    # allocation on device (``dspark.ops``); None: only the host copy exists.
    device_confidences: torch.Tensor | None = None


class Drafter(Protocol):
    """What the engine asks of a drafter. A drafter conditioned on the target's hidden
    states also has ``capture_layers`` (target layers whose outputs it wants) and
    ``observe(requests, starts, counts, features)``, which the engine calls after every
    forward with those layers' outputs for the positions each request kept
    (``dspark.engine.drafter.DSparkDrafter``). A drafter whose proposal runs on a device
    may also take ``propose(..., while_drafting=fn)``, and says so with
    ``runs_host_work_while_drafting = True``: it calls ``fn()`` once, after queueing the
    proposal's device work and before waiting for it, so that the engine's host work
    (``LLMEngine._draft``: the step's budget) overlaps the drafter's passes."""

    num_positions: int  # K, the most drafts proposed per request

    def propose(self, requests: Sequence[Request], max_drafts: np.ndarray) -> Proposal:
        """Up to ``max_drafts[r]`` drafts continuing each request's tokens."""
        ...

    def on_verified(self, request: Request, num_accepted: int) -> None:
        """The request accepted ``num_accepted`` of its drafts this step."""
        ...

    def on_finished(self, request: Request) -> None: ...


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the request's last n tokens
    (n from ``max_n`` down to ``min_n``) and propose the tokens that followed it."""

    def __init__(self, num_positions: int, max_n: int = 3, min_n: int = 1) -> None:
        if num_positions < 1 or not 1 <= min_n <= max_n:
            raise ValueError(
                f"need K >= 1 and 1 <= min_n <= max_n, got K={num_positions}, "
                f"n in [{min_n}, {max_n}]"
            )
        self.num_positions, self.max_n, self.min_n = num_positions, max_n, min_n

    def propose(self, requests: Sequence[Request], max_drafts: np.ndarray) -> Proposal:
        tokens = [
            self._lookup(np.asarray(r.all_ids), int(k))
            for r, k in zip(requests, max_drafts, strict=True)
        ]
        return Proposal(tokens, [None] * len(tokens), None)

    def _lookup(self, ids: np.ndarray, limit: int) -> list[int]:
        if limit <= 0:
            return []
        for n in range(min(self.max_n, ids.shape[0] - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return ids[start : start + limit].tolist()
        return []

    def on_verified(self, request: Request, num_accepted: int) -> None:
        pass

    def on_finished(self, request: Request) -> None:
        pass


class OnlineAcceptance:
    """Per-position conditional acceptance rates learnt from verification outcomes, used
    as confidences for drafters without a confidence head."""

    def __init__(
        self,
        num_positions: int,
        prior: float = 0.6,
        prior_weight: float = 4.0,
        decay: float = 0.995,
    ) -> None:
        if not 0.0 <= prior <= 1.0 or prior_weight <= 0.0 or not 0.0 < decay <= 1.0:
            raise ValueError(
                "need prior in [0, 1], prior_weight > 0 (an untried position would have no "
                f"rate) and decay in (0, 1]; got {prior}, {prior_weight}, {decay}"
            )
        self.accepted = np.zeros(num_positions)
        self.trials = np.zeros(num_positions)
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay

    def update(self, admitted: np.ndarray, accepted: np.ndarray) -> None:
        positions = np.arange(self.trials.shape[0])[:, None]  # [K, 1]
        # Position k was tried when k < admitted and every earlier draft was accepted.
        tried = (positions < admitted) & (positions <= accepted)
        self.trials = self.decay * self.trials + tried.sum(axis=1)
        self.accepted = self.decay * self.accepted + (positions < accepted).sum(axis=1)

    @property
    def rates(self) -> np.ndarray:
        return (self.accepted + self.prior * self.prior_weight) / (self.trials + self.prior_weight)

    def confidences(self, num_reqs: int) -> np.ndarray:
        return np.broadcast_to(self.rates.astype(np.float32), (num_reqs, self.trials.shape[0]))


def verify(
    logits: torch.Tensor,  # [a + 1, V] float32 target logits at the request's positions
    drafts: Sequence[int],  # [a]
    draft_probs: torch.Tensor | None,  # [a, V] or None for deterministic drafts
    params: SamplingParams,
    generator: torch.Generator | None,
    argmax: Sequence[int] | None = None,
) -> tuple[int, list[int]]:
    """Accepted draft count and the tokens the step emits (accepted drafts + one more).
    ``argmax``: the rows' argmax already on the host (the engine computes it for the whole
    batch at once, one transfer instead of one per request)."""
    num_drafts = len(drafts)
    if params.is_greedy:
        best = list(argmax) if argmax is not None else logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < num_drafts and best[accepted] == drafts[accepted]:
            accepted += 1
        return accepted, [*drafts[:accepted], best[accepted]]
    probs = target_probs(logits, params)
    uniforms = torch.rand(num_drafts, generator=generator, device=probs.device).tolist()
    for i, token in enumerate(drafts):
        q = 1.0 if draft_probs is None else float(draft_probs[i, token])
        p = float(probs[i, token])
        if uniforms[i] * q < p:  # accept with probability min(1, p / q)
            continue
        if draft_probs is None:
            residual = probs[i].clone()
            residual[token] = 0.0
        else:
            residual = (probs[i] - draft_probs[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:
            residual = probs[i]
        return i, [*drafts[:i], int(torch.multinomial(residual, 1, generator=generator))]
    bonus = int(torch.multinomial(probs[num_drafts], 1, generator=generator))
    return num_drafts, [*drafts, bonus]
