"""Time of rejection-sampling verification for a batch of sampling requests: the batched
``verify_sampled`` against the per-request loop it replaced, same inputs, alternating.

Synthetic rounds at SmolLM2's vocabulary (49,152): CONCURRENCY requests at temperature 1,
each with K drafts drawn from its draft distribution (random logits, target and draft
correlated), their target logits consecutive slices of one tensor as in the engine.
Prints the median ms per batch of each way and their ratio.

    PYTHONPATH=src python3 scripts/verify_sampling_time.py [CONCURRENCY] [K] [ROUNDS] [DEVICE]
"""

import sys
import time

import numpy as np
import torch

from dspark.engine.sampling import SamplingParams, target_probs
from dspark.engine.speculative import SampledRound, verify_sampled

VOCAB = 49_152


def per_request_verify(logits, drafts, draft_probs, params, generator):
    """The per-request rule before batching: a host read per probability, one
    ``multinomial`` for the residual or bonus token."""
    num_drafts = len(drafts)
    probs = target_probs(logits, params)
    uniforms = torch.rand(num_drafts, generator=generator, device=probs.device).tolist()
    for i, token in enumerate(drafts):
        q = 1.0 if draft_probs is None else float(draft_probs[i, token])
        p = float(probs[i, token])
        if uniforms[i] * q < p:
            continue
        residual = (probs[i] - draft_probs[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:
            residual = probs[i]
        return i, [*drafts[:i], int(torch.multinomial(residual, 1, generator=generator))]
    bonus = int(torch.multinomial(probs[num_drafts], 1, generator=generator))
    return num_drafts, [*drafts, bonus]


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    torch.manual_seed(0)
    params = SamplingParams(temperature=1.0)
    rounds = []
    # One logits tensor for the batch, each request's rows a slice of it (as in the engine).
    shared_all = torch.randn(concurrency * (k + 1), VOCAB, device=device) * 3
    target_all = shared_all + torch.randn_like(shared_all)
    for r in range(concurrency):
        rows = slice(r * (k + 1), (r + 1) * (k + 1))
        shared, target = shared_all[rows], target_all[rows]
        draft_probs = torch.softmax(shared[:k] + torch.randn_like(shared[:k]), dim=-1)
        drafts = torch.multinomial(draft_probs, 1).squeeze(1).tolist()
        generator = torch.Generator(device=device).manual_seed(r)
        rounds.append(SampledRound(target, drafts, draft_probs, params, generator))

    def per_request() -> None:
        for r in rounds:
            per_request_verify(r.logits, r.drafts, r.draft_probs, r.params, r.generator)

    print(f"{concurrency} sampled rounds of {k} drafts, vocabulary {VOCAB}, {device}:")
    compare(
        {"batched": lambda: verify_sampled(rounds), "per request": per_request},
        repeats,
        device,
        "batch",
    )


def compare(ways: dict, repeats: int, device: str, unit: str) -> None:
    """Time each of ``ways`` (name -> call; "batched" and "per request") ``repeats``
    times, taking turns, and print the medians and their ratio."""
    times = {name: [] for name in ways}
    for _ in range(repeats):
        for name, call in ways.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) * 1e3)
    medians = {name: float(np.median(values)) for name, values in times.items()}
    for name, value in medians.items():
        print(f"  {name:12s} {value:8.2f} ms per {unit} (median of {repeats})")
    print(f"  per request / batched: {medians['per request'] / medians['batched']:.2f}x")


if __name__ == "__main__":
    main()
