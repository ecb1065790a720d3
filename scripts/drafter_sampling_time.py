"""Time of the DSpark drafter's proposal for sampled requests: batched sampling (the
engine's ``DSparkDrafter._sample``) against the per-request loop it replaced, same
process, same requests, alternating.

SmolLM2-135M with its shipped drafter, CONCURRENCY requests of held-out ShareGPT prompts
at temperature 1 decoding (fixed K = 7, a few steps in), then ``propose`` timed ROUNDS
times for each way in turn; prints the median ms per proposal of each and their ratio.

    PYTHONPATH=src python3 scripts/drafter_sampling_time.py [CONCURRENCY] [ROUNDS] [DEVICE]

``MODEL_PATH`` (a GGUF or HF directory) and ``PROMPTS`` (a prompts ``.npz``) replace the
embedded SmolLM2 and the ShareGPT package's prompts (on the GPU machine).
"""

import os
import sys

import numpy as np
import torch
from verify_sampling_time import compare  # scripts/: the same alternating timing

from dspark.bench.sweep import Setting, bench_prompts, engine_for
from dspark.engine.drafter import DSparkDrafter
from dspark.engine.graphs import CAPTURE_AFTER_WASTE
from dspark.engine.sampling import SamplingParams, target_probs
from dspark.models.loader import load_model


def per_request_sample(self, requests, hidden, anchors, k):
    """The loop before batching: per sampling request and position, its own
    ``target_probs``, full-vocabulary copy and ``multinomial``."""
    sampling = [i for i, r in enumerate(requests) if not r.params.is_greedy]
    step_probs = [[] for _ in requests]
    previous = anchors
    drafted, conf_logits = [], []
    for position in range(k):
        logits, conf = self.model.heads(hidden[:, position], previous, self.head_weight)
        choice = logits.argmax(dim=-1)
        for i in sampling:
            request = requests[i]
            p = target_probs(logits[i : i + 1], request.params)[0]
            step_probs[i].append(self._full_vocab(p))
            choice[i] = torch.multinomial(p, 1, generator=request.generator)[0]
        token = choice if self.vocab_ids is None else self.vocab_ids[choice]
        drafted.append(token)
        if conf is not None:
            conf_logits.append(conf)
        previous = token
    sampled = [torch.stack(p) if p else None for p in step_probs]
    return (
        torch.stack(drafted, dim=1),
        sampled,
        torch.stack(conf_logits, dim=1) if conf_logits else None,
    )


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    loaded = load_model(os.environ.get("MODEL_PATH"), dtype, device)  # None: the embedded one

    class Args:
        out = "/tmp/drafter-sampling-time"
        shape = None
        drafter = "dspark"
        prompts = os.environ.get("PROMPTS")  # a prompts .npz (the GPU machine), or None
        dataset = "sharegpt"
        max_prompt_tokens = 256
        max_tokens = 512
        graph_padding_budget = CAPTURE_AFTER_WASTE

    Args.device = device
    engine = engine_for(loaded, Setting("fixed", 7), concurrency, Args)
    params = SamplingParams(temperature=1.0, max_tokens=512, ignore_eos=True)
    requests = [
        engine.add_request(prompt, params)
        for prompt in bench_prompts(loaded.tokenizer, Args, concurrency)
    ]
    while any(r.is_prefilling for r in requests):  # past the prompts: every request decoding
        engine.step()
    engine.step()
    drafter = engine.drafter
    limits = np.full(len(requests), 7)
    batched = DSparkDrafter._sample

    def proposal_with(method):
        def call() -> None:
            DSparkDrafter._sample = method
            drafter.propose(requests, limits)

        return call

    print(f"{len(requests)} sampled requests decoding, K = 7, {device}:")
    try:
        ways = {"batched": proposal_with(batched), "per request": proposal_with(per_request_sample)}
        compare(ways, rounds, device, "proposal")
    finally:
        DSparkDrafter._sample = batched


if __name__ == "__main__":
    main()
