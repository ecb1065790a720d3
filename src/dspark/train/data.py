"""Self-distillation data: the target's own greedy answers to ShareGPT prompts.

Prompts are the first user turns of the ShareGPT split (``dspark.datasets.sharegpt_split``)
under the model's chat template. Answers come from ``generate_greedy``: a padded batch
decoder over the target's weights (``LlamaModel.forward_dense``) that keeps a dense cache
per batch, so a GPU generates answers in large batches. It produces exactly the
engine's greedy tokens (a test checks it in fp32 on CPU).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.engine.llm import chat_ids
from dspark.models.llama import LlamaModel


def sharegpt_prompts(
    tokenizer, split: str, max_prompt_tokens: int, limit: int | None = None
) -> list[list[int]]:
    """Chat-templated first user turns of a ShareGPT split, dropping overlong ones."""
    from dspark.datasets import sharegpt_split

    prompts = []
    for conversation in sharegpt_split(split):
        ids = chat_ids(tokenizer, conversation.prompt[: max_prompt_tokens * 8])
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
            if limit is not None and len(prompts) == limit:
                break
    return prompts


def humaneval_prompts(tokenizer, max_prompt_tokens: int = 1024) -> list[list[int]]:
    from dspark.datasets import humaneval_prompt, humaneval_tasks

    prompts = [chat_ids(tokenizer, humaneval_prompt(t)) for t in humaneval_tasks()]
    return [p for p in prompts if len(p) <= max_prompt_tokens]


@torch.inference_mode()
def generate_greedy(
    model: LlamaModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    batch_size: int = 256,
    progress: bool = False,
) -> list[list[int]]:
    """Greedy answers (ending with the stop token when one came) for each prompt."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt is empty")
    device = next(model.parameters()).device
    order = np.argsort([len(p) for p in prompts], kind="stable")  # similar lengths together
    answers: list[list[int]] = [[] for _ in prompts]
    stops = torch.tensor(sorted(stop_ids) or [-1], device=device)
    bar = tqdm(total=len(prompts), desc="generate", unit="prompt", disable=not progress)
    for begin in range(0, len(prompts), batch_size):
        members = order[begin : begin + batch_size]
        batch = [list(prompts[i]) for i in members]
        outputs = _generate_batch(model, batch, max_new_tokens, stops)
        for i, tokens in zip(members, outputs, strict=True):
            answers[i] = tokens
        bar.update(len(members))
    bar.close()
    return answers


def _generate_batch(model, prompts, max_new_tokens, stops) -> list[list[int]]:
    device = stops.device
    config = model.config
    size, width = len(prompts), max(len(p) for p in prompts)
    total = width + max_new_tokens
    pad = torch.tensor([width - len(p) for p in prompts], device=device)  # left padding
    ids = torch.zeros((size, width), dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, device=device)
    columns = torch.arange(total, device=device)
    key_ok = columns[None, :] >= pad[:, None]  # [B, total]: real tokens only
    dtype = next(model.parameters()).dtype
    shape = (size, total, config.num_kv_heads, config.head_dim)
    cache = [
        tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(2))
        for _ in range(config.num_layers)
    ]
    causal = columns[:width, None] >= columns[None, :width]
    mask = causal[None] & key_ok[:, None, :width]
    mask |= torch.eye(width, dtype=torch.bool, device=device)[None]  # padding sees itself
    positions = (columns[None, :width] - pad[:, None]).clamp_min(0)
    hidden, _ = model.forward_dense(ids, positions, mask[:, None], cache=cache, cache_start=0)
    token = model.logits(hidden[:, -1]).argmax(-1)
    out = torch.zeros((size, max_new_tokens), dtype=torch.long, device=device)
    done = torch.zeros(size, dtype=torch.bool, device=device)
    lengths = torch.full((size,), max_new_tokens, device=device)
    for step in range(max_new_tokens):
        out[:, step] = token
        stopped = torch.isin(token, stops) & ~done
        lengths = torch.where(stopped, step + 1, lengths)
        done |= stopped
        if step == max_new_tokens - 1 or (step % 16 == 15 and bool(done.all())):
            break
        column = width + step
        mask = key_ok[:, None, None, : column + 1]
        position = (column - pad)[:, None]
        hidden, _ = model.forward_dense(
            token[:, None], position, mask, cache=cache, cache_start=column
        )
        token = model.logits(hidden[:, -1]).argmax(-1)
    out, lengths = out.tolist(), lengths.tolist()
    return [row[:n] for row, n in zip(out, lengths, strict=True)]


@dataclass
class DistillSet:
    """Token sequences (prompt + the target's answer) and where each answer starts."""

    sequences: list[np.ndarray]
    prompt_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.sequences)

    @classmethod
    def build(cls, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]):
        keep = [i for i, a in enumerate(answers) if len(a) >= 2]
        return cls(
            [np.array(list(prompts[i]) + list(answers[i]), dtype=np.int32) for i in keep],
            np.array([len(prompts[i]) for i in keep], dtype=np.int64),
        )

    @property
    def num_answer_tokens(self) -> int:
        return int(sum(len(s) for s in self.sequences) - self.prompt_lengths.sum())

    def save(self, path: str | Path) -> None:
        """Compressed; ids as uint16 when they fit (half the bytes to carry)."""
        lengths = np.array([len(s) for s in self.sequences], dtype=np.int64)
        flat = np.concatenate(self.sequences) if self.sequences else np.zeros(0, np.int32)
        if flat.size and 0 <= flat.min() and flat.max() < 2**16:
            flat = flat.astype(np.uint16)
        np.savez_compressed(path, flat=flat, lengths=lengths, prompt_lengths=self.prompt_lengths)

    @classmethod
    def load(cls, path: str | Path) -> DistillSet:
        with np.load(path) as data:
            flat, lengths = data["flat"], data["lengths"]
            prompt_lengths = data["prompt_lengths"]
        flat = flat.astype(np.int32)
        bounds = np.concatenate(([0], np.cumsum(lengths)))
        sequences = [flat[a:b] for a, b in itertools.pairwise(bounds)]
        return cls(sequences, prompt_lengths)


def save_prompts(path: str | Path, splits: dict[str, list[list[int]]]) -> None:
    """Tokenised prompts per split in one .npz (for machines without the data packages)."""
    arrays = {}
    for split, prompts in splits.items():
        arrays[f"{split}_lengths"] = np.array([len(p) for p in prompts], dtype=np.int64)
        arrays[f"{split}_flat"] = np.array([t for p in prompts for t in p], dtype=np.int32)
    np.savez_compressed(path, **arrays)


def load_prompts(path: str | Path) -> dict[str, list[list[int]]]:
    with np.load(path) as data:
        splits = {}
        for key in data.files:
            if key.endswith("_lengths"):
                split = key.removesuffix("_lengths")
                flat = data[f"{split}_flat"]
                bounds = np.concatenate(([0], np.cumsum(data[key])))
                splits[split] = [flat[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    return splits


def main() -> None:
    """``python -m dspark.train.data OUT.npz``: tokenise the prompt splits of the default
    model (ShareGPT train/calib/eval and HumanEval) for a machine that lacks the data
    packages; pass the file to train-drafter and eval-drafter with --prompts."""
    import argparse

    from dspark.models.loader import load_model

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out")
    parser.add_argument("--model", default=None)
    parser.add_argument("--train", type=int, default=8000)
    parser.add_argument("--heldout", type=int, default=400)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    args = parser.parse_args()
    tokenizer = load_model(args.model).tokenizer
    splits = {
        "train": sharegpt_prompts(tokenizer, "train", args.max_prompt_tokens, args.train),
        "calib": sharegpt_prompts(tokenizer, "calib", args.max_prompt_tokens, args.heldout),
        "eval": sharegpt_prompts(tokenizer, "eval", args.max_prompt_tokens, args.heldout),
        "humaneval": humaneval_prompts(tokenizer),
    }
    save_prompts(args.out, splits)
    print({k: len(v) for k, v in splits.items()})


if __name__ == "__main__":
    main()
