"""Model configuration: the Llama family (Llama 2/3, SmolLM2, Qwen2/2.5, Qwen3)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k
    eos_token_ids: tuple[int, ...] = ()
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """From a Hugging Face ``config.json`` of a Llama-family model."""
        model_type = hf.get("model_type", "llama")
        if model_type not in ("llama", "qwen2", "qwen3", "mistral"):
            raise ValueError(
                f"model_type {model_type!r} is not supported; dspark runs llama, qwen2, qwen3 "
                "and mistral decoders"
            )
        heads = hf["num_attention_heads"]
        rope = hf.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        if (rope.get("rope_type") or "default") != "default" or hf.get("rope_scaling"):
            raise ValueError("RoPE scaling is not supported yet; use a model with plain RoPE")
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta),
            max_position=hf.get("max_position_embeddings", 8192),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", model_type == "qwen2"),
            qk_norm=model_type == "qwen3",
            eos_token_ids=eos_ids,
            model_type=model_type,
        )

    def to_dict(self) -> dict:
        return asdict(self)
