"""The DSpark drafter: masking, the dense (training) and paged (engine) paths agree,
rollback of its context cache, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark.engine.drafter import DSparkDrafter
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams
from dspark.models.drafter import (
    DrafterConfig,
    DraftModel,
    default_capture_layers,
    load_drafter,
    save_drafter,
)
from tests.conftest import make_tiny_model


def random_drafter(target, seed: int = 1, **overrides) -> DraftModel:
    config = DrafterConfig.for_target(
        target.config,
        **{
            "num_layers": 2,
            "intermediate_size": 96,
            "block_size": 4,
            "markov_rank": 8,
            **overrides,
        },
    )
    torch.manual_seed(seed)
    model = DraftModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.2)
    return model.eval().attach(target.model)


@pytest.fixture
def setup(tmp_path):
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target)
    assert drafter.config.capture_layers == (0,)  # 3 target layers: never the last
    return target, drafter


def features_for(target, drafter, ids):
    tokens = torch.tensor([ids])
    with torch.no_grad():
        _, captured = target.model.forward_dense(
            tokens, torch.arange(len(ids)), None, capture_layers=drafter.config.capture_layers
        )
    return torch.cat(captured, dim=-1)[0]


def dense_greedy(drafter, features, ids, anchor):
    """Greedy drafts and confidences from the training path for one anchor."""
    with torch.no_grad():
        hidden = drafter.forward_train(
            features[None], torch.tensor([ids]), torch.tensor([[anchor]])
        )[0, 0]
        previous = torch.tensor([ids[anchor]])
        tokens, confs = [], []
        for k in range(drafter.config.block_size):
            logits, conf = drafter.heads(hidden[k : k + 1], previous)
            previous = logits.argmax(-1)
            tokens.append(int(previous))
            confs.append(float(torch.sigmoid(conf)))
    return tokens, confs


def request_for(ids, computed) -> Request:
    request = Request("r", ids[:computed], SamplingParams(temperature=0.0), 0.0)
    request.output_ids = [ids[computed]]
    request.prompt_ids = ids[:computed]
    request.num_computed = computed
    return request


def test_capture_layers_are_spread_and_never_the_last():
    assert default_capture_layers(30) == (1, 8, 14, 21, 27)
    assert default_capture_layers(2) == (0,)
    for depth in range(2, 64):
        layers = default_capture_layers(depth)
        assert max(layers) <= depth - 2 and len(layers) == min(5, len(set(layers)))
    with pytest.raises(ValueError, match="capture_layers"):
        DrafterConfig.for_target(make_config(), capture_layers=(3,))


def make_config():
    from dspark.models.config import ModelConfig

    return ModelConfig(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=8,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
    )


def test_block_sees_only_the_context_before_its_anchor(setup):
    target, drafter = setup
    ids = list(range(40, 60))
    features = features_for(target, drafter, ids)
    anchor = 9
    with torch.no_grad():
        base = drafter.forward_train(features[None], torch.tensor([ids]), torch.tensor([[anchor]]))
        later = features.clone()
        later[anchor:] += 3.0  # the anchor's own and later positions: invisible
        same = drafter.forward_train(later[None], torch.tensor([ids]), torch.tensor([[anchor]]))
        earlier = features.clone()
        earlier[anchor - 1] += 3.0
        moved = drafter.forward_train(earlier[None], torch.tensor([ids]), torch.tensor([[anchor]]))
        changed_tail = list(ids)
        changed_tail[anchor + 1] = 7  # a token after the anchor: not an input either
        tail = drafter.forward_train(
            features[None], torch.tensor([changed_tail]), torch.tensor([[anchor]])
        )
    torch.testing.assert_close(same, base)
    torch.testing.assert_close(tail, base)
    assert (moved - base).abs().max() > 1e-3


def test_anchors_of_one_sequence_do_not_see_each_other(setup):
    target, drafter = setup
    ids = list(range(60, 90))
    features = features_for(target, drafter, ids)
    with torch.no_grad():
        both = drafter.forward_train(features[None], torch.tensor([ids]), torch.tensor([[5, 17]]))
        alone = drafter.forward_train(features[None], torch.tensor([ids]), torch.tensor([[17]]))
    torch.testing.assert_close(both[:, 1], alone[:, 0])


def test_paged_engine_path_matches_the_training_path(setup):
    target, drafter = setup
    ids = [int(x) for x in np.random.default_rng(3).integers(0, 256, size=30)]
    features = features_for(target, drafter, ids)
    engine_drafter = DSparkDrafter(drafter, num_rows=256, block_size=4)
    for anchor in (1, 7, 20):
        request = request_for(ids, anchor)
        engine_drafter.on_finished(request)
        engine_drafter.observe([request], [0], [anchor], features[:anchor])
        proposal = engine_drafter.propose([request], np.array([4]))
        tokens, confs = dense_greedy(drafter, features, ids, anchor)
        assert proposal.tokens[0] == tokens
        np.testing.assert_allclose(proposal.confidences[0], confs, rtol=1e-4, atol=1e-5)


def test_rollback_after_partial_acceptance(setup):
    target, drafter = setup
    ids = [int(x) for x in np.random.default_rng(4).integers(0, 256, size=30)]
    features = features_for(target, drafter, ids)
    wrong = features + torch.randn_like(features)  # what rejected drafts would have left
    rolled = DSparkDrafter(drafter, num_rows=256, block_size=4)
    request = request_for(ids, 12)
    rolled.observe([request], [0], [10], features[:10])
    rolled.observe([request], [10], [6], wrong[10:16])  # verified 10..15 ...
    rolled.propose([request_for(ids, 16)], np.array([4]))  # a block written over rows 16..19
    rolled.observe([request], [10], [2], features[10:12])  # ... but only 10 and 11 were kept
    fresh = DSparkDrafter(drafter, num_rows=256, block_size=4)
    fresh.observe([request], [0], [12], features[:12])
    a = rolled.propose([request], np.array([4]))
    b = fresh.propose([request], np.array([4]))
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.confidences, b.confidences, rtol=1e-5)
    assert a.tokens[0] == dense_greedy(drafter, features, ids, 12)[0]


def test_requests_without_complete_context_get_no_drafts(setup):
    target, drafter = setup
    ids = list(range(100, 130))
    features = features_for(target, drafter, ids)
    engine_drafter = DSparkDrafter(drafter, num_rows=256, block_size=4)
    request = request_for(ids, 10)
    engine_drafter.observe([request], [0], [8], features[:8])  # two positions short
    proposal = engine_drafter.propose([request], np.array([4]))
    assert proposal.tokens == [[]] and not proposal.confidences.any()


def test_checkpoint_round_trip_and_wrong_target(setup, tmp_path):
    target, drafter = setup
    save_drafter(drafter, tmp_path / "d", {"note": "x"})
    loaded = load_drafter(tmp_path / "d", target.model, dtype=torch.float32)
    for (name, a), b in zip(
        drafter.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        if not name.startswith("rotary"):
            torch.testing.assert_close(a.to(torch.bfloat16).float(), b)
    other = make_tiny_model(tmp_path / "o", num_hidden_layers=5)
    with pytest.raises(ValueError, match="different target"):
        load_drafter(tmp_path / "d", other.model)


def test_dense_target_forward_matches_the_paged_forward(tiny):
    from dspark.engine.kv_cache import PagedKVCache

    ids = [int(x) for x in np.random.default_rng(5).integers(0, 256, size=21)]
    cache = PagedKVCache(tiny.config, 8, 16)
    from dspark.engine.kv_cache import BlockTable

    table = BlockTable()
    assert cache.reserve(table, len(ids))
    batch = cache.attention_batch([table], np.array([0]), np.array([len(ids)]))
    with torch.no_grad():
        paged, cap_paged = tiny.model(
            torch.tensor(ids), torch.arange(len(ids)), batch, cache.layers, capture_layers=(0,)
        )
        dense, cap_dense = tiny.model.forward_dense(
            torch.tensor([ids]), torch.arange(len(ids)), None, capture_layers=(0,)
        )
    torch.testing.assert_close(dense[0], paged, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cap_dense[0][0], cap_paged[0], rtol=1e-5, atol=1e-5)
