"""The serving simulator: a closed loop of decoding requests, one policy, measured steps.

Each step every active request decodes: the policy admits some of its drafts, the coins
decide how many are accepted (plus the bonus token), and the clock advances by the true
step cost (a ``StepCostModel``, draft cost included when the policy speculates) times a
little log-normal jitter. A finished request is replaced at once (closed loop), so the
batch always holds ``concurrency`` requests. Prefill is not simulated: a request starts
decoding with its prompt already cached, and its context grows by what it accepts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from dspark.scheduling import StepCostModel
from dspark.sim.acceptance import AcceptanceModel, accepted_drafts
from dspark.sim.policies import Policy, StepView
from dspark.sim.workload import Workload


@dataclass(frozen=True)
class SimConfig:
    concurrency: int
    num_steps: int = 600  # measured steps
    warmup_steps: int = 100
    seed: int = 0
    jitter: float = 0.02  # std of log step time around the true cost

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.num_steps < 1 or self.warmup_steps < 0:
            raise ValueError(
                "concurrency and num_steps must be positive and warmup_steps non-negative, "
                f"got {self.concurrency}, {self.num_steps}, {self.warmup_steps}"
            )


@dataclass
class RunResult:
    policy: str
    concurrency: int
    throughput_tok_s: float  # output tokens / measured time
    per_user_tok_s: float  # mean over requests finished in the window of tokens / lifetime
    tpot_p50_ms: float
    tpot_p99_ms: float
    verified_per_step: float  # mean admitted drafts + 1 per request-step (incl. bonus)
    acceptance_length: float  # mean accepted drafts + 1 per request-round (incl. bonus)
    mean_step_ms: float
    num_finished: int
    labels: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Slots:
    """Per-slot state of the active requests and their pre-drawn randomness."""

    def __init__(self, concurrency: int, num_positions: int, max_rounds: int) -> None:
        shape = (concurrency, max_rounds, num_positions)
        self.probs = np.zeros(shape, dtype=np.float32)
        self.confidences = np.zeros(shape, dtype=np.float32)
        self.uniforms = np.ones(shape, dtype=np.float32)
        self.rounds = np.zeros(concurrency, dtype=np.int64)
        self.generated = np.zeros(concurrency, dtype=np.int64)
        self.output_len = np.ones(concurrency, dtype=np.int64)
        self.context = np.zeros(concurrency, dtype=np.int64)
        self.start_ms = np.zeros(concurrency)


def simulate(
    policy: Policy,
    config: SimConfig,
    workload: Workload,
    acceptance: AcceptanceModel,
    true_cost: StepCostModel,
    true_cost_no_draft: StepCostModel,
) -> RunResult:
    """Run ``policy`` for warm-up plus measured steps and return the measured metrics."""
    n = config.concurrency
    k_max = acceptance.num_positions
    if policy.num_positions > k_max:
        raise ValueError(f"policy {policy.name} drafts {policy.num_positions} > K={k_max}")
    slots = _Slots(n, k_max, workload.max_output_len)
    batch = np.arange(n)
    next_request = 0
    clock_ms = 0.0
    jitter_rng = np.random.default_rng([config.seed, 1 << 20])

    def admit(slot: int, now_ms: float) -> None:
        nonlocal next_request
        rng = np.random.default_rng([config.seed, next_request])
        next_request += 1
        spec = workload.request(rng)
        draws = acceptance.draw_request(rng, spec.domain, spec.output_len)
        rows = spec.output_len
        slots.probs[slot, :rows] = draws.probs
        slots.confidences[slot, :rows] = draws.confidences
        slots.uniforms[slot, :rows] = draws.uniforms
        slots.rounds[slot] = 0
        slots.generated[slot] = 0
        slots.output_len[slot] = spec.output_len
        slots.context[slot] = spec.context_len
        slots.start_ms[slot] = now_ms
        policy.begin(slot)

    for slot in range(n):
        admit(slot, 0.0)

    cost = true_cost if policy.num_positions else true_cost_no_draft
    measured_ms = measured_tokens = 0.0
    verified_sum = accepted_rounds = accepted_sum = 0.0
    tpots: list[float] = []
    speeds: list[float] = []
    for step in range(config.warmup_steps + config.num_steps):
        remaining = slots.output_len - slots.generated
        drafts = np.minimum(policy.num_positions, remaining - 1)
        probs = slots.probs[batch, slots.rounds]  # [n, K]
        view = StepView(
            slots=batch,
            num_drafts=drafts,
            confidences=slots.confidences[batch, slots.rounds][:, : policy.num_positions],
            context_tokens=int(slots.context.sum()),
            true_probs=probs[:, : policy.num_positions] if policy.is_oracle else None,
        )
        admitted = np.asarray(policy.decide(view), dtype=np.int64)
        accepted = accepted_drafts(probs, slots.uniforms[batch, slots.rounds], admitted)
        tokens = np.minimum(accepted + 1, remaining)
        step_ms = cost.step_ms(n, n + int(admitted.sum()), view.context_tokens)
        step_ms *= float(np.exp(jitter_rng.normal(0.0, config.jitter)))
        clock_ms += step_ms
        slots.generated += tokens
        slots.context += tokens
        slots.rounds += 1
        is_measured = step >= config.warmup_steps
        if is_measured:
            measured_ms += step_ms
            measured_tokens += tokens.sum()
            verified_sum += admitted.sum() + n
            accepted_sum += accepted.sum() + n
            accepted_rounds += n
        for slot in np.flatnonzero(slots.generated >= slots.output_len):
            if is_measured:
                lifetime = clock_ms - slots.start_ms[slot]
                tpots.append(lifetime / slots.output_len[slot])
                speeds.append(1e3 * slots.output_len[slot] / lifetime)
            policy.end(slot)
            admit(slot, clock_ms)

    tpot = np.array(tpots) if tpots else np.array([np.nan])
    return RunResult(
        policy=policy.name,
        concurrency=n,
        throughput_tok_s=1e3 * measured_tokens / measured_ms,
        per_user_tok_s=float(np.mean(speeds))
        if speeds
        else 1e3 * measured_tokens / measured_ms / n,
        tpot_p50_ms=float(np.percentile(tpot, 50)),
        tpot_p99_ms=float(np.percentile(tpot, 99)),
        verified_per_step=verified_sum / accepted_rounds,
        acceptance_length=accepted_sum / accepted_rounds,
        mean_step_ms=measured_ms / config.num_steps,
        num_finished=len(tpots),
    )
