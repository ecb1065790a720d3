"""The reduced draft vocabulary: the builder's ranking, drafting over the subset (greedy
and sampled) against brute force over the full logits, and lossless greedy speculation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark.engine.drafter import DSparkDrafter
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams, target_probs
from dspark.models.drafter import (
    DRAFT_VOCAB_FILE,
    load_drafter,
    read_drafter_config,
    save_drafter,
    write_draft_vocab,
)
from dspark.train.draft_vocab import count_tokens, coverage, select_draft_vocab
from tests.conftest import make_tiny_model
from tests.engine.test_engine import repetitive_prompts, run
from tests.models.test_drafter import features_for, random_drafter

SUBSET = np.sort(np.random.default_rng(7).choice(260, size=64, replace=False))


WORD_IDS = {"a": 3, "b": 4, "c": 5, "d": 6, "e": 7, "f": 8}


class WordTokenizer:
    """Whitespace words to fixed ids, called like a transformers tokenizer."""

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [[WORD_IDS[w] for w in t.split()] for t in texts]}


@pytest.fixture
def setup(tmp_path):
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    return target, random_drafter(target)


def brute_force_drafts(drafter, features, ids, anchor, params, sampled=None):
    """Drafts (and their distributions over V) from the full logits of the training path,
    everything outside ``SUBSET`` masked. The Markov head is fed each draft in turn: the
    argmax when greedy, else the given ``sampled`` tokens."""
    outside = torch.ones(drafter.config.vocab_size, dtype=torch.bool)
    outside[torch.from_numpy(SUBSET)] = False
    with torch.no_grad():
        hidden = drafter.forward_train(
            features[None], torch.tensor([ids]), torch.tensor([[anchor]])
        )[0, 0]
        previous = torch.tensor([ids[anchor]])
        tokens, probs = [], []
        for k in range(drafter.config.block_size):
            logits, _ = drafter.heads(hidden[k : k + 1], previous)
            logits = logits.masked_fill(outside, float("-inf"))
            if params.is_greedy:
                previous = logits.argmax(-1)
            else:
                probs.append(target_probs(logits, params)[0])
                previous = torch.tensor([sampled[k]])
            tokens.append(int(previous))
    return tokens, probs


def request_for(ids, computed, params, seed=0) -> Request:
    generator = None if params.is_greedy else torch.Generator().manual_seed(seed)
    request = Request("r", ids[:computed], params, 0.0, generator=generator)
    request.output_ids = [ids[computed]]
    request.num_computed = computed
    return request


def propose(drafter, features, ids, anchor, params, seed=0, use_draft_vocab=True):
    engine_drafter = DSparkDrafter(drafter, 256, 4, use_draft_vocab=use_draft_vocab)
    request = request_for(ids, anchor, params, seed)
    engine_drafter.observe([request], [0], [anchor], features[:anchor])
    return engine_drafter.propose([request], np.array([drafter.config.block_size]))


# ---- the builder -----------------------------------------------------------------------


def test_selection_keeps_specials_and_breaks_ties_by_lower_id():
    tokenizer = WordTokenizer()
    train = ["f c a", "a c f", "e d b", "b"]  # a b c f: 2 each; d e: 1 each
    counts = count_tokens(tokenizer(train)["input_ids"], 10)
    assert counts.tolist() == [0, 0, 0, 2, 2, 2, 1, 1, 2, 0]
    assert select_draft_vocab(counts, 5, always=[2, 0]).tolist() == [0, 2, 3, 4, 5]
    assert select_draft_vocab(counts, 7, always=[0, 2]).tolist() == [0, 2, 3, 4, 5, 6, 8]
    assert select_draft_vocab(counts, 4, always=[4, 0]).tolist() == [0, 3, 4, 5]
    assert select_draft_vocab(counts, 8, always=[]).tolist() == [0, 1, 3, 4, 5, 6, 7, 8]
    reordered = count_tokens(tokenizer(train[::-1])["input_ids"], 10)
    chosen = select_draft_vocab(reordered, 5, always=[0, 2])
    assert chosen.dtype == np.int32 and chosen.tolist() == [0, 2, 3, 4, 5]
    held_out = count_tokens(tokenizer(["a d d e"])["input_ids"], 10)
    assert coverage(held_out, chosen) == 0.25
    with pytest.raises(ValueError, match="do not fit"):
        select_draft_vocab(counts, 2, always=[0, 1, 2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        count_tokens([[3, 12]], 10)


def test_draft_vocab_file_round_trip_and_validation(setup, tmp_path):
    target, drafter = setup
    directory = save_drafter(drafter, tmp_path / "d")
    assert load_drafter(directory, target.model).draft_vocab is None
    write_draft_vocab(directory, SUBSET, {"size": len(SUBSET)})
    assert np.load(directory / DRAFT_VOCAB_FILE).dtype == np.int32
    assert read_drafter_config(directory)[1]["draft_vocab"] == {"size": len(SUBSET)}
    loaded = load_drafter(directory, target.model, dtype=torch.float32)
    assert loaded.draft_vocab.tolist() == SUBSET.tolist()
    assert DSparkDrafter(loaded, 256, 4, use_draft_vocab=False).vocab_ids is None
    with pytest.raises(ValueError, match="ascending"):
        write_draft_vocab(directory, SUBSET[::-1], {})
    with pytest.raises(ValueError, match="ascending"):
        drafter.set_draft_vocab(np.array([3, 260]))


# ---- drafting over the subset ------------------------------------------------------------


def test_greedy_drafts_are_the_argmax_over_the_subset(setup):
    target, drafter = setup
    drafter.set_draft_vocab(SUBSET)
    ids = [int(x) for x in np.random.default_rng(3).integers(0, 256, size=30)]
    features = features_for(target, drafter, ids)
    greedy = SamplingParams(temperature=0.0)
    for anchor in (1, 7, 20):
        reduced = propose(drafter, features, ids, anchor, greedy)
        full = propose(drafter, features, ids, anchor, greedy, use_draft_vocab=False)
        expected, _ = brute_force_drafts(drafter, features, ids, anchor, greedy)
        assert reduced.tokens[0] == expected
        assert np.isin(expected, SUBSET).all() and not np.isin(full.tokens[0], SUBSET).all()


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9)],
)
def test_sampled_draft_probabilities_cover_the_subset_only(setup, params):
    target, drafter = setup
    drafter.set_draft_vocab(SUBSET)
    ids = [int(x) for x in np.random.default_rng(4).integers(0, 256, size=30)]
    features = features_for(target, drafter, ids)
    for anchor, seed in ((5, 0), (17, 1)):
        proposal = propose(drafter, features, ids, anchor, params, seed)
        probs = proposal.draft_probs[0]  # [K, V]
        assert probs.shape == (drafter.config.block_size, drafter.config.vocab_size)
        torch.testing.assert_close(probs.sum(-1), torch.ones(len(probs)))
        outside = np.setdiff1d(np.arange(drafter.config.vocab_size), SUBSET)
        assert (probs[:, outside] == 0).all()
        tokens = proposal.tokens[0]
        assert (probs[torch.arange(len(tokens)), tokens] > 0).all()
        _, expected = brute_force_drafts(drafter, features, ids, anchor, params, tokens)
        torch.testing.assert_close(probs, torch.stack(expected))


# ---- in the engine -----------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["fixed", "adaptive"])
def test_greedy_speculation_with_a_draft_vocab_equals_plain_greedy(tmp_path, spec):
    from tests.engine.test_engine import RandomCost

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    directory = save_drafter(random_drafter(target, block_size=5), tmp_path / "d")
    write_draft_vocab(directory, SUBSET, {"size": len(SUBSET)})
    prompts = repetitive_prompts(10)
    plain, _ = run(target, prompts)
    cost = RandomCost(0) if spec == "adaptive" else None
    out, engine = run(
        target, prompts, spec=spec, num_drafts=5, cost_model=cost, drafter=str(directory)
    )
    assert engine.drafter.vocab_ids.tolist() == SUBSET.tolist()
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    assert engine.stats.num_verified > engine.stats.num_decode_rounds
