"""``dspark bench-engine``: the reference engine on real prompts, next to transformers.

For each concurrency level, ``concurrency`` prompts run together (greedy,
``--max-tokens`` new tokens each, EOS ignored so every request makes the same number of
tokens); tok/s counts generated tokens over wall time, prefill included. With ``--hf`` the
same prompts also run through transformers' ``generate`` on the same weights, in
left-padded batches of the same size: ``eager`` as it comes, ``static`` with a static KV
cache, ``compiled`` with a static cache and the decode forward under ``torch.compile``
(compiled before timing). The systems take turns within each repeat and the median is
reported, with each dspark setting's ratio to every transformers mode at the same level.
Prints a table, writes JSON and a PNG.
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


def prompts_for(
    dataset: str, count: int, llm: LLM, max_prompt_tokens: int, path: Path | None = None
) -> list[list[int]]:
    """Chat-templated prompt ids in order, leaving out overlong ones; ``path``: the
    tokenised splits of ``python -m dspark.train.data`` instead of the data packages."""
    if path is not None:
        from dspark.train.data import load_prompts

        pool = load_prompts(path)["eval" if dataset == "sharegpt" else "humaneval"]
        prompts = [p for p in pool if len(p) <= max_prompt_tokens][:count]
        if len(prompts) < count:
            raise ValueError(f"only {len(prompts)} prompts of {path} fit {max_prompt_tokens}")
        return prompts
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


HF_MODES = {
    "eager": "transformers",  # generate as it comes: a dynamic cache, eager forwards
    "static": "transformers:static",  # a static KV cache, eager forwards
    "compiled": "transformers:compiled",  # a static cache, decode forwards torch.compiled
}


class TransformersRun:
    """transformers' ``generate`` over prompts in left-padded batches, in one of
    ``HF_MODES``; ``compile_mode``: torch.compile's mode for "compiled"."""

    def __init__(self, model, mode: str, pad_id: int, compile_mode: str = "default") -> None:
        if mode not in HF_MODES:
            raise ValueError(f"unknown transformers mode {mode!r}; use one of {list(HF_MODES)}")
        self.model, self.mode, self.pad_id = model, mode, pad_id
        self.options: dict = {}
        if mode != "eager":
            self.options["cache_implementation"] = "static"
        if mode == "compiled":
            from transformers import CompileConfig

            config = CompileConfig(mode=compile_mode)
            # generate compiles on accelerators only unless told otherwise.
            config._compile_all_devices = model.device.type != "cuda"
            self.options["compile_config"] = config
        else:
            self.options["disable_compile"] = True

    def _padded(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        return ids.to(self.model.device), mask.to(self.model.device)

    def generate(self, batch: list[list[int]], max_tokens: int) -> torch.Tensor:
        ids, mask = self._padded(batch)
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=self.pad_id,
                **self.options,
            )
        return out[:, ids.shape[1] :]

    def tok_s(self, prompts: list[list[int]], batch_size: int, max_tokens: int) -> float:
        """Generated tokens per second over ``prompts`` in batches of ``batch_size``."""
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(prompts), batch_size):
            tokens += self.generate(prompts[i : i + batch_size], max_tokens).numel()
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        return tokens / (time.perf_counter() - start)


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


def peer_ratios(rows: list[EngineBenchRow]) -> dict[tuple[str, str, int], float]:
    """(dspark setting, transformers mode, concurrency) -> ratio of their median tok/s."""
    ratios = {}
    for ours in rows:
        if not ours.system.startswith("dspark"):
            continue
        for peer in rows:
            if peer.system.startswith("transformers") and peer.concurrency == ours.concurrency:
                ratios[(ours.system, peer.system, ours.concurrency)] = ours.tok_s / peer.tok_s
    return ratios


def plot_levels(rows: list[EngineBenchRow], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dspark.figures import save_figure

    systems = list(dict.fromkeys(r.system for r in rows))
    levels = sorted({r.concurrency for r in rows})
    width = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(levels) * len(systems) / 2), 4))
    for i, system in enumerate(systems):
        by_level = {r.concurrency: r for r in rows if r.system == system}
        xs = [j + i * width for j, level in enumerate(levels) if level in by_level]
        picked = [by_level[level] for level in levels if level in by_level]
        ax.bar(xs, [r.tok_s for r in picked], width, label=system)
        for x, r in zip(xs, picked, strict=True):  # the spread of the repeats
            ax.plot([x, x], [min(r.tok_s_runs), max(r.tok_s_runs)], color="black", lw=1)
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(levels))])
    ax.set_xticklabels([f"{level} request{'s' * (level != 1)}" for level in levels])
    ax.set_ylabel("generated tok/s (median; line: range of repeats)")
    ax.set_title(f"engine throughput ({title})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=["sharegpt", "humaneval"], default="sharegpt")
    parser.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="tokenised prompts (python -m dspark.train.data OUT.npz) for a machine "
        "without the data packages",
    )
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
    parser.add_argument(
        "--hf",
        nargs="+",
        default=[],
        choices=list(HF_MODES),
        help="also time transformers' generate: eager (a dynamic cache), static (a static "
        "cache) and/or compiled (a static cache and torch.compile)",
    )
    parser.add_argument(
        "--hf-compile-mode", default="default", help="torch.compile's mode for --hf compiled"
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--out-dir", type=Path, default=Path("results"))


def main(args: argparse.Namespace) -> None:
    dtype = getattr(torch, args.dtype)
    rows: list[EngineBenchRow] = []
    largest = max(args.num_prompts or 0, *args.concurrency)
    # Only its tokenizer and weights are used: a small cache.
    small = EngineConfig(max_num_seqs=1, kv_cache_tokens=4096)
    base = LLM(args.model, dtype=dtype, device=args.device, config=small)
    prompts = prompts_for(args.dataset, largest, base, args.max_prompt_tokens, args.prompts)
    peers: dict[str, TransformersRun] = {}
    if args.hf:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(base.engine.loaded.path, dtype=dtype)
        model = model.to(args.device).eval()
        eos = base.engine.loaded.config.eos_token_ids
        pad = eos[0] if eos else 0
        peers = {HF_MODES[m]: TransformersRun(model, m, pad, args.hf_compile_mode) for m in args.hf}
    for concurrency in tqdm(args.concurrency, desc="bench-engine", unit="level"):
        batch = prompts[: args.num_prompts or concurrency]
        systems = {
            f"dspark:{spec}": _engine_for(base, spec, concurrency, args) for spec in args.spec
        }
        runs: dict[str, list[float]] = {name: [] for name in [*systems, *peers]}
        for peer in peers.values():  # every batch's shape compiled (and its cache sized)
            for i in range(0, len(batch), concurrency):
                peer.generate(batch[i : i + concurrency], args.max_tokens)
        stats = {}
        # The systems take turns within each repeat, so drifts in machine speed hit all alike.
        for _ in range(args.repeats):
            for name, llm in systems.items():
                one, stats[name] = run_dspark(llm, batch, args.max_tokens, 1)
                runs[name] += one
            for name, peer in peers.items():
                runs[name].append(peer.tok_s(batch, concurrency, args.max_tokens))
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
    print(f"{'system':22} {'conc':>4} {'tok/s':>8} {'runs':>24} {'tau':>5} {'verified':>8}")
    for row in rows:
        runs = ", ".join(f"{r:.1f}" for r in row.tok_s_runs)
        tau = f"{row.acceptance_length:.2f}" if row.acceptance_length is not None else "-"
        ver = f"{row.verified_per_step:.2f}" if row.verified_per_step is not None else "-"
        print(f"{row.system:22} {row.concurrency:4d} {row.tok_s:8.1f} {runs:>24} {tau:>5} {ver:>8}")
    ratios = peer_ratios(rows)
    for (system, peer, concurrency), ratio in ratios.items():
        print(f"{system} / {peer} at {concurrency}: {ratio:.2f}x")
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
                "ratios": [
                    {"system": a, "peer": b, "concurrency": c, "ratio": r}
                    for (a, b, c), r in ratios.items()
                ],
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    plot_levels(rows, path.with_suffix(".png"), f"{args.dataset}, {args.device}, {args.dtype}")
