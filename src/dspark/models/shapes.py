"""Named model shapes with random weights: real GPU timing of a large architecture when
its weights are not available (or not needed, as when acceptance is replayed).

A random-weight model computes exactly the work of the real one (same shapes, same
kernels); only its outputs are meaningless, so anything that depends on what it predicts
(acceptance of drafts) has to come from elsewhere (``dspark.engine.replay``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from dspark.models.config import ModelConfig
from dspark.models.llama import LlamaModel
from dspark.models.loader import LoadedModel

SHAPES: dict[str, ModelConfig] = {
    # Meta-Llama-3-8B's config.json (rope_theta 500000, no RoPE scaling, untied head).
    "llama3-8b": ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position=8192,
    ),
    # SmolLM2-135M-Instruct's config.json: a GPU timing of the embedded default's shape
    # on a machine that does not have its weights (tied head, as the model).
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        max_position=8192,
        tie_word_embeddings=True,
    ),
    # A small shape for tests and CPU smoke runs of the same code path.
    "tiny": ModelConfig(
        vocab_size=49152,  # the SmolLM2 tokenizer's ids (the prompts) stay valid
        hidden_size=64,
        intermediate_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=2048,
    ),
}


class NullTokenizer:
    """What the engine asks of a tokenizer, for a model that has none: prompts are token
    ids, text is empty, nothing is an end-of-turn token."""

    unk_token_id = None

    def encode(self, text: str) -> list[int]:
        raise ValueError("this model has no tokenizer: pass prompts as token ids")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""

    def convert_tokens_to_ids(self, token: str) -> None:
        return None


def randomise_(module: torch.nn.Module, seed: int, residual_std: float = 0.02) -> None:
    """Fill ``module``'s parameters in place: norm weights 1, everything else normal with
    std 0.02, except the projections back into the residual stream (``o_proj``,
    ``down_proj``), which get ``residual_std``."""
    device = next(module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                small = name.endswith(("o_proj.weight", "down_proj.weight"))
                param.normal_(0.0, residual_std if small else 0.02, generator=generator)


def random_model(
    shape: str,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> LoadedModel:
    """A ``LoadedModel`` of the named shape with random weights (normal, std 0.02, the
    output projections scaled down by depth so activations stay finite in bf16)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(sorted(SHAPES))}")
    config = SHAPES[shape]
    with torch.device("meta"):
        net = LlamaModel(config)
    net = net.to_empty(device=device)
    net.load_weights({})  # ties the head if the shape does and builds the RoPE tables
    randomise_(net, seed, residual_std=0.02 / math.sqrt(2 * config.num_layers))
    net = net.to(device=device, dtype=dtype).eval()  # the RoPE tables were built on the CPU
    return LoadedModel(net, NullTokenizer(), config, Path(f"random:{shape}"))
