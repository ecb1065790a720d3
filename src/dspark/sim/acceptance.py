"""Who accepts what: per-position acceptance by domain, and the confidences a scheduler sees.

Each request belongs to a domain with published per-position conditional acceptance
``p_d[k] = P(draft k accepted | drafts 1..k-1 accepted)``. A request's true probability
at its g-th round varies around that (``logit p = logit p_d[k] + ease_r + noise[g, k]``:
some requests are easier, some rounds harder). Outcomes are drawn left to right: draft k
is accepted when ``uniform[g, k] < p`` and every earlier one was. The scheduler never sees
``p``: it sees confidences passed through a miscalibration, ``logit c = logit p + bias +
conf_noise * normal`` (``bias = conf_noise = 0`` is a perfectly calibrated drafter).

All randomness of a request comes from its own generator seeded by ``(seed, request
index)``, so every policy faces the same requests, rounds and coin flips (common random
numbers): differences between policies are their decisions, not luck.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark.resources import PUBLISHED_ACCEPTANCE, load_json

DOMAINS = ("chat", "code", "math")


def published_rates(drafter: str = "dspark") -> dict[str, np.ndarray]:
    """Per-position conditional acceptance by domain from the DSpark paper's Figure 2."""
    table = load_json(PUBLISHED_ACCEPTANCE)["conditional_acceptance_per_position"]
    return {domain: np.array(table[domain][drafter], dtype=np.float64) for domain in DOMAINS}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-domain rates, spread over requests and rounds, and the drafter's calibration."""

    rates: dict[str, np.ndarray] = field(default_factory=published_rates)
    request_spread: float = 0.5  # std of a request's logit offset (easy vs hard requests)
    round_spread: float = 0.5  # std of per-round, per-position logit noise
    conf_bias: float = 0.0  # logit bias of the confidences (> 0: overconfident)
    conf_noise: float = 0.0  # std of logit noise on the confidences

    def __post_init__(self) -> None:
        lengths = {len(r) for r in self.rates.values()}
        if len(lengths) != 1:
            raise ValueError(f"every domain needs the same number of positions, got {lengths}")
        for domain, rates in self.rates.items():
            if not ((rates > 0) & (rates < 1)).all():
                raise ValueError(f"rates of domain {domain!r} must lie in (0, 1), got {rates}")
        if min(self.request_spread, self.round_spread, self.conf_noise) < 0:
            raise ValueError("spreads and conf_noise must be non-negative")

    @property
    def num_positions(self) -> int:
        return len(next(iter(self.rates.values())))

    def draw_request(self, rng: np.random.Generator, domain: str, num_rounds: int) -> RequestDraws:
        """Everything random about one request for up to ``num_rounds`` rounds."""
        if domain not in self.rates:
            raise ValueError(f"unknown domain {domain!r}; known: {sorted(self.rates)}")
        k = self.num_positions
        base = logit(self.rates[domain]) + rng.normal(0.0, self.request_spread)
        true_logit = base + rng.normal(0.0, self.round_spread, (num_rounds, k))
        probs = sigmoid(true_logit)
        shown = sigmoid(
            true_logit + self.conf_bias + rng.normal(0.0, self.conf_noise, (num_rounds, k))
        )
        return RequestDraws(probs, shown.astype(np.float32), rng.random((num_rounds, k)))


@dataclass(frozen=True)
class RequestDraws:
    """One request's rounds: ``[rounds, K]`` true probabilities, shown confidences, coins."""

    probs: np.ndarray
    confidences: np.ndarray
    uniforms: np.ndarray


def expected_tokens(probs: np.ndarray, admitted: np.ndarray) -> np.ndarray:
    """Expected tokens of a round (accepted drafts plus the bonus) for ``[n, K]`` true
    probabilities with ``admitted`` drafts per request: ``1 + sum_k<a prod_j<=k p_j``."""
    survival = np.cumprod(probs, axis=1)
    positions = np.arange(probs.shape[1])
    return 1.0 + np.where(positions < admitted[:, None], survival, 0.0).sum(axis=1)


def accepted_drafts(probs: np.ndarray, uniforms: np.ndarray, admitted: np.ndarray) -> np.ndarray:
    """Drafts accepted per request: the run of leading heads, cut at ``admitted``."""
    heads = (uniforms < probs) & (np.arange(probs.shape[1]) < admitted[:, None])
    return np.cumprod(heads, axis=1).sum(axis=1)
