"""``dspark bench-engine``: the reference engine on real prompts, next to transformers.

For each concurrency level, ``concurrency`` prompts run together (greedy,
``--max-tokens`` new tokens each, EOS ignored so every request makes the same number of
tokens); tok/s counts generated tokens over wall time, prefill included. With ``--hf`` the
same prompts also run through transformers' ``generate`` (padded batches of the same size).
The systems take turns within each repeat and the median is reported. Prints a table,
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.bench.provenance import source_digest
from dspark.datasets import humaneval_prompt, humaneval_tasks, sharegpt_split
from dspark.engine import LLM, EngineConfig, SamplingParams


@dataclass
class EngineBenchRow:
    system: str  # "dspark:<spec>" or "transformers"
    concurrency: int
    tok_s: float  # median over repeats
    tok_s_runs: list[float]
    acceptance_length: float | None = None
    verified_per_step: float | None = None


def prompts_for(dataset: str, count: int, llm: LLM, max_prompt_tokens: int) -> list[list[int]]:
    """Chat-templated prompt ids, shortest-first filtering of overlong ones."""
    if dataset == "sharegpt":  # held-out prompts: the shipped drafter never trained on them
        texts = [c.prompt for c in sharegpt_split("eval")]
    elif dataset == "humaneval":
        texts = [humaneval_prompt(t) for t in humaneval_tasks()]
    else:
        raise ValueError(f"unknown dataset {dataset!r}: use sharegpt or humaneval")
    prompts = []
    for text in texts:
        ids = llm.chat_prompt(text)
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == count:
            return prompts
    raise ValueError(f"only {len(prompts)} {dataset} prompts fit {max_prompt_tokens} tokens")


def run_dspark(
    llm: LLM, prompts: list[list[int]], max_tokens: int, repeats: int
) -> tuple[list[float], object]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    runs = []
    for _ in range(repeats):
        llm.engine.stats.__init__()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        runs.append(sum(len(o.token_ids) for o in outputs) / (time.perf_counter() - start))
    return runs, llm.engine.stats


def run_transformers(
    model, prompts: list[list[int]], batch_size: int, max_tokens: int, repeats: int, pad_id: int
) -> list[float]:
    """tok/s of transformers' generate over ``prompts`` in left-padded batches."""

    def padded(batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        return ids.to(model.device), mask.to(model.device)

    batches = [padded(prompts[i : i + batch_size]) for i in range(0, len(prompts), batch_size)]
    with torch.inference_mode():  # warm-up
        model.generate(
            batches[0][0][:2],
            attention_mask=batches[0][1][:2],
            max_new_tokens=4,
            pad_token_id=pad_id,
        )
    runs = []
    for _ in range(repeats):
        start, tokens = time.perf_counter(), 0
        for ids, mask in batches:
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=max_tokens,
                    min_new_tokens=max_tokens,
                    do_sample=False,
                    pad_token_id=pad_id,
                )
            tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
        runs.append(tokens / (time.perf_counter() - start))
    return runs


def _engine_for(base: LLM, spec: str, concurrency: int, args: argparse.Namespace) -> LLM:
    from dspark.engine.engine import LLMEngine

    config = EngineConfig(
        spec=spec,
        num_drafts=args.k,
        max_num_seqs=max(concurrency, 1),
        max_num_batched_tokens=max(512, concurrency * (args.k + 1)),
        kv_cache_tokens=max(4096, concurrency * (args.max_prompt_tokens + args.max_tokens + 16)),
        profile_path=str(args.out_dir / f"profile-{args.device}-{args.dtype}-{concurrency}.json"),
    )
    llm = LLM.__new__(LLM)
    llm.tokenizer = base.tokenizer
    llm.engine = LLMEngine(base.engine.loaded, config)
    return llm


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=["sharegpt", "humaneval"], default="sharegpt")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="prompts per run (default: as many as the concurrency)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument(
        "--spec", nargs="+", default=["none"], choices=["none", "fixed", "adaptive"]
    )
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf", action="store_true", help="also time transformers' generate")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--out-dir", type=Path, default=Path("results"))


def main(args: argparse.Namespace) -> None:
    dtype = getattr(torch, args.dtype)
    rows: list[EngineBenchRow] = []
    largest = max(args.num_prompts or 0, *args.concurrency)
    base = LLM(args.model, dtype=dtype, device=args.device, config=EngineConfig())
    prompts = prompts_for(args.dataset, largest, base, args.max_prompt_tokens)
    model = pad = None
    if args.hf:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(base.engine.loaded.path, dtype=dtype)
        model = model.to(args.device).eval()
        eos = base.engine.loaded.config.eos_token_ids
        pad = eos[0] if eos else 0
    for concurrency in tqdm(args.concurrency, desc="bench-engine", unit="level"):
        batch = prompts[: args.num_prompts or concurrency]
        systems = {
            f"dspark:{spec}": _engine_for(base, spec, concurrency, args) for spec in args.spec
        }
        runs: dict[str, list[float]] = {name: [] for name in systems}
        if model is not None:
            runs["transformers"] = []
        stats = {}
        # The systems take turns within each repeat, so drifts in machine speed hit all alike.
        for _ in range(args.repeats):
            for name, llm in systems.items():
                one, stats[name] = run_dspark(llm, batch, args.max_tokens, 1)
                runs[name] += one
            if model is not None:
                runs["transformers"] += run_transformers(
                    model, batch, concurrency, args.max_tokens, 1, pad
                )
        for name, values in runs.items():
            spec_stats = stats.get(name)
            speculates = spec_stats is not None and not name.endswith(":none")
            rows.append(
                EngineBenchRow(
                    name,
                    concurrency,
                    statistics.median(values),
                    values,
                    spec_stats.acceptance_length if speculates else None,
                    spec_stats.verified_per_step if speculates else None,
                )
            )
    print(f"{'system':18} {'conc':>4} {'tok/s':>8} {'runs':>24} {'tau':>5} {'verified':>8}")
    for row in rows:
        runs = ", ".join(f"{r:.1f}" for r in row.tok_s_runs)
        tau = f"{row.acceptance_length:.2f}" if row.acceptance_length is not None else "-"
        ver = f"{row.verified_per_step:.2f}" if row.verified_per_step is not None else "-"
        print(f"{row.system:18} {row.concurrency:4d} {row.tok_s:8.1f} {runs:>24} {tau:>5} {ver:>8}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"bench_engine_{args.dataset}_{args.device}.json"
    path.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "torch": torch.__version__,
                "source_digest": source_digest(),
                "threads": torch.get_num_threads(),
                "args": {k: str(v) for k, v in vars(args).items() if k != "handler"},
                "rows": [asdict(r) for r in rows],
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
