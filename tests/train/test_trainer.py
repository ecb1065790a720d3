"""The drafter's training: the loss by hand, it falls on a fixed batch, and the offline
evaluation reproduces the engine's greedy rounds."""

from __future__ import annotations

import numpy as np
import torch

from dspark.engine.config import EngineConfig
from dspark.engine.drafter import DSparkDrafter
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.train.data import DistillSet, generate_greedy
from dspark.train.trainer import (
    Batch,
    TrainConfig,
    chain_rounds,
    draft_loss,
    forward_loss,
    init_drafter,
    load_checkpoint,
    sample_batch,
    train,
)
from tests.conftest import make_tiny_model
from tests.models.test_drafter import random_drafter


def test_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # [1 anchor, K=2, V=3]
    target = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 3.0, 0.0]]])
    confidence = torch.tensor([[0.5, -1.0]])
    labels = torch.tensor([[0, 2]])
    valid = torch.tensor([[True, True]])
    loss, parts = draft_loss(logits, confidence, target, labels, valid)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    total, weight_sum = 0.0, 0.0
    for k in range(2):
        p = softmax(logits[0, k].numpy().astype(float))
        q = softmax(target[0, k].numpy().astype(float))
        ce = -np.log(p[labels[0, k]])
        l1 = np.abs(p - q).sum()
        c = 1 / (1 + np.exp(-float(confidence[0, k])))
        a = 1 - 0.5 * l1
        bce = -(a * np.log(c) + (1 - a) * np.log(1 - c))
        w = np.exp(-k / 4)
        total += w * (0.1 * ce + 0.9 * l1 + bce)
        weight_sum += w
    assert np.isclose(float(loss), total / weight_sum, rtol=1e-5)
    # An invalid position (no label) contributes nothing.
    masked, _ = draft_loss(logits, confidence, target, labels, torch.tensor([[True, False]]))
    p0 = softmax(logits[0, 0].numpy().astype(float))
    q0 = softmax(target[0, 0].numpy().astype(float))
    l1 = np.abs(p0 - q0).sum()
    c0 = 1 / (1 + np.exp(-0.5))
    a0 = 1 - 0.5 * l1
    expected = 0.1 * -np.log(p0[0]) + 0.9 * l1 - (a0 * np.log(c0) + (1 - a0) * np.log(1 - c0))
    assert np.isclose(float(masked), expected, rtol=1e-5)
    assert set(parts) == {"ce", "l1", "bce", "loss"}


def test_kl_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])  # [1 anchor, K=1, V=3]
    target = torch.tensor([[[0.5, 1.0, 0.0]]])
    labels, valid = torch.tensor([[1]]), torch.tensor([[True]])
    loss, parts = draft_loss(logits, None, target, labels, valid, kind="kl")
    p = np.exp([2.0, 0.0, -1.0]) / np.exp([2.0, 0.0, -1.0]).sum()
    q = np.exp([0.5, 1.0, 0.0]) / np.exp([0.5, 1.0, 0.0]).sum()
    kl = float((q * np.log(q / p)).sum())
    assert np.isclose(parts["kl"], kl, rtol=1e-5)
    assert np.isclose(float(loss), 0.1 * -np.log(p[1]) + 0.9 * kl, rtol=1e-5)


def fit_tiny(target, drafter, prompts, steps, seed=0):
    """Train ``drafter`` on the target's greedy answers to ``prompts``; the losses."""
    init_drafter(drafter, seed)
    rng = np.random.default_rng(seed)
    answers = generate_greedy(target.model, prompts, 32, [], batch_size=len(prompts))
    data = DistillSet.build(prompts, answers)
    batch = sample_batch(data, np.arange(len(data)), 12, 64, rng, "cpu")
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    drafter.train()
    losses = []
    for _ in range(steps):
        loss, _ = forward_loss(target.model, drafter, batch, autocast=False)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    drafter.eval()
    return losses


def test_loss_falls_on_a_fixed_batch_and_confidences_stay_in_0_1(tmp_path):
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=4)
    rng = np.random.default_rng(0)
    losses = fit_tiny(target, drafter, [rng.integers(0, 256, 6).tolist() for _ in range(4)], 80)
    assert losses[-1] < 0.6 * losses[0], losses[::8]
    with torch.no_grad():
        hidden = torch.randn(50, drafter.config.hidden_size)
        _, logits = drafter.heads(hidden, torch.randint(0, 256, (50,)))
        confidence = drafter.calibrated(logits[:, None])
    assert bool(((confidence > 0) & (confidence < 1)).all())


def test_chain_rounds_are_the_engines_greedy_rounds(tmp_path):
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    drafter = random_drafter(target, block_size=3, seed=5)
    rng = np.random.default_rng(2)
    prompts = [(rng.integers(0, 8, 3).tolist() * 4)[:10] for _ in range(3)]
    fit_tiny(target, drafter, prompts, 60)  # so that some drafts get accepted
    answers = generate_greedy(target.model, prompts, 30, [], batch_size=3)
    data = DistillSet.build(prompts, answers)
    for i, prompt in enumerate(prompts):
        engine = LLMEngine(
            target,
            EngineConfig(spec="fixed", num_drafts=3, max_num_seqs=2),
            drafter=DSparkDrafter(drafter, 4096, 16),
        )
        engine.round_log = []
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        full = [n for _, a, n in engine.round_log if a == 3]
        one = DistillSet([data.sequences[i]], data.prompt_lengths[i : i + 1])
        chain = chain_rounds(target.model, drafter, one, 128, 1).tolist()
        assert chain[: len(full)] == full and len(chain) - len(full) in (0, 1)
        assert sum(full) > 0  # some drafts were accepted along the way


def test_batch_anchors_lie_in_the_answer():
    data = DistillSet.build([[1] * 5, [2] * 3], [[3] * 4, [4] * 2])
    batch: Batch = sample_batch(data, np.array([0, 1]), 50, 100, np.random.default_rng(0), "cpu")
    anchors = batch.anchors.numpy()
    assert anchors[0].min() >= 4 and anchors[0].max() <= 7
    assert anchors[1].min() >= 2 and anchors[1].max() <= 3


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 256, 5).tolist() for _ in range(6)]
    data = DistillSet.build(prompts, generate_greedy(target.model, prompts, 20, [], 6))
    config = TrainConfig(
        steps=8,
        batch_size=3,
        anchors=4,
        max_length=32,
        warmup=3,
        eval_every=4,
        eval_sequences=3,
        seed=1,
    )

    def fresh():
        drafter = random_drafter(target, block_size=3)
        init_drafter(drafter, 0)
        return drafter

    whole = fresh()
    expected = train(target.model, whole, data, data, config, progress=False)
    stopped = fresh()
    train(
        target.model,
        stopped,
        data,
        data,
        config,
        progress=False,
        checkpoint_dir=tmp_path / "ck",
        stop_after=3,
    )
    state = load_checkpoint(tmp_path / "ck")
    assert state["step"] == 3
    resumed = fresh()  # a new process: nothing but the checkpoint carries over
    history = train(
        target.model,
        resumed,
        data,
        data,
        config,
        progress=False,
        checkpoint_dir=tmp_path / "ck",
        resume=state,
    )
    assert [h["loss"] for h in history] == [h["loss"] for h in expected]
    assert [h["tokens"] for h in history] == [h["tokens"] for h in expected]
    assert history[-1]["eval"] == expected[-1]["eval"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert load_checkpoint(tmp_path / "ck")["step"] == 8
