"""The engine's DSpark drafter: batched sampling of draft tokens (a batch whose requests
sample with different parameters, against brute force)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark.engine.drafter import DSparkDrafter
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams
from tests.engine.test_draft_vocab import SUBSET, brute_force_drafts
from tests.models.test_drafter import features_for, random_drafter


def _requests(ids, anchors, params, seeds):
    requests = []
    for j, (anchor, p, seed) in enumerate(zip(anchors, params, seeds, strict=True)):
        generator = None if p.is_greedy else torch.Generator().manual_seed(seed)
        request = Request(f"r{j}", ids[:anchor], p, 0.0, generator=generator)
        request.output_ids = [ids[anchor]]
        request.num_computed = anchor
        requests.append(request)
    return requests


def _propose(drafter, features, ids, anchors, params, seeds):
    engine_drafter = DSparkDrafter(drafter, 1024, 4)
    requests = _requests(ids, anchors, params, seeds)
    for request, anchor in zip(requests, anchors, strict=True):
        engine_drafter.observe([request], [0], [anchor], features[:anchor])
    block = np.full(len(requests), drafter.config.block_size)
    return engine_drafter.propose(requests, block)


@pytest.fixture
def drafter(tmp_path):
    from tests.conftest import make_tiny_model

    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    return target, random_drafter(target)


def test_a_batch_with_mixed_sampling_parameters_drafts_each_row_from_its_own_distribution(
    drafter,
):
    """Two requests share (temperature 1), one samples with temperature, top-k and top-p,
    one is greedy: every sampled row's draft distributions are its own (brute force over
    the full logits, masked to the draft vocabulary), its tokens have mass under them,
    and each row draws the same tokens in the batch as alone (its own generator)."""
    target, model = drafter
    model.set_draft_vocab(SUBSET)
    ids = [int(x) for x in np.random.default_rng(4).integers(0, 256, size=30)]
    features = features_for(target, model, ids)
    warm = SamplingParams(temperature=1.0)
    narrow = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
    params = [warm, SamplingParams(temperature=0.0), narrow, warm]
    anchors, seeds = [5, 17, 11, 8], [0, 0, 1, 2]
    proposal = _propose(model, features, ids, anchors, params, seeds)
    for row, (anchor, p, seed) in enumerate(zip(anchors, params, seeds, strict=True)):
        tokens = proposal.tokens[row]
        if p.is_greedy:
            assert proposal.draft_probs[row] is None
            assert tokens == brute_force_drafts(model, features, ids, anchor, p)[0]
            continue
        probs = proposal.draft_probs[row]  # [K, V]
        _, expected = brute_force_drafts(model, features, ids, anchor, p, tokens)
        torch.testing.assert_close(probs, torch.stack(expected))
        assert (probs[torch.arange(len(tokens)), tokens] > 0).all()
        alone = _propose(model, features, ids, [anchor], [p], [seed])
        assert alone.tokens[0] == tokens
