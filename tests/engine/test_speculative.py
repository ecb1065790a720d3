import numpy as np
import pytest
import torch
from scipy import stats

from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams, target_probs
from dspark.engine.speculative import NgramDrafter, OnlineAcceptance, verify

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
    assert 0.5 * np.abs(counts / counts.sum() - expected / counts.sum()).sum() < 0.02


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
