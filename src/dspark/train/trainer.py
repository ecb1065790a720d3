"""Training a DSpark drafter by self-distillation.

Each step samples sequences (prompt + the target's answer), runs the frozen target over
them once (its captured layers are the drafter's context, its logits the teacher), picks
many random anchors per sequence inside the answer, and trains every anchor's block at
once. The loss per block position k (1-based), over the valid prefix only (the label
exists), weighted by exp(-(k-1)/4):

    0.1 · CE(draft, data token) + 0.9 · ||p_draft - p_target||_1
        + 1.0 · BCE(confidence, 1 - ½ ||p_draft - p_target||_1)

The last term's target, the probability that rejection sampling accepts the draft, is
detached. The DFlash ablation (no Markov or confidence head) drops the BCE term.
``TrainConfig.loss = "kl"`` puts the target's forward KL, KL(p_target || p_draft), in
place of the L1 term (its gradient does not fade where the draft is far off).

Training resumes exactly: every ``checkpoint_every`` steps (and when it stops) ``train``
writes ``state.pt`` under ``checkpoint_dir`` with the drafter, the optimiser, the
schedule, the step, the data sampler's and torch's RNG states and the history; pass its
``load_checkpoint`` to ``train(resume=...)`` and the run goes on as if never stopped.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from dspark.models.drafter import DraftModel
from dspark.models.llama import LlamaModel
from dspark.train.data import DistillSet


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 16  # sequences per step
    anchors: int = 16  # random anchors per sequence
    max_length: int = 768  # sequences are cut to this many tokens
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_sequences: int = 256
    seed: int = 0
    max_minutes: float | None = None  # stop early (and say so) after this long, per run
    loss: str = "tv"  # "tv": the L1 (total variation) term; "kl": forward KL instead

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "anchors", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.loss not in ("tv", "kl"):
            raise ValueError(f"loss must be 'tv' or 'kl', got {self.loss!r}")


LOSS_WEIGHTS = {"ce": 0.1, "match": 0.9, "bce": 1.0}  # "match": the L1 or KL term
POSITION_DECAY = 4.0


def position_weights(k: int, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(k, device=device, dtype=torch.float32) / POSITION_DECAY)


def draft_loss(
    logits: torch.Tensor,  # [..., K, V] float32 draft logits
    confidence_logits: torch.Tensor | None,  # [..., K]
    target_logits: torch.Tensor,  # [..., K, V]
    labels: torch.Tensor,  # [..., K]
    valid: torch.Tensor,  # [..., K] bool: the label exists
    kind: str = "tv",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DSpark loss (module docstring) and its parts."""
    log_draft = torch.log_softmax(logits, dim=-1)
    draft = log_draft.exp()
    log_target = torch.log_softmax(target_logits.float(), dim=-1)
    target = log_target.exp()
    ce = -log_draft.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    l1 = (draft - target).abs().sum(-1)
    weights = position_weights(logits.shape[-2], logits.device) * valid
    total = weights.sum().clamp_min(1e-9)
    terms = {"ce": ce, "l1": l1}
    if kind == "kl":
        kl = (target * (log_target - log_draft)).sum(-1)
        loss = LOSS_WEIGHTS["ce"] * ce + LOSS_WEIGHTS["match"] * kl
        terms["kl"] = kl
    else:
        loss = LOSS_WEIGHTS["ce"] * ce + LOSS_WEIGHTS["match"] * l1
    if confidence_logits is not None:
        acceptance = (1.0 - 0.5 * l1).detach().clamp(0.0, 1.0)
        bce = F.binary_cross_entropy_with_logits(
            confidence_logits.float(), acceptance, reduction="none"
        )
        loss = loss + LOSS_WEIGHTS["bce"] * bce
        terms["bce"] = bce
    loss = (loss * weights).sum() / total
    terms["loss"] = loss
    means = [(t * weights).sum() / total if t is not loss else t for t in terms.values()]
    means = torch.stack(means)
    parts = dict(zip(terms, means.detach().tolist(), strict=True))  # one host sync
    return loss, parts


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T]
    lengths: torch.Tensor  # [B]
    anchors: torch.Tensor  # [B, A]


def sample_batch(
    data: DistillSet,
    rows: np.ndarray,
    num_anchors: int,
    max_length: int,
    rng: np.random.Generator,
    device,
) -> Batch:
    """Sequences ``rows`` right-padded, with anchors drawn from each answer (the prompt's
    last token onwards, leaving at least one label)."""
    sequences = [data.sequences[i][:max_length] for i in rows]
    width = max(len(s) for s in sequences)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    anchors = np.zeros((len(rows), num_anchors), dtype=np.int64)
    for b, (i, seq) in enumerate(zip(rows, sequences, strict=True)):
        ids[b, : len(seq)] = seq
        low = min(int(data.prompt_lengths[i]) - 1, len(seq) - 2)
        anchors[b] = rng.integers(max(low, 0), len(seq) - 1, size=num_anchors)
    return Batch(
        torch.from_numpy(ids).to(device),
        torch.tensor([len(s) for s in sequences], device=device),
        torch.from_numpy(anchors).to(device),
    )


def teacher(target: LlamaModel, drafter: DraftModel, batch: Batch):
    """The target's captured features ``[B, T, F]`` and its final hidden states."""
    with torch.no_grad():
        positions = torch.arange(batch.ids.shape[1], device=batch.ids.device)
        hidden, captured = target.forward_dense(
            batch.ids, positions, None, capture_layers=drafter.config.capture_layers
        )
    return torch.cat(captured, dim=-1), hidden


def block_targets(batch: Batch, k: int):
    """Per anchor and block position: the previous token (the Markov input), the label,
    whether the label exists, and the sequence position whose target logits teach it."""
    offsets = torch.arange(k, device=batch.ids.device)
    where = batch.anchors[..., None] + offsets  # position predicting the label
    valid = (where + 1) < batch.lengths[:, None, None]
    width = batch.ids.shape[1]
    flat = lambda index: batch.ids.gather(1, index.clamp_max(width - 1).flatten(1)).view_as(index)  # noqa: E731
    return flat(where), flat(where + 1), valid, where.clamp_max(width - 1)


def forward_loss(
    target: LlamaModel, drafter: DraftModel, batch: Batch, autocast: bool, kind: str = "tv"
):
    k = drafter.config.block_size
    features, target_hidden = teacher(target, drafter, batch)
    previous, labels, valid, where = block_targets(batch, k)
    with torch.no_grad():
        picked = target_hidden.gather(
            1, where.flatten(1)[..., None].expand(-1, -1, target_hidden.shape[-1])
        )
        target_logits = target.logits(picked).view(*where.shape, -1)
    with torch.autocast(features.device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = drafter.forward_train(features, batch.ids, batch.anchors)
        logits, confidence = drafter.heads(hidden, previous)
    return draft_loss(logits, confidence, target_logits, labels, valid, kind)


@torch.no_grad()
def accepted_at_every_anchor(
    target: LlamaModel, drafter: DraftModel, batch: Batch
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy drafting as the engine does it (the Markov head fed its own drafts) from
    every anchor ``batch.anchors`` holds, against the target's greedy choices along the
    sequence: accepted drafts ``[B, A]`` and whether all K labels exist ``[B, A]``."""
    k = drafter.config.block_size
    features, target_hidden = teacher(target, drafter, batch)
    _, _, valid, where = block_targets(batch, k)
    hidden = drafter.forward_train(features, batch.ids, batch.anchors)
    previous = batch.ids.gather(1, batch.anchors)
    matched = torch.ones_like(previous, dtype=torch.bool)
    accepted = torch.zeros_like(previous)
    for position in range(k):
        logits, _ = drafter.heads(hidden[:, :, position], previous)
        previous = logits.argmax(-1)
        picked = target_hidden.gather(
            1, where[:, :, position, None].expand(-1, -1, target_hidden.shape[-1])
        )
        best = target.logits(picked).argmax(-1)
        matched &= previous == best
        accepted += matched
    return accepted.cpu().numpy(), valid.all(-1).cpu().numpy()


def chain_rounds(
    target: LlamaModel,
    drafter: DraftModel,
    data: DistillSet,
    max_length: int,
    batch_size: int,
    max_answer: int | None = None,
) -> np.ndarray:
    """Accepted drafts per round of greedy decoding along each answer, the rounds a
    greedy engine would run: the first anchor is the answer's first token (the prefill
    emits it without drafts) and each round moves the anchor past the accepted drafts
    and the bonus token. (Anchors drawn uniformly would over-count long easy stretches,
    which an engine crosses in a few rounds, and overstate τ.) Rounds whose K labels do
    not all exist are left out."""
    device = next(target.parameters()).device
    k = drafter.config.block_size
    was_training = drafter.training
    drafter.eval()
    rounds = []
    for begin in range(0, len(data), batch_size):
        rows = np.arange(begin, min(begin + batch_size, len(data)))
        sequences = [data.sequences[i][:max_length] for i in rows]
        firsts = [int(data.prompt_lengths[i]) for i in rows]  # the first answer token
        lasts = [len(s) - 2 for s in sequences]
        if max_answer is not None:
            lasts = [
                min(last, first + max_answer - 1) for first, last in zip(firsts, lasts, strict=True)
            ]
        spans = [last - first + 1 for first, last in zip(firsts, lasts, strict=True)]
        width = max(1, *spans)
        anchors = np.zeros((len(rows), width), dtype=np.int64)
        for b, (first, last) in enumerate(zip(firsts, lasts, strict=True)):
            anchors[b] = np.minimum(np.arange(first, first + width), max(first, last))
        ids = np.zeros((len(rows), max(len(s) for s in sequences)), dtype=np.int64)
        for b, seq in enumerate(sequences):
            ids[b, : len(seq)] = seq
        batch = Batch(
            torch.from_numpy(ids).to(device),
            torch.tensor([len(s) for s in sequences], device=device),
            torch.from_numpy(anchors).to(device),
        )
        accepted, complete = accepted_at_every_anchor(target, drafter, batch)
        for b, (first, last) in enumerate(zip(firsts, lasts, strict=True)):
            anchor = first
            while anchor <= last and complete[b, anchor - first]:
                count = int(accepted[b, anchor - first])
                rounds.append(min(count, k))
                anchor += count + 1
    drafter.train(was_training)
    return np.array(rounds, dtype=np.int64)


def acceptance_summary(accepted: np.ndarray, k: int) -> dict:
    """τ (tokens per round, bonus included) and per-position conditional acceptance."""
    reached = np.array([(accepted >= i).sum() for i in range(k + 1)], dtype=float)
    conditional = np.divide(reached[1:], reached[:-1], out=np.zeros(k), where=reached[:-1] > 0)
    return {
        "tau": float(1.0 + accepted.mean()) if accepted.size else 0.0,
        "conditional_acceptance": [round(float(x), 4) for x in conditional],
        "rounds": int(accepted.size),
    }


def init_drafter(drafter: DraftModel, seed: int) -> None:
    """Small random weights (std 0.02), unit norms, and a Markov head that starts silent."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.startswith("markov_out") or name.startswith("confidence"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


CHECKPOINT_FILE = "state.pt"


def load_checkpoint(directory) -> dict | None:
    """The training state ``train`` left in ``directory``, or None when there is none."""
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def _save_checkpoint(directory, state: dict) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / (CHECKPOINT_FILE + ".partial")
    torch.save(state, partial)
    partial.replace(directory / CHECKPOINT_FILE)  # a kill mid-write keeps the last one


def train(
    target: LlamaModel,
    drafter: DraftModel,
    train_data: DistillSet,
    eval_data: DistillSet | None,
    config: TrainConfig,
    progress: bool = True,
    on_eval=None,
    *,
    checkpoint_dir=None,
    checkpoint_every: int = 500,
    resume: dict | None = None,
    stop_after: int | None = None,
) -> list[dict]:
    """Train ``drafter`` in place; returns the history (loss parts, evals, tokens seen).
    ``resume``: a ``load_checkpoint`` state to continue from (same config and data).
    ``stop_after``: end this run after that many steps, as an interruption would."""
    if len(train_data) == 0:
        raise ValueError("no training sequences")
    device = next(target.parameters()).device
    target.eval().requires_grad_(False)
    drafter.train()
    params = [p for p in drafter.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )

    def schedule(step: int) -> float:
        if step < config.warmup:
            return (step + 1) / config.warmup
        progress_ = (step - config.warmup) / max(1, config.steps - config.warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress_)))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng = np.random.default_rng(config.seed)
    history: list[dict] = []
    first, tokens_seen, earlier_minutes = 0, 0, 0.0
    if resume is not None:

        def settings(c: dict) -> dict:
            return {k: v for k, v in c.items() if k != "max_minutes"}  # a per-run limit

        if settings(resume["config"]) != settings(config_dict(config)):
            raise ValueError("the checkpoint was trained with another TrainConfig")
        missing, unexpected = drafter.load_state_dict(resume["drafter"], strict=False)
        if unexpected or any("rotary" not in k for k in missing):
            raise ValueError(f"the checkpoint does not fit this drafter: {missing or unexpected}")
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        rng.bit_generator.state = resume["numpy_rng"]
        torch.set_rng_state(resume["torch_rng"])
        if resume.get("cuda_rng") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(resume["cuda_rng"], device)
        history, first, tokens_seen = list(resume["history"]), resume["step"], resume["tokens"]
        earlier_minutes = resume.get("minutes", 0.0)

    def checkpoint(step: int) -> None:
        if checkpoint_dir is None:
            return
        state = {
            "step": step,
            "tokens": tokens_seen,
            "config": config_dict(config),
            "drafter": {k: v for k, v in drafter.state_dict().items() if "rotary" not in k},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "numpy_rng": rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "history": history,
            "minutes": earlier_minutes + (time.perf_counter() - start) / 60,
        }
        _save_checkpoint(checkpoint_dir, state)

    autocast = device.type == "cuda"
    start = time.perf_counter()
    last_step = config.steps if stop_after is None else min(config.steps, first + stop_after)
    bar = tqdm(range(first, last_step), desc="train", disable=not progress)
    for step in bar:
        rows = rng.integers(0, len(train_data), size=config.batch_size)
        batch = sample_batch(train_data, rows, config.anchors, config.max_length, rng, device)
        tokens_seen += int(sum(min(len(train_data.sequences[i]), config.max_length) for i in rows))
        loss, parts = forward_loss(target, drafter, batch, autocast, config.loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        scheduler.step()
        record = {"step": step + 1, **parts, "grad_norm": float(grad_norm), "tokens": tokens_seen}
        record["lr"] = scheduler.get_last_lr()[0]
        history.append(record)
        bar.set_postfix(loss=f"{parts['loss']:.3f}")
        last = step + 1 == config.steps
        minutes = (time.perf_counter() - start) / 60
        out_of_time = config.max_minutes is not None and minutes >= config.max_minutes
        if (
            eval_data is not None
            and len(eval_data)
            and ((step + 1) % config.eval_every == 0 or last or out_of_time)
        ):
            subset = DistillSet(
                eval_data.sequences[: config.eval_sequences],
                eval_data.prompt_lengths[: config.eval_sequences],
            )
            accepted = chain_rounds(
                target, drafter, subset, config.max_length, max(1, config.batch_size // 2)
            )
            summary = acceptance_summary(accepted, drafter.config.block_size)
            record["eval"] = summary
            record["minutes"] = round(earlier_minutes + minutes, 2)
            bar.write(
                f"step {step + 1}: loss {parts['loss']:.3f}, held-out greedy tau (engine rounds) "
                f"{summary['tau']:.2f}, per-position {summary['conditional_acceptance']}"
            )
            if on_eval is not None:
                on_eval(record)
        if (step + 1) % checkpoint_every == 0 or last or out_of_time or step + 1 == last_step:
            checkpoint(step + 1)
        if out_of_time:
            bar.write(f"stopping after {minutes:.1f} min (--max-minutes), step {step + 1}")
            record["stopped_early"] = True
            break
    bar.close()
    drafter.eval()
    return history


def config_dict(config: TrainConfig) -> dict:
    return asdict(config)
