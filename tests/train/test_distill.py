"""Distillation data made by the engine: each turn's context is the conversation with the
target's own earlier answers, each answer is what the engine decodes for that context, and
a conversation ends where its context would grow too long."""

from __future__ import annotations

import numpy as np
import pytest

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.llm import conversation_ids
from dspark.engine.sampling import SamplingParams
from dspark.train.data import DistillSet
from dspark.train.distill import (
    DistillConfig,
    distill,
    merge_shards,
    pack_user_turns,
    read_user_turns,
)

DIALOGUES = [("Name a colour.", "And another one?"), ("Say hi.",), ("Count to three.", "Why?")]


@pytest.fixture(scope="module")
def loaded(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def engine(loaded):
    return LLMEngine(loaded, EngineConfig(max_num_seqs=4, max_model_len=512, kv_cache_tokens=4096))


def decode_alone(engine, ids, max_tokens):
    request = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    while not request.is_finished:
        engine.step()
    engine.requests.pop(request.request_id)
    return request


def test_every_turn_answered_in_the_context_of_its_own_answers(engine):
    result = distill(engine, DIALOGUES, DistillConfig(max_new_tokens=12, sampled_share=0.0))
    assert result.turns_answered == 5 and result.turns_dropped == 0
    assert not result.sampled.any()
    answers = {
        tuple(s[:n].tolist()): s[n:].tolist()
        for s, n in zip(result.data.sequences, result.data.prompt_lengths, strict=True)
    }
    assert len(answers) == 5
    for turns in DIALOGUES:
        messages = []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            ids = conversation_ids(engine.tokenizer, messages)
            answer = answers[tuple(ids)]
            request = decode_alone(engine, ids, 12)
            expected = request.output_ids + ([request.stop_token] if request.stop_token else [])
            assert answer == expected
            messages.append({"role": "assistant", "content": request.text})
    assert not engine.has_unfinished() and not engine.requests


def test_sampled_conversations_and_long_contexts_end_a_conversation(engine):
    config = DistillConfig(max_new_tokens=10, sampled_share=1.0, max_context=40, seed=3)
    sampled = distill(engine, DIALOGUES, config)
    greedy = distill(
        engine, DIALOGUES, DistillConfig(max_new_tokens=10, max_context=40, sampled_share=0.0)
    )
    assert sampled.sampled.all() and not greedy.sampled.any()
    assert [s.tolist() for s in sampled.data.sequences] != [
        s.tolist() for s in greedy.data.sequences
    ]
    assert all(n <= 40 for n in sampled.data.prompt_lengths)
    assert sampled.turns_answered + sampled.turns_dropped == 5 and sampled.turns_dropped >= 1


def test_packed_turns_round_trip_and_uint16_storage(tmp_path):
    pack_user_turns(tmp_path / "turns.json.xz", DIALOGUES)
    assert read_user_turns(tmp_path / "turns.json.xz") == DIALOGUES
    data = DistillSet([np.array([1, 65535, 7], np.int32)], np.array([1]))
    data.save(tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as raw:
        assert raw["flat"].dtype == np.uint16
    back = DistillSet.load(tmp_path / "d.npz")
    assert back.sequences[0].tolist() == [1, 65535, 7] and back.sequences[0].dtype == np.int32


def test_shards_that_skip_earlier_conversations_merge_into_the_whole_run(loaded, tmp_path):
    # One request at a time: every answer is then computed over the same rows in the whole
    # run and in a shard (batched rows may take another CPU kernel, and differ in the last
    # bits, which can move a sampled token).
    engine = LLMEngine(
        loaded, EngineConfig(max_num_seqs=1, max_model_len=512, kv_cache_tokens=1024)
    )
    config = DistillConfig(max_new_tokens=8, sampled_share=0.5, seed=1)
    whole = distill(engine, DIALOGUES, config)
    for name, skip, dialogues in (("a", 0, DIALOGUES[:1]), ("b", 1, DIALOGUES)):
        shard = distill(engine, dialogues, config, skip=skip)
        (tmp_path / name).mkdir()
        shard.data.save(tmp_path / name / "train.npz")
        np.save(tmp_path / name / "train.sampled.npy", shard.sampled)
    merged = merge_shards(tmp_path / "merged", [tmp_path / "a", tmp_path / "b"])

    def rows(data, sampled):
        return sorted(
            (s.tolist(), int(n), bool(m))
            for s, n, m in zip(data.sequences, data.prompt_lengths, sampled, strict=True)
        )

    again = DistillSet.load(tmp_path / "merged" / "train.npz")
    sampled = np.load(tmp_path / "merged" / "train.sampled.npy")
    assert rows(again, sampled) == rows(whole.data, whole.sampled)
    assert len(merged) == len(whole.data)
