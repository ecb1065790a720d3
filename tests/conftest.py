"""Shared fixtures: a tiny random Llama with a byte tokenizer, and the default model."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


class ByteTokenizer:
    """Token ids 0..255 are bytes; 256 is end-of-sequence."""

    unk_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")

    def convert_tokens_to_ids(self, token: str):
        return None


def tiny_config(**overrides) -> dict:
    config = {
        "model_type": "llama",
        "vocab_size": 260,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "eos_token_id": 256,
    }
    config.update(overrides)
    return config


def make_tiny_model(tmp_path, seed: int = 0, **overrides):
    """A random HF checkpoint directory and the dspark model loaded from it."""
    from safetensors.torch import save_file

    from dspark.models.config import ModelConfig
    from dspark.models.llama import LlamaModel
    from dspark.models.loader import LoadedModel

    hf = tiny_config(**overrides)
    config = ModelConfig.from_hf(hf)
    torch.manual_seed(seed)
    model = LlamaModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.4 if "embed" in name else 0.15)
    state = {
        f"model.{k}" if not k.startswith("lm_head") else k: v.clone()
        for k, v in model.state_dict().items()
        if not k.startswith("rotary")
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return LoadedModel(model.eval(), ByteTokenizer(), config, tmp_path)


@pytest.fixture
def tiny(tmp_path):
    return make_tiny_model(tmp_path / "tiny")


@pytest.fixture(scope="session")
def smollm2():
    """The default model (converted from its GGUF file once per cache directory)."""
    from dspark.models.loader import load_model

    try:
        return load_model()
    except FileNotFoundError as error:
        pytest.skip(str(error))


def engine_config(**fields):
    """An ``EngineConfig`` from flat keyword arguments: ``AdaptiveConfig``'s fields go to
    its ``adaptive`` settings, the others to the engine's."""
    from dataclasses import fields as fields_of

    from dspark.engine.config import AdaptiveConfig, EngineConfig

    names = {f.name for f in fields_of(AdaptiveConfig)}
    adaptive = {k: fields.pop(k) for k in list(fields) if k in names}
    return EngineConfig(**fields, adaptive=AdaptiveConfig(**adaptive))


def pytest_collection_modifyitems(config, items):
    """``slow`` tests run only when asked for (``-m slow``)."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
