"""The DSpark drafter: a small parallel block conditioned on the target's hidden states.

- **Context features.** The outputs of a few target layers (spread over depth, never the
  last) are concatenated per position, projected back to the hidden size and RMS-normed.
  Every draft layer sees them as extra keys and values (through its own K/V projections)
  in front of the block.
- **Parallel block.** The anchor (the last accepted token) followed by K-1 learnt mask
  embeddings, at positions p ... p+K-1. Inside the block attention runs both ways; block
  position i predicts the token at p+1+i, so one pass proposes K drafts. The token
  embedding and LM head are the target's, frozen and not stored with the drafter.
- **Markov head.** ``logits_k = U_k + W2 W1[x_{k-1}]`` with rank r, sampled left to
  right. W1 and W2 are factorised through the target's embedding (see ``markov_in`` and
  ``markov_out``), so the head costs 2·d·r parameters instead of 2·V·r, which keeps
  the drafter small for a large vocabulary.
- **Draft vocabulary.** A drafter directory may hold ``draft_vocab.npy``: the most
  frequent token ids (``dspark draft-vocab``). ``load_drafter`` attaches them as
  ``draft_vocab`` and the engine then computes the per-position logits over those rows of
  the LM head only; training always uses the whole vocabulary.
- **Confidence head.** ``c_k = sigmoid(w · [h_k ; W1[x_{k-1}]])``: the drafter's estimate
  that draft k is accepted given that every earlier one was. Optional per-position
  temperatures and shifts (sequential temperature scaling, ``dspark calibrate``) map its
  logit z to z / T_k + b_k.

``forward_train`` runs many anchors of a padded batch at once with dense masks;
``dspark.engine.drafter`` runs the same weights over a paged cache during decoding.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dspark.models.config import ModelConfig
from dspark.models.llama import DecoderLayer, LlamaModel, RMSNorm, Rotary
from dspark.ops.linear import linear

CONFIG_FILE = "drafter.json"
WEIGHTS_FILE = "drafter.safetensors"
DRAFT_VOCAB_FILE = "draft_vocab.npy"


def check_draft_vocab(ids: np.ndarray | torch.Tensor, vocab_size: int) -> np.ndarray:
    """``ids`` as an int64 array, if they are a valid draft vocabulary: strictly ascending
    token ids inside the vocabulary."""
    ids = ids.cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"a draft vocabulary is a non-empty 1-D array of integer token ids, got "
            f"shape {ids.shape} of {ids.dtype}"
        )
    if ids[0] < 0 or ids[-1] >= vocab_size or not (np.diff(ids) > 0).all():
        raise ValueError(
            f"draft vocabulary ids must be strictly ascending and inside 0..{vocab_size - 1}; "
            "rebuild it with dspark draft-vocab"
        )
    return ids.astype(np.int64)


def _apply(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through ``dspark.ops.linear.linear`` (few rows on CPU read the
    weight once)."""
    return linear(x, module.weight, module.bias)


def default_capture_layers(num_target_layers: int, count: int = 5) -> tuple[int, ...]:
    """``count`` layers spread from the second to the third-from-last (fewer for very
    shallow targets); never the last layer, whose output is the LM head's input."""
    if num_target_layers < 2:
        raise ValueError("the target needs at least 2 layers to feed a drafter")
    high = max(0, num_target_layers - 3)
    low = min(1, high)
    return tuple(sorted({int(x + 0.5) for x in np.linspace(low, high, count)}))


@dataclass(frozen=True)
class DrafterConfig:
    # Copied from the target: the block reuses its embedding, LM head and attention shape.
    vocab_size: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    target_layers: int
    capture_layers: tuple[int, ...]
    # The drafter's own shape.
    num_layers: int = 2
    intermediate_size: int = 1024
    block_size: int = 7  # K: drafts per pass
    markov_rank: int = 256  # 0: no Markov head (the DFlash ablation)
    confidence_head: bool = True
    calibration: tuple[float, ...] = ()  # per-position temperatures of the confidence logit
    calibration_bias: tuple[float, ...] = ()  # per-position shifts after the temperature

    def __post_init__(self) -> None:
        object.__setattr__(self, "capture_layers", tuple(self.capture_layers))
        object.__setattr__(self, "calibration", tuple(self.calibration))
        object.__setattr__(self, "calibration_bias", tuple(self.calibration_bias))
        if not self.capture_layers:
            raise ValueError("capture_layers is empty; the drafter needs target features")
        bad = [i for i in self.capture_layers if not 0 <= i < self.target_layers - 1]
        if bad:
            raise ValueError(
                f"capture_layers {bad} are outside 0..{self.target_layers - 2} (the target's "
                "layers except the last)"
            )
        for name in ("num_layers", "intermediate_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.markov_rank < 0:
            raise ValueError(f"markov_rank must be >= 0, got {self.markov_rank}")
        if self.calibration_bias and len(self.calibration_bias) != len(self.calibration):
            raise ValueError("calibration_bias needs one shift per calibration temperature")
        if self.calibration and len(self.calibration) != self.block_size:
            raise ValueError(
                f"calibration has {len(self.calibration)} temperatures for a block of "
                f"{self.block_size}"
            )

    @classmethod
    def for_target(cls, target: ModelConfig, **overrides) -> DrafterConfig:
        fields = dict(
            vocab_size=target.vocab_size,
            hidden_size=target.hidden_size,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            max_position=target.max_position,
            target_layers=target.num_layers,
            capture_layers=default_capture_layers(target.num_layers),
        )
        fields.update(overrides)
        return cls(**fields)

    def matches(self, target: ModelConfig) -> bool:
        """Whether this drafter was built for a target of ``target``'s shape."""
        return (
            self.vocab_size,
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.target_layers,
        ) == (
            target.vocab_size,
            target.hidden_size,
            target.num_heads,
            target.num_kv_heads,
            target.head_dim,
            target.num_layers,
        )

    def layer_config(self) -> ModelConfig:
        """The shape of one draft layer (a target-shaped decoder layer)."""
        return ModelConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position=self.max_position,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown drafter config keys {sorted(unknown)}")
        return cls(**data)


class DraftModel(nn.Module):
    """The drafter's own weights; ``attach`` lends it the target's embedding and LM head."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(len(config.capture_layers) * d, d, bias=False)
        self.context_norm = RMSNorm(d, config.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(d))
        layer_config = config.layer_config()
        self.layers = nn.ModuleList(DecoderLayer(layer_config) for _ in range(config.num_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.max_position)
        rank = config.markov_rank
        if rank:
            self.markov_in = nn.Linear(d, rank, bias=False)  # W1[x] = markov_in(E[x])
            self.markov_out = nn.Linear(rank, d, bias=False)  # W2 = E · markov_out
        if config.confidence_head:
            self.confidence = nn.Linear(d + rank, 1)
        self._target: list[nn.Module] = []  # a plain list: not a submodule, never saved
        # [N] ascending token ids the engine drafts from (None: the whole vocabulary).
        self.register_buffer("draft_vocab", None, persistent=False)

    # ---- the frozen target parts ---------------------------------------------------------

    def attach(self, target: LlamaModel) -> DraftModel:
        if not self.config.matches(target.config):
            raise ValueError(
                "this drafter was built for a different target (vocabulary, width, heads or "
                "depth differ); train one for this model with dspark train-drafter"
            )
        self._target = [target.embed_tokens, target.lm_head]
        return self

    def _require_target(self) -> tuple[nn.Module, nn.Module]:
        if not self._target:
            raise RuntimeError("attach(target) before running the drafter")
        return self._target[0], self._target[1]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        embedding, _ = self._require_target()
        return F.embedding(ids, embedding.weight).to(self.fc.weight.dtype)

    def lm_logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits over the rows of ``weight`` (default: the whole LM head)."""
        if weight is None:
            weight = self._require_target()[1].weight
        return linear(hidden.to(weight.dtype), weight).float()

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` rows of the target's LM head, on the drafter's device and dtype."""
        _, head = self._require_target()
        param = self.fc.weight
        return head.weight[ids.to(head.weight.device)].to(param.device, param.dtype).contiguous()

    def linear_weights(self, head_weight: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The weights ``linear`` multiplies in a context update and a draft, in that
        order, ending with the LM head's rows drafted from (``head_weight``; default the
        whole head)."""
        weights = [self.fc.weight]
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weights += [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
            weights += [attn.o_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight]
            weights.append(mlp.down_proj.weight)
        if self.config.markov_rank:
            weights += [self.markov_in.weight, self.markov_out.weight]
        if self.config.confidence_head:
            weights.append(self.confidence.weight)
        if head_weight is None:
            head_weight = self._require_target()[1].weight
        return [*weights, head_weight]

    def set_draft_vocab(self, ids: np.ndarray | torch.Tensor | None) -> DraftModel:
        """Draft from the token ids ``ids`` only (strictly ascending), or from the whole
        vocabulary (None)."""
        if ids is None:
            self.draft_vocab = None
            return self
        ids = check_draft_vocab(ids, self.config.vocab_size)
        self.draft_vocab = torch.from_numpy(ids).to(self.fc.weight.device, torch.long)
        return self

    # ---- shared pieces ---------------------------------------------------------------------

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., n_layers · d]`` target features → ``[..., d]`` context vectors."""
        return self.context_norm(_apply(self.fc, features.to(self.fc.weight.dtype)))

    def context_kv(
        self, layer: DecoderLayer, context: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys (rotated) and values for context vectors ``[..., T, d]``."""
        attn = layer.self_attn
        shape = (*context.shape[:-1], attn.num_kv_heads, attn.head_dim)
        k = self.rotary(_apply(attn.k_proj, context).view(shape), positions)
        return k, _apply(attn.v_proj, context).view(shape)

    def block_queries(
        self, layer: DecoderLayer, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        lead = x.shape[:-1]
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        q = self.rotary(_apply(attn.q_proj, x).view(*lead, heads, dim), positions)
        k = self.rotary(_apply(attn.k_proj, x).view(*lead, kv_heads, dim), positions)
        v = _apply(attn.v_proj, x).view(*lead, kv_heads, dim)
        return q, k, v

    @staticmethod
    def finish_layer(layer: DecoderLayer, hidden: torch.Tensor, attended: torch.Tensor):
        """Residual add of the attention output, then the MLP (unfused: it trains)."""
        hidden = hidden + _apply(layer.self_attn.o_proj, attended.flatten(-2))
        mlp = layer.mlp
        x = layer.post_attention_layernorm(hidden)
        gate, up = _apply(mlp.gate_proj, x), _apply(mlp.up_proj, x)
        return hidden + _apply(mlp.down_proj, F.silu(gate) * up)

    def block_input(self, anchors: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """``[M]`` anchor tokens → ``[M, K, d]`` block inputs (anchor, then mask tokens); the
        first ``width`` positions of the block only, if given."""
        k = self.config.block_size if width is None else width
        first = self.embed(anchors).unsqueeze(1)
        masks = self.mask_embedding.to(first.dtype).expand(anchors.shape[0], k - 1, -1)
        return torch.cat([first, masks], dim=1)

    def heads(
        self,
        hidden: torch.Tensor,
        previous: torch.Tensor,
        head_weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Float32 logits ``[..., V]`` (``[..., N]`` over the rows of ``head_weight``) and
        confidence logits ``[...]`` (or None) for block outputs ``hidden`` (after the final
        norm) given the previous tokens (real token ids)."""
        inputs = [hidden]
        if self.config.markov_rank:
            memory = _apply(self.markov_in, self.embed(previous))
            inputs.append(memory)
            hidden = hidden + _apply(self.markov_out, memory)
        logits = self.lm_logits(hidden, head_weight)
        if not self.config.confidence_head:
            return logits, None
        return logits, _apply(self.confidence, torch.cat(inputs, dim=-1)).squeeze(-1).float()

    def calibration_tensors(
        self, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The calibration's per-position temperatures and shifts as ``[K]`` tensors on
        ``device`` (None where it has none): made once, they spare ``calibrated`` a copy
        to the device per call, which a CUDA graph capture cannot hold."""
        config = self.config
        scale = torch.tensor(config.calibration, device=device) if config.calibration else None
        shift = None
        if config.calibration_bias:
            shift = torch.tensor(config.calibration_bias, device=device)
        return scale, shift

    def calibrated(
        self,
        confidence_logits: torch.Tensor,
        tensors: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """Probabilities from confidence logits ``[..., K]``, with the calibration's
        per-position temperatures (and shifts) when it has them; ``tensors``: those of
        ``calibration_tensors`` on the logits' device (None: made here)."""
        scale, shift = tensors or self.calibration_tensors(confidence_logits.device)
        k = confidence_logits.shape[-1]
        if scale is not None:
            confidence_logits = confidence_logits / scale[:k]
        if shift is not None:
            confidence_logits = confidence_logits + shift[:k]
        return torch.sigmoid(confidence_logits)

    # ---- training ----------------------------------------------------------------------

    def forward_train(
        self,
        features: torch.Tensor,  # [B, T, n_layers · d] target features of the sequence
        input_ids: torch.Tensor,  # [B, T]
        anchors: torch.Tensor,  # [B, A] anchor positions
    ) -> torch.Tensor:
        """Block outputs ``[B, A, K, d]`` (after the final norm) for A anchors per
        sequence at once: block a sees the context before its anchor and itself only."""
        batch, length = input_ids.shape
        num_anchors, k = anchors.shape[1], self.config.block_size
        context = self.context(features)
        hidden = self.block_input(input_ids.gather(1, anchors).flatten())
        hidden = hidden.view(batch, num_anchors * k, -1)
        block_pos = (anchors[..., None] + torch.arange(k, device=anchors.device)).flatten(1)
        block_pos = block_pos.clamp_max(self.config.max_position - 1)
        context_pos = torch.arange(length, device=anchors.device)
        sees_context = context_pos[None, None, :] < anchors.repeat_interleave(k, 1)[..., None]
        block_id = torch.arange(num_anchors * k, device=anchors.device) // k
        same_block = (block_id[:, None] == block_id[None, :]).expand(batch, -1, -1)
        mask = torch.cat([sees_context, same_block], dim=-1).unsqueeze(1)
        for layer in self.layers:
            q, k_block, v_block = self.block_queries(layer, hidden, block_pos)
            k_ctx, v_ctx = self.context_kv(layer, context, context_pos)
            attended = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                torch.cat([k_ctx, k_block], dim=1).transpose(1, 2),
                torch.cat([v_ctx, v_block], dim=1).transpose(1, 2),
                attn_mask=mask,
                enable_gqa=self.config.num_heads != self.config.num_kv_heads,
            ).transpose(1, 2)
            hidden = self.finish_layer(layer, hidden, attended)
        return self.norm(hidden).view(batch, num_anchors, k, -1)


# ---- checkpoints ---------------------------------------------------------------------------


def save_drafter(model: DraftModel, directory: str | Path, metadata: dict | None = None) -> Path:
    """``drafter.safetensors`` (bf16, the drafter's own weights only) and ``drafter.json``
    (its config plus ``metadata``, e.g. how it was trained)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().to(torch.bfloat16).contiguous().clone()
        for name, tensor in model.state_dict().items()
        if not name.startswith("rotary")
    }
    save_file(state, str(directory / WEIGHTS_FILE))
    payload = {"config": model.config.to_dict(), "metadata": metadata or {}}
    (directory / CONFIG_FILE).write_text(json.dumps(payload, indent=1))
    return directory


def read_drafter_config(directory: str | Path) -> tuple[DrafterConfig, dict]:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {directory}; is it a drafter directory?")
    payload = json.loads(path.read_text())
    return DrafterConfig.from_dict(payload["config"]), payload.get("metadata", {})


def _write_drafter_config(directory: str | Path, config: DrafterConfig, metadata: dict) -> None:
    payload = {"config": config.to_dict(), "metadata": metadata}
    (Path(directory) / CONFIG_FILE).write_text(json.dumps(payload, indent=1))


def write_calibration(
    directory: str | Path, temperatures: list[float], biases: list[float] | None, report: dict
) -> None:
    """Store per-position temperatures and shifts (and the report) with a drafter."""
    config, metadata = read_drafter_config(directory)
    config = replace(
        config,
        calibration=tuple(float(t) for t in temperatures),
        calibration_bias=tuple(float(b) for b in biases) if biases is not None else (),
    )
    _write_drafter_config(directory, config, {**metadata, "calibration": report})


def write_draft_vocab(directory: str | Path, ids: np.ndarray, report: dict) -> Path:
    """Store a draft vocabulary (``draft_vocab.npy``, int32, ascending) with a drafter and
    its report under ``draft_vocab`` in the drafter.json metadata."""
    config, metadata = read_drafter_config(directory)
    ids = check_draft_vocab(ids, config.vocab_size).astype(np.int32)
    path = Path(directory) / DRAFT_VOCAB_FILE
    np.save(path, ids)
    _write_drafter_config(directory, config, {**metadata, "draft_vocab": report})
    return path


def read_draft_vocab(directory: str | Path) -> np.ndarray | None:
    """The draft vocabulary stored with a drafter, or None when it has none."""
    path = Path(directory) / DRAFT_VOCAB_FILE
    return np.load(path) if path.is_file() else None


def load_drafter(
    directory: str | Path,
    target: LlamaModel,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> DraftModel:
    """A saved drafter attached to ``target`` (on the target's device and dtype unless
    given)."""
    from safetensors.torch import load_file

    config, _ = read_drafter_config(directory)
    param = next(target.parameters())
    device = device or param.device
    dtype = dtype or param.dtype
    with torch.device("meta"):
        model = DraftModel(config)
    model = model.to_empty(device=device)
    state = load_file(str(Path(directory) / WEIGHTS_FILE), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary")]
    if missing or unexpected:
        raise ValueError(
            f"{directory} does not match its config: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    fresh = Rotary(config.head_dim, config.rope_theta, config.max_position)
    model.rotary.cos, model.rotary.sin = fresh.cos.to(device), fresh.sin.to(device)
    model = model.to(dtype).eval().attach(target)
    return model.set_draft_vocab(read_draft_vocab(directory))


def count_parameters(model: DraftModel) -> int:
    return sum(p.numel() for p in model.parameters())
