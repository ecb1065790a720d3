"""The engine's DSpark drafter: batched sampling of draft tokens (the inverse-CDF draw,
and a batch whose requests sample with different parameters, against brute force)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dspark.engine.drafter import DSparkDrafter, inverse_cdf_draw
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams
from tests.engine.test_draft_vocab import SUBSET, brute_force_drafts
from tests.models.test_drafter import features_for, random_drafter


def test_inverse_cdf_draw_lands_on_the_column_whose_interval_holds_the_uniform():
    probs = torch.tensor([[0.25, 0.25, 0.0, 0.5], [0.0, 2.0, 0.0, 0.0], [0.0, 1.0, 3.0, 0.0]])
    below_one = 1.0 - 2.0**-24  # the largest float32 uniform
    cases = [
        (0, 0.0, 0),
        (0, 0.2499, 0),
        (0, 0.25, 1),  # a boundary belongs to the next column
        (0, 0.5, 3),  # column 2 has no mass: skipped
        (0, below_one, 3),
        (1, 0.0, 1),  # leading and trailing zero columns are never drawn
        (1, below_one, 1),
        (2, 0.2499, 1),
        (2, 0.25, 2),  # an unnormalised row (total 4) is scaled by its total
        (2, below_one, 2),
    ]
    for row, uniform, expected in cases:
        drawn = inverse_cdf_draw(probs[row : row + 1], torch.tensor([uniform]))
        assert drawn.tolist() == [expected], (row, uniform)
    together = inverse_cdf_draw(probs, torch.tensor([0.5, 0.3, 0.3]))
    assert together.tolist() == [3, 1, 2]


def test_inverse_cdf_draws_follow_the_distribution():
    probs = torch.tensor([0.1, 0.0, 0.35, 0.05, 0.0, 0.3, 0.2])
    draws = 40_000
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(3))
    picked = inverse_cdf_draw(probs.expand(draws, -1), uniforms).numpy()
    counts = np.bincount(picked, minlength=probs.shape[0])
    assert counts[1] == counts[4] == 0
    keep = probs.numpy() > 0
    assert stats.chisquare(counts[keep], probs.numpy()[keep] * draws).pvalue > 1e-3


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
