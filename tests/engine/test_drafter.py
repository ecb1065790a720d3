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


def _greedy_rows(count):
    """``count`` greedy requests: what ``DraftHeads.run`` reads of them is their params."""
    return [Request(f"g{i}", [1], SamplingParams(temperature=0.0), 0.0) for i in range(count)]


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


@pytest.mark.parametrize("vocab", [False, True])
def test_the_greedy_heads_runner_drafts_and_scores_as_the_eager_heads(drafter, vocab):
    """The padded greedy pass (``DraftHeads``, run eagerly here as on a CPU) against the
    per-position eager heads and calibration, at every depth and at row counts that pad
    (3 -> 4, 5 -> 8) or not: the same argmax tokens (draft-vocabulary rows mapped back to
    token ids, each fed to the Markov head of the next position), the same calibrated
    confidences, and past the depth the deepest one computed. The padding rows hold
    junk from a larger run before, which must not reach a real row."""
    from dspark.engine.draft_graphs import DraftHeads
    from tests.models.test_drafter import random_drafter

    target, _ = drafter
    model = random_drafter(
        target, calibration=(0.5, 2.0, 1.5, 3.0), calibration_bias=(0.1, -0.3, 0.2, 0.0)
    )
    vocab_ids = head_weight = None
    if vocab:
        model.set_draft_vocab(SUBSET)
        vocab_ids = model.draft_vocab
        head_weight = model.lm_head_rows(vocab_ids)
    heads = DraftHeads(model, head_weight, vocab_ids, max_rows=16, capture=False)
    k, d = model.config.block_size, model.config.hidden_size
    rng = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        junk = torch.randn(16, k, d, generator=rng) * 9
        heads.run(junk, np.arange(16) + 40, k, _greedy_rows(16))
        for rows in (1, 3, 5, 8):
            hidden = torch.randn(rows, k, d, generator=rng)
            anchors = np.random.default_rng(rows).integers(0, 256, rows)
            for depth in range(1, k + 1):
                drafted, confidences, probs = heads.run(hidden, anchors, depth, _greedy_rows(rows))
                assert probs is None
                previous = torch.from_numpy(anchors)
                expected_tokens, expected_logits = [], []
                for position in range(depth):
                    logits, conf = model.heads(hidden[:, position], previous, head_weight)
                    choice = logits.argmax(dim=-1)
                    previous = choice if vocab_ids is None else vocab_ids[choice]
                    expected_tokens.append(previous)
                    expected_logits.append(conf)
                assert drafted.shape == (rows, depth)
                assert torch.equal(drafted, torch.stack(expected_tokens, dim=1))
                scale = torch.tensor([0.5, 2.0, 1.5, 3.0])[:depth]
                shift = torch.tensor([0.1, -0.3, 0.2, 0.0])[:depth]
                expected = torch.sigmoid(torch.stack(expected_logits, dim=1) / scale + shift)
                assert confidences.shape == (rows, k)
                torch.testing.assert_close(confidences[:, :depth], expected)
                for position in range(depth, k):
                    assert torch.equal(confidences[:, position], confidences[:, depth - 1])


@pytest.mark.parametrize("vocab", [False, True])
def test_a_drafter_with_the_heads_runner_proposes_what_the_eager_one_does(drafter, vocab):
    """``DSparkDrafter.propose`` with padded steps (block pass and heads) against the
    eager drafter, over a batch where one request may not draft (its row of confidences
    stays zero) and depths below the block: the same drafts and confidences. Batches that
    sample (temperature alone; top-k and top-p too; mixed with greedy rows; with and
    without a draft vocabulary) draw the same drafts from each request's generator, and
    hand back the same draft distributions."""
    target, model = drafter
    if vocab:
        model.set_draft_vocab(SUBSET)
    ids = [int(x) for x in np.random.default_rng(5).integers(0, 256, size=30)]
    features = features_for(target, model, ids)
    greedy = SamplingParams(temperature=0.0)

    def propose(graphs, max_drafts, params):
        engine_drafter = DSparkDrafter(model, 1024, 4, graphs=graphs)
        requests = _requests(ids, [6, 13, 21], params, [0, 1, 2])
        for request, anchor in zip(requests, [6, 13, 21], strict=True):
            engine_drafter.observe([request], [0], [anchor], features[:anchor])
        return engine_drafter, engine_drafter.propose(requests, np.array(max_drafts))

    for max_drafts in ([4, 4, 4], [2, 0, 3], [1, 1, 1]):
        _, eager = propose(None, max_drafts, [greedy] * 3)
        padded_drafter, padded = propose((8, 64), max_drafts, [greedy] * 3)
        assert padded_drafter.heads.num_runs == 1
        assert padded.tokens == eager.tokens
        assert [len(t) for t in padded.tokens] == [m and max(max_drafts) for m in max_drafts]
        np.testing.assert_allclose(padded.confidences, eager.confidences, rtol=1e-5, atol=1e-6)
        assert (padded.confidences[np.array(max_drafts) == 0] == 0).all()
    warm, narrow = SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5)
    nucleus = SamplingParams(temperature=1.3, top_p=0.8)
    for params in ([greedy, warm, warm], [narrow, greedy, nucleus], [nucleus] * 3):
        for max_drafts in ([4, 4, 4], [3, 0, 2]):
            _, eager = propose(None, max_drafts, params)
            padded_drafter, padded = propose((8, 64), max_drafts, params)
            assert padded_drafter.heads.num_runs == 1
            assert padded.tokens == eager.tokens
            np.testing.assert_allclose(padded.confidences, eager.confidences, rtol=1e-5, atol=1e-6)
            for p, got, want in zip(params, padded.draft_probs, eager.draft_probs, strict=True):
                if p.is_greedy or want is None:
                    assert got is None and want is None
                    continue
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
                assert got.shape == (max(max_drafts), model.config.vocab_size)


class _ReplayedBody:
    """A CUDA graph stand-in: replaying runs the captured body again, writing into the
    outputs the capture returned, as a graph writes into its own buffers."""

    def __init__(self, body):
        self.body = body
        self.outputs = body()

    def replay(self):
        new = self.body()
        for out, value in zip(self.outputs or (), new or (), strict=True):
            if out is not None:
                out.copy_(value)

    def pool(self):
        return "pool"


def fake_graph_capture(monkeypatch) -> list[bool]:
    """The drafter's row-count runners capture ``_ReplayedBody`` stand-ins on the CPU
    (no CUDA events nor synchronisation); returns the ``warm_up`` flag of each capture."""
    import dspark.engine.draft_graphs as draft_graphs
    from tests.engine.test_graphs import _NoEvent

    monkeypatch.setattr(torch.cuda, "Event", _NoEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    captured: list[bool] = []

    def fake_capture(body, pool, warm_up):
        graph = _ReplayedBody(body)
        captured.append(warm_up)
        return graph, graph.outputs

    monkeypatch.setattr(draft_graphs, "capture_graph", fake_capture)
    return captured


def test_the_heads_capture_each_depth_and_pass_and_cover_smaller_row_counts(drafter, monkeypatch):
    """``DraftHeads`` on its capturing path (graphs faked on the CPU): the first run of a
    (row count, depth, pass) with no cover captures it; a smaller row count of the same
    depth replays that capture (its padding) until the ledger says capture, a new depth
    or pass never replays another's; inside ``exact_shapes`` every shape is its own.
    Every run gives the eager pass's drafts and confidences for its real rows."""
    from dspark.engine.draft_graphs import DraftHeads

    captured = fake_graph_capture(monkeypatch)
    _, model = drafter
    eager = DraftHeads(model, None, None, max_rows=16, capture=False)
    heads = DraftHeads(model, None, None, max_rows=16, capture=False)
    heads.capture = True  # (its staging array is not pinned: no CUDA here)
    heads.ledger.budget = 1.0  # a cover of twice the rows wastes 0.5 of a step: two replays
    k, d = model.config.block_size, model.config.hidden_size
    rng = torch.Generator().manual_seed(5)

    def check(rows, depth):
        hidden = torch.randn(rows, k, d, generator=rng)
        anchors = np.random.default_rng(rows + 10 * depth).integers(0, 256, rows)
        with torch.inference_mode():
            got = heads.run(hidden, anchors, depth, _greedy_rows(rows))
            want = eager.run(hidden, anchors, depth, _greedy_rows(rows))
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])

    check(16, 3)
    assert list(heads.graphs) == [(16, 3, "greedy")] and captured == [True]
    check(8, 3)  # covered by (16, 3): its waste is 8 / 16 = 0.5
    check(8, 2)  # no depth-2 graph covers it: captured
    assert list(heads.graphs) == [(16, 3, "greedy"), (8, 2, "greedy")]
    check(8, 3)  # the second cover spends the budget: captured now
    assert {shape[:2] for shape in heads.graphs} == {(16, 3), (8, 2), (8, 3)}
    assert captured == [True, False, False] and heads.num_captures == 3
    heads.exact_shapes = True
    check(4, 3)  # its own shape, not the (8, 3) cover
    assert (4, 3, "greedy") in heads.graphs and heads.num_captures == 4
    assert heads.num_runs == 5 and heads.pool == "pool" and heads.capture_seconds > 0
    # A sampling batch is a pass of its own: no greedy graph covers it, and its drafts
    # and distributions are the eager body's for the same generators.
    heads.exact_shapes = False
    hidden = torch.randn(8, k, d, generator=rng)
    anchors = np.arange(8) + 3
    params = [SamplingParams(temperature=0.9), SamplingParams(temperature=0.0)] * 4

    def rows():
        out = _greedy_rows(8)
        for i, p in enumerate(params):
            out[i].params = p
            out[i].generator = torch.Generator().manual_seed(i)
        return out

    with torch.inference_mode():
        got = heads.run(hidden, anchors, 3, rows())
        want = eager.run(hidden, anchors, 3, rows())
    assert (8, 3, "sampled") in heads.graphs and heads.num_captures == 5
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[2][0::2], want[2][0::2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_heads_replay_the_eager_heads_on_cuda(drafter):
    """``DraftHeads`` capturing real CUDA graphs against the same runner eager, on the
    GPU: greedy, temperature-only and top-k/top-p batches at two row counts and depths,
    each replayed twice (the second time from the captured graph), with seeded
    generators: the same drafts and distributions."""
    from dspark.engine.draft_graphs import DraftHeads

    target, model = drafter
    target.model.cuda()
    model = model.cuda()
    graphed = DraftHeads(model, None, None, max_rows=16, capture=True)
    eager = DraftHeads(model, None, None, max_rows=16, capture=False)
    k, d = model.config.block_size, model.config.hidden_size
    kinds = {
        "greedy": [SamplingParams(temperature=0.0)],
        "sampled": [SamplingParams(temperature=0.8), SamplingParams(temperature=0.0)],
        "filtered": [SamplingParams(temperature=1.2, top_k=7), SamplingParams(top_p=0.6)],
    }

    def rows(params, count, seed):
        out = _greedy_rows(count)
        for i in range(count):
            out[i].params = params[i % len(params)]
            out[i].generator = torch.Generator(device="cuda").manual_seed(seed + i)
        return out

    with torch.inference_mode():
        for params in kinds.values():
            for count, depth in ((5, 3), (16, 4)):
                for repeat in range(2):
                    hidden = torch.randn(count, k, d, device="cuda")
                    anchors = np.arange(count) + 10 * repeat
                    got = graphed.run(hidden, anchors, depth, rows(params, count, repeat))
                    want = eager.run(hidden, anchors, depth, rows(params, count, repeat))
                    assert torch.equal(got[0], want[0])
                    torch.testing.assert_close(got[1], want[1])
                    if got[2] is not None:
                        torch.testing.assert_close(got[2], want[2])
    assert graphed.num_captures >= 3
