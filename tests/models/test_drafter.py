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


@pytest.mark.parametrize("graphs", [None, (4, 64)])
@pytest.mark.parametrize("depth", [1, 2])
def test_a_cut_block_drafts_what_the_training_path_drafts_over_that_block(setup, depth, graphs):
    """``block_cut``: the block pass runs the deepest draft's positions and one mask token
    after (``depth + 1`` of the block's 4), and drafts what the training path drafts for a
    block of that width, eager or through the padded block pass and heads runner."""
    import dataclasses

    target, drafter = setup
    ids = [int(x) for x in np.random.default_rng(5).integers(0, 256, size=30)]
    features = features_for(target, drafter, ids)
    engine_drafter = DSparkDrafter(drafter, num_rows=256, block_size=4, graphs=graphs)
    engine_drafter.block_cut = True
    widths = []  # the block positions each pass ran for its one request
    if graphs is None:
        block_pass = engine_drafter._block_pass

        def spy(ids_, positions, batch, anchors=None):
            widths.append(positions.shape[0])
            return block_pass(ids_, positions, batch, anchors)

        engine_drafter._block_pass = spy
    else:
        run = engine_drafter.graphs.run

        def spy(tables, anchor_pos, queries, *rest):
            widths.extend(queries.tolist())
            return run(tables, anchor_pos, queries, *rest)

        engine_drafter.graphs.run = spy
    full_config = drafter.config
    for anchor in (3, 11):
        request = request_for(ids, anchor)
        engine_drafter.on_finished(request)
        engine_drafter.observe([request], [0], [anchor], features[:anchor])
        proposal = engine_drafter.propose([request], np.array([depth]))
        try:
            drafter.config = dataclasses.replace(full_config, block_size=depth + 1)
            cut_tokens, cut_confs = dense_greedy(drafter, features, ids, anchor)
        finally:
            drafter.config = full_config
        assert proposal.tokens[0] == cut_tokens[:depth]
        np.testing.assert_allclose(
            proposal.confidences[0][:depth], cut_confs[:depth], rtol=1e-4, atol=1e-5
        )
    assert widths == [depth + 1, depth + 1]


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


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        "cpu-captured",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
            ],
        ),
    ],
)
def test_padded_context_updates_leave_the_context_the_eager_ones_leave(setup, device, monkeypatch):
    """``ContextWriter`` pads each update to a row count it replays (a captured CUDA graph
    on a GPU; the same padded body run eagerly on the CPU; on the CPU with its capture
    path taken and graphs faked, "cpu-captured"): the drafts and confidences that read
    the context come out as with the eager update, and its padding rows land in the
    scratch block only."""
    captures = device != "cpu"
    if device == "cpu-captured":
        from tests.engine.test_drafter import fake_graph_capture

        fake_graph_capture(monkeypatch)
        device = "cpu"
    target, drafter = setup
    rng = np.random.default_rng(5)
    seqs = [[int(x) for x in rng.integers(0, 256, size=n)] for n in (30, 23, 17)]
    features = [features_for(target, drafter, ids).to(device) for ids in seqs]
    target.model.to(device)  # the drafter reads the target's embedding and LM head
    drafter = drafter.to(device)
    eager = DSparkDrafter(drafter, num_rows=512, block_size=4)
    padded = DSparkDrafter(drafter, num_rows=512, block_size=4, graphs=(4, 64))
    padded.context_graphs.capture = captures
    scratch = padded.graphs.scratch_block
    before = [k.clone() for k, _ in padded.cache.layers]

    def named(i, ids):
        request = request_for(ids, 12)
        request.request_id = f"r{i}"
        return request

    for engine_drafter in (eager, padded):
        r = [named(i, ids) for i, ids in enumerate(seqs)]
        f = features
        # Prompt chunks of 7, 12 and 5 rows in one update (24 rows: padded to 32), then
        # 10 rows (to 16), single rows, and a rollback: rows 10 and 11 of the second
        # request written with other features, then the kept row 10 again.
        engine_drafter.observe(r, [0, 0, 0], [7, 12, 5], torch.cat([f[0][:7], f[1][:12], f[2][:5]]))
        engine_drafter.observe([r[0], r[2]], [7, 5], [3, 7], torch.cat([f[0][7:10], f[2][5:12]]))
        engine_drafter.observe([r[0]], [10], [1], f[0][10:11])
        engine_drafter.observe([r[1]], [10], [2], f[1][10:12] + 1.0)
        engine_drafter.observe([r[1]], [10], [1], f[1][10:11])
        engine_drafter.observe(r[:2], [11, 11], [1, 1], torch.cat([f[0][11:12], f[1][11:12]]))
    assert padded.context_graphs.num_runs == 6
    # 32, 1 and 2 rows captured; the 10-row update replays the 32-row graph (a cover).
    assert padded.context_graphs.num_captures == (3 if captures else 0)
    assert eager.context_graphs is None
    requests = [named(i, ids) for i, ids in enumerate(seqs)]
    a = eager.propose(requests, np.array([4, 4, 4]))
    b = padded.propose(requests, np.array([4, 4, 4]))
    assert a.tokens == b.tokens and all(len(t) == 4 for t in a.tokens)
    # On a GPU padded row counts may pick other matrix kernels: rounding differs a little.
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if device == "cpu" else {"rtol": 1e-4, "atol": 1e-5}
    np.testing.assert_allclose(a.confidences, b.confidences, **tolerance)
    # Every cache row the padded drafter's requests own holds what the eager one wrote.
    for request in requests:
        rows = {}
        for name, engine_drafter in (("eager", eager), ("padded", padded)):
            table = engine_drafter.tables[request.request_id]
            rows[name] = table.rows(np.arange(12), 4)
        for (k1, _), (k2, _) in zip(eager.cache.layers, padded.cache.layers, strict=True):
            torch.testing.assert_close(k1[rows["eager"]], k2[rows["padded"]], **tolerance)
    # Outside the requests' blocks, only the scratch block changed.
    owned = {b for t in padded.tables.values() for b in t.blocks}
    for (k, _), old in zip(padded.cache.layers, before, strict=True):
        changed = (k != old).flatten(1).any(dim=1).nonzero().flatten() // 4
        assert set(changed.tolist()) - owned == {scratch}


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
