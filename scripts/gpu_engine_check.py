"""GPU check of the reference engine: greedy speculation against the engine's own
non-speculative greedy output (bf16), on chat prompts. Exits non-zero on a divergence that
is not an exact numerical tie of the non-speculative run's top-2 logits."""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch

from dspark.datasets import humaneval_tasks
from dspark.engine import LLM, EngineConfig, SamplingParams
from dspark.engine.engine import LLMEngine


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="HF directory or .gguf (default model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--tie-ulps",
        type=float,
        default=2.0,
        help="in bf16, a top-2 gap of at most this many bf16 spacings at the top logit is a tie",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    llm = LLM(args.model, dtype=dtype, device=args.device, config=EngineConfig())
    loaded = llm.engine.loaded
    tasks = humaneval_tasks()[: args.num_prompts]
    prompts = [
        llm.chat_prompt(f"Complete this Python function.\n\n```python\n{t.prompt}```")
        for t in tasks
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    report = {"dtype": args.dtype, "tie_ulps": args.tie_ulps, "runs": {}, "flips": []}
    results = {}
    for spec in ("none", "fixed", "adaptive"):
        engine = LLMEngine(loaded, EngineConfig(spec=spec, num_drafts=4, max_num_seqs=32))
        llm.engine = engine
        outputs = llm.generate(prompts, params)
        results[spec] = [o.token_ids for o in outputs]
        report["runs"][spec] = {
            "acceptance_length": engine.stats.acceptance_length,
            "verified_per_step": engine.stats.verified_per_step,
        }
    failures = 0
    for spec in ("fixed", "adaptive"):
        same = flips = 0
        for prompt, plain, other in zip(prompts, results["none"], results[spec], strict=True):
            i = next((j for j, (a, b) in enumerate(zip(plain, other, strict=True)) if a != b), None)
            if i is None:
                same += 1
                continue
            top, gap = top2(llm, prompt + plain[:i])
            tolerance = tie_tolerance(top, dtype, args.tie_ulps)
            flips += 1
            report["flips"].append(
                {"spec": spec, "token": i, "top": top, "gap": gap, "tolerance": tolerance}
            )
            if gap > tolerance:
                failures += 1
                print(f"{spec}: divergence at token {i}: top-2 gap {gap:.4f} > {tolerance:.4f}")
        report["runs"][spec].update(identical=same, tie_flips=flips)
        print(
            f"{spec}: {same}/{len(prompts)} identical to non-speculative greedy, {flips} tie flips"
        )
    if args.out:
        with open(args.out, "w") as file:
            json.dump(report, file, indent=1)
    return 1 if failures else 0


@torch.inference_mode()
def top2(llm: LLM, ids: list[int]) -> tuple[float, float]:
    """Top logit and top-2 gap at the last position, from a plain one-request forward."""
    engine = LLMEngine(llm.engine.loaded, EngineConfig())
    request = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=1))
    chunks = engine.scheduler.schedule(0)
    chunk = chunks[0]

    batch = engine.cache.attention_batch(
        [request.table], np.array([0]), np.array([chunk.num_tokens])
    )
    hidden, _ = engine.model(
        torch.tensor(ids, device=engine.device),
        torch.arange(len(ids), device=engine.device),
        batch,
        engine.cache.layers,
    )
    top = engine.model.logits(hidden[-1:]).topk(2).values[0]
    return float(top[0]), float(top[0] - top[1])


def tie_tolerance(top: float, dtype: torch.dtype, ulps: float) -> float:
    """fp32: 1e-4 (the project's tie rule). bf16: ``ulps`` spacings of bf16 at ``top``
    (logits come out of a bf16 LM head, so two logits one spacing apart are a tie that a
    different batch shape's summation order can flip)."""
    if dtype == torch.float32:
        return 1e-4
    return ulps * 2.0 ** (math.floor(math.log2(max(abs(top), 1e-30))) - 7)


if __name__ == "__main__":
    sys.exit(main())
