"""Record every request's drafted rounds in order: one request at a time, fixed K, greedy.

The shipped acceptance trace keeps rounds but not which request they came from. A policy
for a batch of one lives on the order of one request's rounds (a poor patch, then a good
one), so this records them per request: confidences ``[K]`` as the scheduler saw them and
drafts accepted under full verification, request by request, for the bench's prompts
(``bench_prompts``: the same pool and order as ``dspark bench --prompts FILE``).

    PYTHONPATH=src python scripts/record_request_rounds.py PROMPTS.npz COUNT MAX_TOKENS OUT.npz

Writes ``confidences [N, K]``, ``accepted [N]``, ``request [N]`` (the request's index in
the bench's order) and ``start [N]`` (tokens the request's drafted rounds had emitted
before this one: the first token, sampled by the prompt's step, is not counted). CPU,
fp32, the embedded SmolLM2 and the shipped drafter; ``MODEL=path.gguf DEVICE=cuda``
records on a GPU in bf16 instead (the H200 benches' target).
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from dspark.bench.sweep import bench_prompts
from dspark.engine import EngineConfig, LLMEngine, SamplingParams
from dspark.models.loader import load_model

K = 7


def main() -> None:
    prompts_file, count, max_tokens, out = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
    )
    device = os.environ.get("DEVICE", "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    loaded = load_model(os.environ.get("MODEL"), dtype=dtype, device=device)
    args = SimpleNamespace(prompts=prompts_file, dataset="sharegpt", max_prompt_tokens=256)
    prompts = bench_prompts(loaded.tokenizer, args, count)
    engine = LLMEngine(
        loaded,
        EngineConfig(
            spec="fixed",
            num_drafts=K,
            drafter="dspark",
            max_num_seqs=1,
            max_num_batched_tokens=2048,
            kv_cache_tokens=256 + max_tokens + 64,
            seed=0,
        ),
    )
    conf, accepted, request, start = [], [], [], []
    began = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.round_log = []
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        generated = 0
        while engine.has_unfinished():
            engine.step()
            for confidences, admitted, num_accepted in engine.round_log:
                if confidences is not None and admitted == K:
                    conf.append(confidences[:K])
                    accepted.append(num_accepted)
                    request.append(index)
                    start.append(generated)
                generated += num_accepted + 1
            engine.round_log = []
        print(
            f"request {index}: {sum(r == index for r in request)} rounds "
            f"({time.perf_counter() - began:.0f} s)",
            flush=True,
        )
    np.savez(
        out,
        confidences=np.array(conf),
        accepted=np.array(accepted),
        request=np.array(request),
        start=np.array(start),
    )
    print(f"wrote {out}: {len(accepted)} rounds, mean accepted {np.mean(accepted):.3f}")


if __name__ == "__main__":
    main()
