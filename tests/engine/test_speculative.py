import numpy as np
import pytest
import torch
from scipy import stats

from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams, inverse_cdf_draw, target_probs
from dspark.engine.speculative import (
    NgramDrafter,
    OnlineAcceptance,
    SampledRound,
    verify,
    verify_sampled,
)

GREEDY = SamplingParams(temperature=0.0)


def one_hot_logits(tokens, vocab=6):
    logits = torch.full((len(tokens), vocab), -5.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_accepts_the_matching_prefix_then_emits_the_argmax():
    logits = one_hot_logits([2, 4, 1, 3])  # target argmax at each of the 4 positions
    assert verify(logits, [2, 4, 5], None, GREEDY, None) == (2, [2, 4, 1])
    assert verify(logits, [2, 4, 1], None, GREEDY, None) == (3, [2, 4, 1, 3])  # + bonus
    assert verify(logits[:1], [], None, GREEDY, None) == (0, [2])
    assert verify(logits, [0, 4, 1], None, GREEDY, None) == (0, [2])


def test_top_k_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert target_probs(logits, SamplingParams(top_k=2)).tolist()[0] == pytest.approx(
        [0.625, 0.375, 0, 0]
    )
    # top_p 0.8: 0.5 + 0.3 reaches it, the rest is cut.
    assert target_probs(logits, SamplingParams(top_p=0.8)).tolist()[0] == pytest.approx(
        [0.625, 0.375, 0, 0]
    )
    assert target_probs(logits, SamplingParams(temperature=1.0)).tolist()[0] == pytest.approx(
        [0.5, 0.3, 0.15, 0.05]
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": "x"}, "stop"),
        ({"temperature": float("nan")}, "temperature"),
    ],
)
def test_bad_sampling_params_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


# Known target distributions over a 5-token vocabulary, per position.
TARGET = torch.tensor(
    [
        [0.40, 0.25, 0.15, 0.15, 0.05],
        [0.10, 0.50, 0.20, 0.10, 0.10],
        [0.30, 0.30, 0.10, 0.20, 0.10],
        [0.05, 0.05, 0.10, 0.30, 0.50],
    ]
)
DRAFT = torch.tensor(
    [
        [0.10, 0.10, 0.60, 0.10, 0.10],
        [0.30, 0.30, 0.10, 0.20, 0.10],
        [0.25, 0.25, 0.25, 0.15, 0.10],
    ]
)


def emitted_tokens(num_drafts, stochastic_draft, rounds=20_000, seed=0):
    """Run ``rounds`` verification rounds with forced draft counts; return the emitted lists.

    Position i's target is TARGET[i] whatever came before, so the emitted tokens of a
    round must be draws from TARGET[0], TARGET[1], ... for any draft count.
    """
    rng = torch.Generator().manual_seed(seed)
    logits = torch.log(TARGET[: num_drafts + 1])
    out = []
    for _ in range(rounds):
        if stochastic_draft:
            drafts = [int(torch.multinomial(DRAFT[i], 1, generator=rng)) for i in range(num_drafts)]
            q = DRAFT[:num_drafts]
        else:  # deterministic drafts (an n-gram drafter): q is one-hot
            drafts = [int(DRAFT[i].argmax()) for i in range(num_drafts)]
            q = None
        out.append(verify(logits, drafts, q, SamplingParams(temperature=1.0), rng)[1])
    return out


def assert_follows(tokens, probs):
    counts = np.bincount(tokens, minlength=5).astype(np.float64)
    expected = probs.double().numpy()
    expected = expected / expected.sum() * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3, counts / counts.sum()
    # Total variation: about 0.7 / sqrt(n) expected for these five-way draws; the bound
    # leaves room for sampling noise on the smaller samples (second tokens: ~3,000).
    bound = max(0.02, 2.0 / np.sqrt(counts.sum()))
    assert 0.5 * np.abs(counts / counts.sum() - expected / counts.sum()).sum() < bound


@pytest.mark.parametrize("num_drafts", [0, 1, 2, 3])
@pytest.mark.parametrize("stochastic_draft", [False, True])
def test_rejection_sampling_reproduces_the_target_distribution(num_drafts, stochastic_draft):
    rounds = emitted_tokens(num_drafts, stochastic_draft, seed=num_drafts)
    assert all(1 <= len(r) <= num_drafts + 1 for r in rounds)
    assert_follows([r[0] for r in rounds], TARGET[0])
    if num_drafts:
        # A second token exists when the first draft was accepted; it follows TARGET[1].
        assert_follows([r[1] for r in rounds if len(r) > 1], TARGET[1])


def test_ngram_drafter_copies_the_continuation_of_the_latest_match():
    drafter = NgramDrafter(num_positions=4, max_n=3)
    request = Request("r", [1, 2, 3, 4, 5, 9, 1, 2, 3], SamplingParams(), 0.0)
    # Last 3-gram (1, 2, 3) occurred at the start, followed by 4, 5, 9, 1.
    assert drafter.propose([request], np.array([4])).tokens == [[4, 5, 9, 1]]
    assert drafter.propose([request], np.array([2])).tokens == [[4, 5]]
    no_match = Request("s", [1, 2, 3, 4], SamplingParams(), 0.0)
    assert drafter.propose([no_match], np.array([4])).tokens == [[]]
    # Falls back to shorter n-grams: only the last token (4) recurs.
    short = Request("t", [4, 7, 8, 5, 4], SamplingParams(), 0.0)
    assert drafter.propose([short], np.array([3])).tokens == [[7, 8, 5]]


def test_online_acceptance_counts_conditional_trials():
    online = OnlineAcceptance(3, prior=0.5, prior_weight=1.0, decay=1.0)
    # Request A: 3 admitted, 1 accepted -> pos0 accepted, pos1 rejected, pos2 untried.
    # Request B: 2 admitted, 2 accepted -> pos0, pos1 accepted.
    online.update(np.array([3, 2]), np.array([1, 2]))
    assert online.trials.tolist() == [2, 2, 0]
    assert online.accepted.tolist() == [2, 1, 0]
    # (accepted + 0.5 · 1) / (trials + 1): the untried position keeps the prior.
    np.testing.assert_allclose(online.rates, [2.5 / 3, 1.5 / 3, 0.5])
    assert online.confidences(2).shape == (2, 3)
    with pytest.raises(ValueError, match="prior_weight"):
        OnlineAcceptance(3, prior_weight=0.0)


def test_a_batch_of_sampled_rounds_follows_each_rounds_target():
    """``verify_sampled`` over one batch mixing draft counts, stochastic and deterministic
    drafts and two temperatures: each kind of round emits draws from its own targets,
    whatever the other rounds of the batch are."""
    rng = torch.Generator().manual_seed(11)
    hot = SamplingParams(temperature=1.0)
    cool = SamplingParams(temperature=0.5)
    kinds = [(n, stochastic, hot) for n in (0, 1, 3) for stochastic in (False, True)]
    kinds += [(2, True, cool)]
    order = np.random.default_rng(3).permutation(np.repeat(np.arange(len(kinds)), 4000))
    rounds = []
    for kind in order:
        n, stochastic, params = kinds[kind]
        if stochastic:
            drafts = [int(torch.multinomial(DRAFT[i], 1, generator=rng)) for i in range(n)]
            q = DRAFT[:n]
        else:
            drafts, q = [int(DRAFT[i].argmax()) for i in range(n)], None
        logits = torch.log(TARGET[: n + 1])
        rounds.append(SampledRound(logits, drafts, q, params, rng))
    verdicts = verify_sampled(rounds)
    for kind, (n, _, params) in enumerate(kinds):
        emitted = [v[1] for v, k in zip(verdicts, order, strict=True) if k == kind]
        assert all(1 <= len(e) <= n + 1 for e in emitted)
        targets = target_probs(torch.log(TARGET), params)
        assert_follows([e[0] for e in emitted], targets[0])
        if n:
            assert_follows([e[1] for e in emitted if len(e) > 1], targets[1])


def test_verify_sampled_of_no_rounds_and_a_lone_prompt_round():
    assert verify_sampled([]) == []
    rng = torch.Generator().manual_seed(2)
    lone = SampledRound(torch.log(TARGET[:1]), [], None, SamplingParams(temperature=1.0), rng)
    tokens = [verify_sampled([lone])[0] for _ in range(4000)]
    assert all(accepted == 0 and len(out) == 1 for accepted, out in tokens)
    assert_follows([out[0] for _, out in tokens], TARGET[0])


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


def test_joined_rows_are_a_view_when_consecutive_and_a_copy_otherwise():
    from dspark.engine.speculative import _joined

    batch = torch.arange(40.0).view(10, 4)
    parts = [batch[0:3], batch[3:4], batch[4:8]]
    joined = _joined(parts)
    assert joined.data_ptr() == batch.data_ptr() and joined.shape == (8, 4)
    assert torch.equal(joined, torch.cat(parts))
    gapped = [batch[0:3], batch[5:8]]  # a greedy request's rows in between
    assert torch.equal(_joined(gapped), torch.cat(gapped))
    reordered = [batch[3:4], batch[0:3]]
    assert torch.equal(_joined(reordered), torch.cat(reordered))
    separate = [torch.ones(2, 4), torch.zeros(1, 4)]
    assert torch.equal(_joined(separate), torch.cat(separate))
    flat = torch.arange(40.0)
    # A one-row block whose row stride is not its width, then the next four values: the
    # rows are adjacent in memory, but the joined rows must still be these two.
    odd = [flat.as_strided((1, 4), (7, 1)), flat[4:8].view(1, 4)]
    assert torch.equal(_joined(odd), torch.cat(odd))
    wider = [batch[0:1], flat[4:9].view(1, 5)[:, :4]]
    assert torch.equal(_joined(wider), torch.cat(wider))
