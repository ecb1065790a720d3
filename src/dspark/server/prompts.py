"""Prompt token ids for the server: the chat template, special tokens, the context check.

Content that users send in chat messages is text: a ``<|im_start|>`` typed into a message
is tokenized as those characters, never as the control token, so no one can forge a
system or assistant turn. The chat template's own markup keeps its special tokens. A raw
completions prompt is the caller's whole input and keeps special-token parsing.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from dspark.server.errors import ApiError


class PromptEncoder:
    """Token ids of completion prompts and chat messages, refused (400) beyond the context.

    Runs off the event loop (the tokenizer releases the GIL while it works); a prompt too
    long to fit however it tokenizes is refused before any tokenizing.
    """

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        # No token covers more characters than its longest vocabulary entry has bytes, so
        # a text longer than this cannot fit the context (byte-level vocabularies).
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        longest = max((len(token.encode()) for token in vocab), default=0)
        self.max_prompt_chars = (max_model_len - 1) * longest if longest else None
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self.markers = tuple(added)

    def completion(self, prompt: str) -> list[int]:
        self._check_size(len(prompt), "prompt")
        return self._check_fit(self.tokenizer.encode(prompt), "prompt")

    def chat(self, messages: list[dict]) -> list[int]:
        self._check_size(sum(len(m["content"]) for m in messages), "messages")
        return self._check_fit(chat_prompt_ids(self.tokenizer, messages, self.markers), "messages")

    def _check_size(self, num_chars: int, param: str) -> None:
        if self.max_prompt_chars is not None and num_chars > self.max_prompt_chars:
            raise ApiError(
                400,
                f"the {param} has {num_chars} characters, more than the context of "
                f"{self.max_model_len} tokens can hold",
                param=param,
                code="context_length_exceeded",
            )

    def _check_fit(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise ApiError(400, "the prompt is empty", param=param)
        if len(ids) >= self.max_model_len:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; the context holds {self.max_model_len} "
                "(prompt plus at least one generated token)",
                param=param,
                code="context_length_exceeded",
            )
        return ids


def chat_prompt_ids(tokenizer: Any, messages: list[dict], markers: tuple[str, ...]) -> list[int]:
    """Ids of ``messages`` under the tokenizer's chat template, with a generation prompt:
    the template's markup is tokenized with special tokens, each message's content as
    plain text (its ``<|im_end|>`` stays characters). ``markers``: the added tokens'
    strings; content without any tokenizes with the template in one piece, as before."""
    if not any(marker in m["content"] for m in messages for marker in markers):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    # The template renders placeholders (unguessable per call) in place of the contents,
    # so the markup around them can be told apart from what users wrote.
    tag = secrets.token_hex(8)
    holders = [{**m, "content": f"\x00{tag}:{i}\x00"} for i, m in enumerate(messages)]
    text = tokenizer.apply_chat_template(holders, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    for k, piece in enumerate(re.split(f"\x00{tag}:(\\d+)\x00", text)):
        if k % 2 == 1:  # a placeholder's index
            content = messages[int(piece)]["content"]
            ids += tokenizer.encode(content, add_special_tokens=False, split_special_tokens=True)
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids
