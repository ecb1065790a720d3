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
from dspark.engine.sampling import (
    SamplingParams,
    inverse_cdf_draw,
    request_uniforms,
    same_distribution_groups,
    target_probs,
)


@dataclass
class Proposal:
    """Drafts for a batch of requests (one list per request, possibly empty)."""

    tokens: list[list[int]]
    draft_probs: list[torch.Tensor | None]  # [d, V] per request; None: deterministic drafts
    confidences: np.ndarray | None  # [n, K] from a confidence head; None: the drafter has none


class Drafter(Protocol):
    """What the engine asks of a drafter. A drafter conditioned on the target's hidden
    states also has ``capture_layers`` (target layers whose outputs it wants) and
    ``observe(requests, starts, counts, features)``, which the engine calls after every
    forward with those layers' outputs for the positions each request kept
    (``dspark.engine.drafter.DSparkDrafter``). A drafter whose proposal runs on a device
    may also take ``propose(..., while_drafting=fn)``, and says so with
    ``runs_host_work_while_drafting = True``: it calls ``fn()`` once, after queueing the
    proposal's device work and before waiting for it, so that the policy's host work
    (the step's budget) overlaps the drafter's passes."""

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
    batch at once, one transfer instead of one per request). A sampling request is
    ``verify_sampled`` of one round."""
    if not params.is_greedy:
        return verify_sampled([SampledRound(logits, drafts, draft_probs, params, generator)])[0]
    num_drafts = len(drafts)
    best = list(argmax) if argmax is not None else logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < num_drafts and best[accepted] == drafts[accepted]:
        accepted += 1
    return accepted, [*drafts[:accepted], best[accepted]]


@dataclass
class SampledRound:
    """One sampling request's verification: its target logits ``[a + 1, V]``, its ``a``
    drafts, their draft distributions ``[a, V]`` (None: deterministic drafts), its
    sampling parameters and generator."""

    logits: torch.Tensor
    drafts: Sequence[int]
    draft_probs: torch.Tensor | None
    params: SamplingParams
    generator: torch.Generator | None


def verify_sampled(rounds: Sequence[SampledRound]) -> list[tuple[int, list[int]]]:
    """Rejection sampling for a batch of sampling requests: per round, the accepted draft
    count and the tokens it emits (the module doc's rule).

    Batched: one ``target_probs`` call per distinct set of sampling parameters; each
    round draws ``a + 1`` uniforms from its own generator (``a`` acceptance tests, then
    the residual or bonus draw); the target and draft probabilities of every draft and
    the uniforms come to the host in one transfer, the acceptance tests run there, and
    the final tokens of all rounds are drawn together (``inverse_cdf_draw`` over their
    residual, or bonus, distributions) and come back in a second transfer."""
    if not rounds:
        return []
    device = rounds[0].logits.device
    probs = _target_distributions(rounds)
    uniforms = [request_uniforms(r.generator, len(r.drafts) + 1, device) for r in rounds]
    # p(x) and q(x) of every draft, then every uniform: one transfer to the host.
    counts = [len(r.drafts) for r in rounds]
    all_drafts = torch.tensor([x for r in rounds for x in r.drafts], dtype=torch.long)
    all_drafts = all_drafts.to(device)
    positions = torch.arange(max(counts), device=device)
    parts, start = [], 0
    for r, p, a in zip(rounds, probs, counts, strict=True):
        if a:
            tokens, index = all_drafts[start : start + a], positions[:a]
            start += a
            parts.append(p[index, tokens].double())
            q = r.draft_probs  # deterministic drafts: q(x) = 1
            parts.append(q[index, tokens].double() if q is not None else torch.ones_like(parts[-1]))
    host = torch.cat([*parts, *uniforms]).tolist()
    drafted = sum(counts)
    results: list[tuple[int, list[int]]] = []
    final_p, final_q, last = [], [], []
    zeros = None
    start, draw = 0, 2 * drafted
    for r, p, u, a in zip(rounds, probs, uniforms, counts, strict=True):
        p_values, q_values = host[start : start + a], host[start + a : start + 2 * a]
        draws = host[draw : draw + a + 1]
        start, draw = start + 2 * a, draw + a + 1
        accepted = 0  # draft x is accepted with probability min(1, p(x) / q(x))
        while accepted < a and draws[accepted] * q_values[accepted] < p_values[accepted]:
            accepted += 1
        results.append((accepted, list(r.drafts[:accepted])))
        final_p.append(p[accepted])
        if accepted == a:  # every draft accepted: the bonus token from the next row
            zeros = torch.zeros_like(p[a]) if zeros is None else zeros
            final_q.append(zeros)
        elif r.draft_probs is None:  # a deterministic draft: its token's mass removed
            removed = torch.zeros_like(p[accepted])
            removed[r.drafts[accepted]] = 1.0
            final_q.append(removed)
        else:  # the residual max(0, p - q) at the first rejection
            final_q.append(r.draft_probs[accepted].to(p.dtype))
        last.append(u[-1:])
    target = torch.stack(final_p)
    residual = (target - torch.stack(final_q)).clamp_min_(0.0)
    # A residual without mass (the draft distribution covers the target's): the target row.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0.0, residual, target)
    tokens = inverse_cdf_draw(residual, torch.cat(last)).tolist()
    return [(a, [*emitted, token]) for (a, emitted), token in zip(results, tokens, strict=True)]


def _target_distributions(rounds: Sequence[SampledRound]) -> list[torch.Tensor]:
    """Each round's ``[a + 1, V]`` target probabilities, one ``target_probs`` call for
    the rounds that share temperature, top-k and top-p."""
    probs: list[torch.Tensor] = [rounds[0].logits] * len(rounds)
    for members in same_distribution_groups([r.params for r in rounds]):
        params = rounds[members[0]].params
        if len(members) == 1:
            probs[members[0]] = target_probs(rounds[members[0]].logits, params)
            continue
        parts = [rounds[j].logits for j in members]
        joint = target_probs(_joined(parts), params)
        sizes = [part.shape[0] for part in parts]
        for j, part in zip(members, joint.split(sizes), strict=True):
            probs[j] = part
    return probs


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` of ``[rows, V]`` tensors, without the copy when they are
    consecutive row blocks of one contiguous tensor (the engine's per-request slices of
    the batch's logits, in batch order)."""
    first = parts[0]
    width, rows = first.shape[1], 0
    storage = first.untyped_storage().data_ptr()
    for part in parts:
        dense = part.shape[1] == width and (
            part.shape[0] == 1 or part.stride(0) == width
        )  # a one-row block's row stride says nothing: it is not checked
        if not (
            dense
            and (width == 1 or part.stride(1) == 1)
            and part.untyped_storage().data_ptr() == storage
            and part.storage_offset() == first.storage_offset() + rows * width
        ):
            return torch.cat(parts)
        rows += part.shape[0]
    return first.as_strided((rows, width), (width, 1), first.storage_offset())
