"""What a ``dspark bench`` run is built from: its prompts and a setting's engine.

``bench_prompts`` (held-out ShareGPT or HumanEval prompts, or ``--prompts``),
``engine_for`` (the engine of a setting at a concurrency level, sized for it) and
``Replay`` (``--shape``: a random-weight drafter whose acceptance is replayed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark.bench.settings import Setting, engine_config
from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import LLMEngine
from dspark.engine.replay import AcceptanceTrace, ReplayDrafter


def bench_prompts(tokenizer, args, count: int) -> list[list[int]]:
    from dspark.train.data import humaneval_prompts, load_prompts, sharegpt_prompts

    if args.prompts:
        given = load_prompts(args.prompts)
        pool = given["eval" if args.dataset == "sharegpt" else "humaneval"]
        pool = [p for p in pool if len(p) <= args.max_prompt_tokens]
    elif args.dataset == "sharegpt":
        pool = sharegpt_prompts(tokenizer, "eval", args.max_prompt_tokens, count)
    else:
        pool = humaneval_prompts(tokenizer, args.max_prompt_tokens)
    if not pool:
        raise ValueError(f"no {args.dataset} prompt fits {args.max_prompt_tokens} tokens")
    return [pool[i % len(pool)] for i in range(count)]


@dataclass
class Replay:
    """``--shape``: the random-weight drafter model and the trace its acceptance comes from."""

    draft_model: object
    trace: AcceptanceTrace


def engine_for(
    loaded, setting: Setting, concurrency: int, args, replay: Replay | None = None
) -> LLMEngine:
    k = max(setting.k, 1)
    out = Path(args.out)
    name = args.shape or "model"
    # A variant profiles apart (its fields may change what profiling measures).
    tag = f"-{setting.tag}" if setting.tag else ""
    tp = getattr(args, "tensor_parallel_size", 1)
    tag += f"-tp{tp}" if tp > 1 else ""
    values = dict(
        spec=setting.spec,
        num_drafts=k,
        drafter=args.drafter,
        max_num_seqs=concurrency,
        # A full verify batch plus one whole prompt: otherwise the per-request draft room
        # (K each) leaves prompt chunks no tokens, and new requests starve at high K.
        max_num_batched_tokens=max(512, concurrency * (k + 1) + args.max_prompt_tokens),
        kv_cache_tokens=max(4096, concurrency * (args.max_prompt_tokens + args.max_tokens + 32)),
        profile_path=str(
            out / "profiles" / f"profile-{name}-c{concurrency}-k{k}-{args.device}{tag}.json"
        ),
        graph_padding_budget=args.graph_padding_budget,
        tensor_parallel_size=tp,
    )
    config = engine_config(values, setting.overrides)  # a variant's fields win
    drafter = None
    if replay is not None and setting.spec != "none":
        block = replay.draft_model.config.block_size
        on_gpu = args.device.startswith("cuda")
        graphs = (concurrency, loaded.config.max_position) if on_gpu else None
        on_cpu = args.device == "cpu"
        regions = config.max_num_seqs if config.uses_kv_regions("cpu" if on_cpu else "cuda") else 0
        inner = DSparkDrafter(
            replay.draft_model,
            config.drafter_rows(block),
            config.block_size,
            graphs=graphs,
            regions=regions,  # as the engine gives the drafter it builds itself
        )
        # The same seed for every configuration: a request meets the same round at the
        # same point of its output in all of them (common random numbers).
        drafter = ReplayDrafter(inner, replay.trace, seed=0)
    return LLMEngine(loaded, config, drafter=drafter)
