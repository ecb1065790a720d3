"""Replayed acceptance: real GPU timing of a large target, acceptance from a recorded trace.

Adaptive verification matters where a verified token costs real GPU time, which a 135M
model never shows on a large GPU (its steps are launch-bound). ``dspark bench --shape
llama3-8b`` therefore runs an 8B-shaped target with random weights, and a DSpark drafter
of matching shape with random weights, both for real: every step computes what the real
models would. What random weights cannot give is acceptance, so ``ReplayDrafter`` replays
it from an ``AcceptanceTrace``: rounds recorded by the real SmolLM2 drafter in the engine
(its calibrated confidences for the K positions and how many of the K drafts the target
accepted under full verification).

Each proposal takes one trace round per request (the trace does not keep which rounds
came from the same request), chosen by hashing the request's id with the number of
tokens it has generated (and a seed): common random numbers. A request reaching the same
point of its output meets the same round whatever the engine setting, as a real drafter
meets the same text there, so settings compared on the same prompts see the same
acceptance draws where their requests' paths cross and differ by their decisions rather
than by luck. The round's confidences are what the scheduler sees; when the engine
verifies ``a`` of the drafts, the request accepts ``min(accepted, a)`` (greedy
acceptance is a prefix, so verifying fewer drafts accepts the same ones up to ``a``).
The emitted tokens are the drafts plus the target's argmax, which means nothing with
random weights but costs what it costs.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from dspark.engine.request import Request
from dspark.engine.speculative import Proposal

SHIPPED_TRACE = "acceptance_trace_smollm2_sharegpt.npz"


@dataclass(frozen=True)
class AcceptanceTrace:
    confidences: np.ndarray  # [N, K] calibrated, as the scheduler saw them
    accepted: np.ndarray  # [N] drafts accepted when all K were verified
    source: str

    def __post_init__(self) -> None:
        conf, accepted = self.confidences, self.accepted
        if conf.ndim != 2 or accepted.shape != conf.shape[:1] or conf.shape[0] == 0:
            raise ValueError(
                f"a trace needs confidences [N, K] and accepted [N] with N > 0, got "
                f"{conf.shape} and {accepted.shape}"
            )
        if not np.isfinite(conf).all() or conf.min() < 0 or conf.max() > 1:
            raise ValueError("trace confidences must be finite and in [0, 1]")
        if accepted.min() < 0 or accepted.max() > conf.shape[1]:
            raise ValueError(f"trace accepted counts must be in [0, {conf.shape[1]}]")

    @property
    def num_positions(self) -> int:
        return self.confidences.shape[1]

    @property
    def acceptance_length(self) -> float:
        """Tokens per round under full verification (the bonus token included)."""
        return float(self.accepted.mean()) + 1.0

    @classmethod
    def from_rounds(
        cls,
        rounds: str | Path,
        temperatures: Sequence[float] = (),
        shifts: Sequence[float] = (),
        split: str = "eval",
    ) -> AcceptanceTrace:
        """From the ``rounds.npz`` that ``dspark calibrate`` saves (raw confidence logits),
        calibrated with the drafter's per-position temperatures and shifts."""
        with np.load(rounds) as saved:
            logits = saved[f"{split}_logits"].astype(np.float64)
            accepted = saved[f"{split}_accepted"].astype(np.int64)
            source = str(saved["source"])
        k = logits.shape[1]
        scale = np.asarray(temperatures or [1.0] * k, dtype=np.float64)
        shift = np.asarray(shifts or [0.0] * k, dtype=np.float64)
        confidences = 1.0 / (1.0 + np.exp(-(logits / scale + shift)))
        return cls(confidences.astype(np.float32), accepted, f"{source}, {split} split")

    @classmethod
    def from_published(
        cls,
        domain: str = "chat",
        drafter: str = "dspark",
        num_rounds: int = 20_000,
        spread: float = 1.0,
        seed: int = 0,
    ) -> AcceptanceTrace:
        """Synthetic rounds matching published per-position acceptance.

        The DSpark paper (Figure 2, shipped in ``published_acceptance.json``) gives the
        acceptance of position k given positions 1..k-1 were accepted, per domain
        (``math``, ``code``, ``chat``) and drafter (``dspark``, ``dflash``, ``eagle3``). It
        gives no per-round spread, so one is assumed: each round draws a difficulty
        ``z ~ N(0, spread²)`` on the logit scale, position k is accepted (given the earlier
        ones) with probability ``sigmoid(c_k + z)``, and that probability is the round's
        confidence (a perfectly calibrated drafter). The offsets ``c_k`` are solved so
        that, among the rounds that reach position k, the mean acceptance is the
        published rate. ``spread`` 0 gives every round the same confidences.
        """
        from dspark.resources import PUBLISHED_ACCEPTANCE, load_json

        table = load_json(PUBLISHED_ACCEPTANCE)["conditional_acceptance_per_position"]
        if domain not in table or domain in ("source", "positions"):
            domains = [d for d in table if d not in ("source", "positions")]
            raise ValueError(f"domain must be one of {domains}, got {domain!r}")
        if drafter not in table[domain]:
            raise ValueError(f"drafter must be one of {sorted(table[domain])}, got {drafter!r}")
        if num_rounds < 1 or spread < 0:
            raise ValueError(
                f"num_rounds must be positive and spread non-negative, got {num_rounds}, {spread}"
            )
        rates = np.asarray(table[domain][drafter], dtype=np.float64)
        rng = np.random.default_rng(seed)
        z = rng.normal(0.0, spread, num_rounds)
        uniforms = rng.random((num_rounds, rates.shape[0]))
        confidences = np.empty((num_rounds, rates.shape[0]))
        alive = np.ones(num_rounds, dtype=bool)
        accepted = np.zeros(num_rounds, dtype=np.int64)
        for k, rate in enumerate(rates):
            reaching = z[alive] if alive.any() else z
            low, high = -30.0, 30.0  # bisection on c_k: mean acceptance rises with it
            for _ in range(60):
                mid = (low + high) / 2
                if np.mean(1.0 / (1.0 + np.exp(-(mid + reaching)))) < rate:
                    low = mid
                else:
                    high = mid
            confidences[:, k] = 1.0 / (1.0 + np.exp(-(low + z)))
            alive &= uniforms[:, k] < confidences[:, k]
            accepted += alive
        source = (
            f"synthetic rounds from the published {drafter} {domain} per-position acceptance "
            f"(DSpark paper, Fig. 2), logit spread {spread:g}"
        )
        return cls(confidences.astype(np.float32), accepted, source)

    @classmethod
    def resolve(cls, spec: str | None) -> AcceptanceTrace:
        """``None``: the shipped SmolLM2 trace; ``published:DOMAIN[:DRAFTER]``: synthetic
        rounds from published rates (``from_published``); anything else: a saved trace."""
        if spec and spec.startswith("published:"):
            parts = spec.split(":")[1:]
            if not 1 <= len(parts) <= 2 or not parts[0]:
                raise ValueError(f"expected published:DOMAIN[:DRAFTER], got {spec!r}")
            return cls.from_published(*parts)
        return cls.load(spec)

    @classmethod
    def load(cls, path: str | Path | None = None) -> AcceptanceTrace:
        """A trace saved with ``save`` (None: the one shipped with dspark, recorded by the
        SmolLM2-135M drafter on held-out ShareGPT prompts)."""
        target = Path(path) if path else resources.files("dspark") / "data" / SHIPPED_TRACE
        try:
            with np.load(target) as saved:
                return cls(
                    saved["confidences"].astype(np.float32),
                    saved["accepted"].astype(np.int64),
                    str(saved["source"]),
                )
        except (OSError, KeyError, ValueError) as error:
            raise ValueError(f"cannot read an acceptance trace from {target}: {error}") from None

    def save(self, path: str | Path) -> None:
        np.savez_compressed(
            path,
            confidences=self.confidences.astype(np.float32),
            accepted=self.accepted.astype(np.int8),
            source=self.source,
        )


class ReplayDrafter:
    """A real drafter (for its cost and its tokens) whose confidences and acceptance come
    from a trace. The engine asks ``replayed_acceptance`` instead of comparing tokens."""

    def __init__(self, inner, trace: AcceptanceTrace, seed: int = 0) -> None:
        if trace.num_positions < inner.num_positions:
            raise ValueError(
                f"the trace has {trace.num_positions} positions, the drafter drafts "
                f"{inner.num_positions}"
            )
        self.inner, self.trace = inner, trace
        self.num_positions = inner.num_positions
        self.capture_layers = getattr(inner, "capture_layers", ())
        self.seed = seed
        self._id_keys: dict[str, int] = {}
        self._pending: dict[str, int] = {}

    @property
    def runs_host_work_while_drafting(self) -> bool:
        return getattr(self.inner, "runs_host_work_while_drafting", False)

    def propose(
        self,
        requests: Sequence[Request],
        max_drafts: np.ndarray,
        while_drafting: Callable[[], None] | None = None,
    ) -> Proposal:
        if while_drafting is None:
            proposal = self.inner.propose(requests, max_drafts)
        else:
            proposal = self.inner.propose(requests, max_drafts, while_drafting=while_drafting)
        rounds = self.rounds_for(requests)
        for request, index in zip(requests, rounds, strict=True):
            self._pending[request.request_id] = int(self.trace.accepted[index])
        return Proposal(
            proposal.tokens,
            proposal.draft_probs,
            self.trace.confidences[rounds, : self.num_positions],
        )

    def rounds_for(self, requests: Sequence[Request]) -> np.ndarray:
        """``[len(requests)]`` trace rounds: a hash of (seed, request id, tokens generated)."""
        keys = np.fromiter((self._id_key(r.request_id) for r in requests), np.uint64)
        points = np.fromiter((len(r.output_ids) for r in requests), np.uint64)
        return (_mix64(keys ^ _mix64(points)) % np.uint64(self.trace.accepted.shape[0])).astype(
            np.int64
        )

    def _id_key(self, request_id: str) -> int:
        key = self._id_keys.get(request_id)
        if key is None:
            digest = zlib.crc32(request_id.encode(), self.seed & 0xFFFFFFFF)
            key = self._id_keys[request_id] = (self.seed << 32 | digest) & _MASK64
        return key

    def replayed_acceptance(self, request: Request, num_admitted: int) -> int:
        """Drafts the request accepts when ``num_admitted`` of them are verified."""
        return min(self._pending.pop(request.request_id, 0), num_admitted)

    def observe(self, requests, starts, counts, features) -> None:
        observe = getattr(self.inner, "observe", None)
        if observe is not None:
            observe(requests, starts, counts, features)

    def prepare_dummy(self, request: Request) -> None:
        prepare = getattr(self.inner, "prepare_dummy", None)
        if prepare is not None:
            prepare(request)

    def on_verified(self, request: Request, num_accepted: int) -> None:
        self.inner.on_verified(request, num_accepted)

    def on_finished(self, request: Request) -> None:
        self._pending.pop(request.request_id, None)
        self._id_keys.pop(request.request_id, None)
        self.inner.on_finished(request)


_MASK64 = (1 << 64) - 1


def _mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic): a bijection whose outputs
    look independent for neighbouring inputs."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def random_draft_model(target, seed: int = 0, **overrides):
    """A ``DraftModel`` of the shape DSpark uses for ``target`` (a ``LoadedModel``), with
    random weights, attached to it: two decoder layers of the target's width and MLP, the
    Markov and confidence heads, K = 7 (``overrides`` change any ``DrafterConfig`` field).
    Wrap it in a ``DSparkDrafter`` per engine (the drafter's cache belongs to the engine)."""
    from dspark.models.drafter import DrafterConfig, DraftModel
    from dspark.models.shapes import randomise_

    config = DrafterConfig.for_target(
        target.config, **{"intermediate_size": target.config.intermediate_size, **overrides}
    )
    param = next(target.model.parameters())
    with torch.device("meta"):
        model = DraftModel(config)
    model = model.to_empty(device=param.device)
    randomise_(model, seed)
    fresh = type(model.rotary)(config.head_dim, config.rope_theta, config.max_position)
    model.rotary.cos, model.rotary.sin = fresh.cos.to(param.device), fresh.sin.to(param.device)
    return model.to(param.dtype).eval().attach(target.model)
