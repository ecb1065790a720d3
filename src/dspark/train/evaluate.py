"""``dspark eval-drafter``: acceptance of drafters in the engine, on held-out prompts.

For every drafter, dataset (held-out ShareGPT prompts, HumanEval) and temperature, the
reference engine decodes the prompts with a fixed K and reports the acceptance length τ
(tokens per round, the bonus included) and the conditional acceptance at each position
(of the rounds that verified position k with drafts 1..k-1 accepted, the share that
accepted draft k). For drafters with a confidence head it also reports the ECE of the
survival its (calibrated) confidences predict, on rounds that verified all K drafts.
Writes a table, JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.figures import save_figure
from dspark.models.loader import load_model, resolve_dtype
from dspark.train.calibration import ece, observed_survival
from dspark.train.data import humaneval_prompts, load_prompts, sharegpt_prompts


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a drafter to evaluate (repeatable); 'ngram' is always added",
    )
    parser.add_argument("--no-ngram", action="store_true", help="leave out the n-gram drafter")
    parser.add_argument("--datasets", nargs="+", default=["sharegpt", "humaneval"])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--num-prompts", type=int, default=200, help="per dataset (at most)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--out", default="eval-drafter", help="directory for JSON and PNG")
    parser.add_argument(
        "--prompts", default=None, help="tokenised prompt splits (python -m dspark.train.data)"
    )


def per_position(log: list, k: int) -> dict:
    """Conditional acceptance per position and, where confidences exist, survival ECE."""
    admitted = np.array([a for _, a, _ in log])
    accepted = np.array([n for _, _, n in log])
    tried = np.array([((admitted > i) & (accepted >= i)).sum() for i in range(k)])
    passed = np.array([((admitted > i) & (accepted > i)).sum() for i in range(k)])
    result = {
        "conditional_acceptance": [
            round(float(p / t), 4) if t else None for p, t in zip(passed, tried, strict=True)
        ],
        "tried": tried.tolist(),
    }
    full = [(c, n) for c, a, n in log if c is not None and a == k]
    if full:
        confidences = np.stack([c for c, _ in full])[:, :k].astype(np.float64)
        survival = np.cumprod(confidences, axis=1)
        observed = observed_survival(np.array([n for _, n in full]), k)
        result["survival_ece"] = [round(ece(survival[:, i], observed[:, i]), 4) for i in range(k)]
        result["survival_rounds"] = len(full)
    return result


def run_engine(
    loaded,
    drafter: str,
    prompts,
    temperature: float,
    k: int,
    concurrency: int,
    max_tokens: int,
    raw_confidences: bool = False,
) -> LLMEngine:
    """Decode ``prompts`` with a fixed K, logging every round (``engine.round_log``).
    ``raw_confidences``: the drafter's confidences without its calibration."""
    longest = max(len(p) for p in prompts)
    config = EngineConfig(
        spec="fixed",
        num_drafts=k,
        drafter=drafter,
        max_num_seqs=concurrency,
        max_num_batched_tokens=max(2048, concurrency * (k + 1)),
        kv_cache_tokens=concurrency * (longest + max_tokens + 64),
        seed=0,
    )
    engine = LLMEngine(loaded, config)
    model = getattr(engine.drafter, "model", None)
    if raw_confidences and model is not None:
        model.config = replace(model.config, calibration=())
    engine.round_log = []
    for i, prompt in enumerate(prompts):
        seed = None if not temperature else i
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    return engine


def full_rounds(engine: LLMEngine, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences ``[N, K]`` and accepted drafts ``[N]`` of the rounds that verified
    all K drafts."""
    full = [(c, n) for c, a, n in engine.round_log if c is not None and a == k]
    if not full:
        raise ValueError("no round verified all K drafts (does the drafter have confidences?)")
    return np.stack([c[:k] for c, _ in full]), np.array([n for _, n in full])


def evaluate(loaded, drafter: str, prompts, temperature: float, args) -> dict:
    start = time.perf_counter()
    engine = run_engine(
        loaded, drafter, prompts, temperature, args.k, args.concurrency, args.max_tokens
    )
    stats = engine.stats
    return {
        "tau": round(stats.acceptance_length, 4),
        "rounds": stats.num_decode_rounds,
        "generated": stats.num_generated,
        "seconds": round(time.perf_counter() - start, 2),
        **per_position(engine.round_log, args.k),
    }


def prompt_sets_for(tokenizer, args) -> dict[str, list[list[int]]]:
    """Held-out prompts per dataset (from --prompts when given)."""
    given = load_prompts(args.prompts) if args.prompts else {}
    given = {"sharegpt": given.get("eval"), "humaneval": given.get("humaneval")}
    prompt_sets = {}
    for dataset in args.datasets:
        if given.get(dataset):
            fitting = [p for p in given[dataset] if len(p) <= args.max_prompt_tokens]
            prompt_sets[dataset] = fitting[: args.num_prompts]
        elif dataset == "sharegpt":
            prompt_sets[dataset] = sharegpt_prompts(
                tokenizer, "eval", args.max_prompt_tokens, args.num_prompts
            )
        elif dataset == "humaneval":
            prompts = humaneval_prompts(tokenizer, args.max_prompt_tokens)
            prompt_sets[dataset] = prompts[: args.num_prompts]
        else:
            raise ValueError(f"unknown dataset {dataset!r}: use sharegpt or humaneval")
    return prompt_sets


def main(args: argparse.Namespace) -> None:
    dtype = resolve_dtype(args.dtype, args.device)
    loaded = load_model(args.model, dtype=dtype, device=args.device)
    drafters = {}
    for item in args.drafter:
        name, _, path = item.partition("=")
        if not path:
            raise ValueError(f"--drafter wants NAME=DIR, got {item!r}")
        drafters[name] = path
    if not args.no_ngram:
        drafters["ngram"] = "ngram"
    if not drafters:
        raise ValueError("nothing to evaluate: give --drafter NAME=DIR or drop --no-ngram")
    prompt_sets = prompt_sets_for(loaded.tokenizer, args)
    rows = []
    jobs = [(n, d, t) for n in drafters for d in prompt_sets for t in args.temperatures]
    for name, dataset, temperature in tqdm(jobs, desc="eval-drafter"):
        result = evaluate(loaded, drafters[name], prompt_sets[dataset], temperature, args)
        rows.append({"drafter": name, "dataset": dataset, "temperature": temperature, **result})
        tqdm.write(
            f"{name:>8} {dataset:>9} T={temperature:g}: tau {result['tau']:.3f}  "
            f"per-position {result['conditional_acceptance']}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    payload = {
        "k": args.k,
        "max_tokens": args.max_tokens,
        "device": device,
        "dtype": str(dtype),
        "prompts": {d: len(p) for d, p in prompt_sets.items()},
        "drafters": drafters,
        "rows": rows,
    }
    (out / "eval_drafter.json").write_text(json.dumps(payload, indent=1))
    plot(rows, out / "eval_drafter.png", args.k)
    print(f"\n{'drafter':>8} {'dataset':>9} {'T':>3} {'tau':>6}  conditional acceptance")
    for r in rows:
        print(
            f"{r['drafter']:>8} {r['dataset']:>9} {r['temperature']:>3g} {r['tau']:>6.3f}  "
            f"{r['conditional_acceptance']}"
        )
    print(f"[dspark] wrote {out}/eval_drafter.json and .png ({device}, {dtype})")


def plot(rows: list[dict], path: Path, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({(r["dataset"], r["temperature"]) for r in rows})
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(drafters)
    for j, name in enumerate(drafters):
        tau = {(r["dataset"], r["temperature"]): r["tau"] for r in rows if r["drafter"] == name}
        taus = [tau.get(s, 0.0) for s in settings]
        left.bar(np.arange(len(settings)) + j * width, taus, width, label=name)
    left.set_xticks(np.arange(len(settings)) + 0.4 - width / 2)
    left.set_xticklabels([f"{d}\nT={t:g}" for d, t in settings])
    left.set_ylabel(f"acceptance length τ (K={k})")
    left.legend()
    for r in rows:
        if r["temperature"] == 0.0:
            rates = [np.nan if x is None else x for x in r["conditional_acceptance"]]
            right.plot(range(1, k + 1), rates, marker="o", label=f"{r['drafter']} {r['dataset']}")
    right.set_xlabel("draft position")
    right.set_ylabel("conditional acceptance (T=0)")
    right.set_ylim(0, 1)
    right.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
