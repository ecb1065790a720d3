"""``dspark draft-vocab``: a frequency-ranked draft vocabulary for the drafter's LM head.

The drafter's Markov head samples its K positions one after another, and each one runs
the target's LM head; on a memory-bound CPU that head (V rows of d) is most of the
drafting cost. As in FR-Spec and EAGLE-3, drafting over the N most frequent tokens reads
N/V of it. Frequencies are counted with the target's tokenizer over the assistant
responses of the ShareGPT train split; the N kept ids always include the target's special
and stop tokens, and equal counts go to the lower id. They are written ascending as the
drafter directory's ``draft_vocab.npy`` (int32), with the size, the source and the
coverage (the share of the held-out eval split's response tokens inside the subset) under
``draft_vocab`` in its drafter.json metadata. A table of coverage and per-position LM-head
time for several sizes is printed first, so N can be chosen by measurement; without
--drafter nothing is written. With --engine-prompts the reference engine also decodes
held-out ShareGPT eval prompts (fixed K, greedy unless --engine-temperature) with the
whole vocabulary and with each size, one request at a time and interleaved, and reports
the acceptance length and the drafter's time per proposal.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

SOURCE = "ShareGPT train split, first assistant responses (dspark.datasets.sharegpt_split)"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter", default=None, help="drafter directory to write into")
    parser.add_argument("--size", type=int, default=8192, help="N: token ids to keep")
    parser.add_argument(
        "--compare",
        nargs="*",
        type=int,
        default=[2048, 4096, 8192, 16384],
        help="sizes to report coverage and LM-head time for",
    )
    parser.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=200, help="LM-head timing repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads to time")
    parser.add_argument(
        "--engine-prompts", type=int, default=0, help="eval prompts for the engine A/B (0: none)"
    )
    parser.add_argument("--engine-tokens", type=int, default=48, help="tokens per A/B prompt")
    parser.add_argument("--k", type=int, default=7, help="drafts per round in the A/B")
    parser.add_argument(
        "--engine-temperature", type=float, default=0.0, help="A/B sampling (0: greedy)"
    )


def tokenize(
    tokenizer, texts: Sequence[str], batch_size: int = 256, desc: str = "tokenize"
) -> Iterator[list[int]]:
    """Token ids of each text (no special tokens added), batched, with a progress bar."""
    bar = tqdm(total=len(texts), desc=desc, unit="text")
    for begin in range(0, len(texts), batch_size):
        batch = list(texts[begin : begin + batch_size])
        yield from tokenizer(batch, add_special_tokens=False)["input_ids"]
        bar.update(len(batch))
    bar.close()


def count_tokens(token_lists: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    """``[V]`` int64 occurrences of every token id."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in token_lists:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"the tokenizer produced ids outside the vocabulary of {vocab_size}")
        counts += np.bincount(ids, minlength=vocab_size)
    return counts


def select_draft_vocab(counts: np.ndarray, size: int, always: Iterable[int] = ()) -> np.ndarray:
    """The ``size`` ids to draft from, ascending (int32): every id of ``always``, then the
    most frequent of the others, equal counts going to the lower id."""
    vocab_size = len(counts)
    always = np.unique(np.asarray(list(always), dtype=np.int64))
    if not 0 < size <= vocab_size:
        raise ValueError(f"the draft vocabulary size must be in 1..{vocab_size}, got {size}")
    if always.size and (always[0] < 0 or always[-1] >= vocab_size):
        raise ValueError(f"special token ids {always.tolist()} fall outside 0..{vocab_size - 1}")
    if always.size > size:
        raise ValueError(f"{always.size} special tokens do not fit a draft vocabulary of {size}")
    ranked = np.lexsort((np.arange(vocab_size), -counts))  # by count, then by lower id
    others = ranked[~np.isin(ranked, always)][: size - always.size]
    return np.sort(np.concatenate([always, others])).astype(np.int32)


def coverage(counts: np.ndarray, ids: np.ndarray) -> float:
    """Share of the counted tokens whose id is in ``ids``."""
    total = counts.sum()
    return float(counts[ids].sum() / total) if total else 0.0


@torch.inference_mode()
def lm_head_ms(weight: torch.Tensor, sizes: Sequence[int], repeats: int) -> dict[int, float]:
    """Median ms of one draft position's LM head (``[1, d] @ [N, d]^T``, float32 out) over
    the first N rows of ``weight`` for each size N."""
    hidden = torch.randn(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    result = {}
    for size in sizes:
        rows = weight[:size].contiguous()
        for _ in range(max(3, repeats // 10)):  # warm-up
            F.linear(hidden, rows).float()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            F.linear(hidden, rows).float()
            times.append(time.perf_counter() - start)
        result[size] = 1000.0 * float(np.median(times))
    return result


def engine_ab(
    loaded,
    directory,
    vocabularies: dict[str, np.ndarray | None],
    prompts: Sequence[Sequence[int]],
    k: int,
    max_tokens: int,
    temperature: float = 0.0,
) -> dict[str, dict]:
    """Fixed-K decoding of ``prompts`` with the drafter in ``directory`` drafting from
    each vocabulary (None: the whole one), one request at a time, the variants interleaved
    prompt by prompt after one warm-up request each. Prompt i samples with seed i."""
    from dspark.engine.config import EngineConfig
    from dspark.engine.drafter import DSparkDrafter
    from dspark.engine.engine import LLMEngine
    from dspark.engine.sampling import SamplingParams
    from dspark.models.drafter import load_drafter

    room = max(len(p) for p in prompts) + max_tokens + 2 * (k + 16)
    config = EngineConfig(spec="fixed", num_drafts=k, max_num_seqs=1, kv_cache_tokens=room)
    engines = {}
    for name, ids in vocabularies.items():
        model = load_drafter(directory, loaded.model).set_draft_vocab(ids)
        drafter = DSparkDrafter(model, room + model.config.block_size + 16, config.block_size)
        engines[name] = LLMEngine(loaded, config, drafter=drafter)

    def decode(engine, prompt, seed: int) -> None:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        engine.add_request(list(prompt), params)
        while engine.has_unfinished():
            engine.step()

    for engine in engines.values():
        decode(engine, prompts[0], seed=len(prompts))
    start = {name: _snapshot(engine.stats) for name, engine in engines.items()}
    names = list(engines)
    for i, prompt in enumerate(tqdm(prompts, desc="engine A/B", unit="prompt")):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            decode(engines[name], prompt, seed=i)
    results = {}
    for name, engine in engines.items():
        rounds, accepted, drafts, forwards = start[name]
        stats = engine.stats
        num_rounds = stats.num_decode_rounds - rounds
        results[name] = {
            "tau": (stats.num_accepted - accepted) / num_rounds if num_rounds else 0.0,
            "rounds": num_rounds,
            "drafter_ms": float(np.median(list(stats.drafter_ms)[drafts:])),
            "forward_ms": float(np.median(list(stats.forward_ms)[forwards:])),
        }
    return results


def _snapshot(stats) -> tuple[int, int, int, int]:
    return (
        stats.num_decode_rounds,
        stats.num_accepted,
        len(stats.drafter_ms),
        len(stats.forward_ms),
    )


def build_report(size: int, ids: np.ndarray, train: np.ndarray, held_out: np.ndarray) -> dict:
    return {
        "size": int(size),
        "source": SOURCE,
        "tokenizer": "the target's",
        "train_tokens": int(train.sum()),
        "train_coverage": round(coverage(train, ids), 5),
        "eval_tokens": int(held_out.sum()),
        "coverage": round(coverage(held_out, ids), 5),  # eval split, assistant responses
    }


def main(args: argparse.Namespace) -> None:
    from dspark.datasets import sharegpt_split
    from dspark.models.drafter import read_drafter_config, write_draft_vocab
    from dspark.models.loader import load_model

    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.drafter is not None:
        read_drafter_config(args.drafter)  # fail now, not after tokenising
    loaded = load_model(args.model)
    vocab_size = loaded.config.vocab_size
    always = sorted(set(loaded.tokenizer.all_special_ids) | set(loaded.stop_token_ids))
    texts = {s: [c.response for c in sharegpt_split(s)] for s in ("train", "eval")}
    train = count_tokens(tokenize(loaded.tokenizer, texts["train"], desc="train"), vocab_size)
    held_out = count_tokens(tokenize(loaded.tokenizer, texts["eval"], desc="eval"), vocab_size)
    sizes = sorted({*args.compare, args.size, vocab_size})
    chosen = {n: select_draft_vocab(train, n, always) for n in sizes}
    timing = lm_head_ms(loaded.model.lm_head.weight, sizes, args.repeats)
    print(
        f"{len(texts['train'])} train responses ({int(train.sum())} tokens), "
        f"{len(texts['eval'])} eval responses ({int(held_out.sum())} tokens); "
        f"always kept: {always}; {torch.get_num_threads()} threads"
    )
    print(f"{'N':>7} {'eval coverage':>14} {'train coverage':>15} {'LM head ms':>11}")
    for n in sizes:
        print(
            f"{n:>7} {coverage(held_out, chosen[n]):>14.4f} {coverage(train, chosen[n]):>15.4f} "
            f"{timing[n]:>11.3f}"
        )
    if args.engine_prompts > 0:
        from dspark.engine.shipped import find_drafter
        from dspark.train.data import sharegpt_prompts

        directory = args.drafter or find_drafter(loaded.config, required=True)
        prompts = sharegpt_prompts(loaded.tokenizer, "eval", 256, args.engine_prompts)
        vocabularies = {"full": None} | {str(n): chosen[n] for n in sizes if n < vocab_size}
        results = engine_ab(
            loaded,
            directory,
            vocabularies,
            prompts,
            args.k,
            args.engine_tokens,
            args.engine_temperature,
        )
        print(
            f"engine A/B: {len(prompts)} eval prompts, {args.engine_tokens} tokens, "
            f"temperature {args.engine_temperature:g}, K={args.k}, one request at a time"
        )
        print(f"{'vocab':>7} {'tau':>6} {'rounds':>7} {'drafter ms':>11} {'forward ms':>11}")
        for name, r in results.items():
            print(
                f"{name:>7} {r['tau']:>6.3f} {r['rounds']:>7} {r['drafter_ms']:>11.2f} "
                f"{r['forward_ms']:>11.2f}"
            )
    if args.drafter is not None:
        report = build_report(args.size, chosen[args.size], train, held_out)
        path = write_draft_vocab(args.drafter, chosen[args.size], report)
        print(f"[dspark] wrote {path} (N={args.size}, eval coverage {report['coverage']:.4f})")
