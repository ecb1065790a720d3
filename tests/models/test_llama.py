import numpy as np
import pytest
import torch

from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.models.loader import load_model
from tests.conftest import make_tiny_model

transformers = pytest.importorskip("transformers")


def packed_logits(loaded, sequences, cached=None):
    """Logits of every token of several sequences, computed in one packed forward."""
    cache = PagedKVCache(loaded.config, 64, 8)
    tables = [BlockTable() for _ in sequences]
    for table, seq in zip(tables, sequences, strict=True):
        assert cache.reserve(table, len(seq))
    lengths = np.array([len(s) for s in sequences])
    batch = cache.attention_batch(tables, np.zeros(len(sequences), dtype=np.int64), lengths)
    ids = torch.tensor([t for s in sequences for t in s])
    positions = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]))
    with torch.inference_mode():
        hidden, _ = loaded.model(ids, positions, batch, cache.layers)
        logits = loaded.model.logits(hidden)
    return list(torch.split(logits, lengths.tolist()))


def hf_logits(path, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # llama with grouped-query attention
        {"model_type": "qwen2", "attention_bias": True, "tie_word_embeddings": True},
        {"model_type": "qwen3", "num_key_value_heads": 4},
    ],
)
def test_logits_match_transformers_on_random_weights(tmp_path, overrides):
    loaded = make_tiny_model(tmp_path / "m", **overrides)
    reloaded = load_model(tmp_path / "m", tokenizer=loaded.tokenizer)  # as users load a dir
    ids = list(range(3, 40))
    expected = hf_logits(tmp_path / "m", ids)
    for model in (loaded, reloaded):
        got = packed_logits(model, [ids])[0]
        assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got - expected).abs().max()


def test_logits_match_transformers_on_smollm2(smollm2):
    ids = smollm2.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    expected = hf_logits(smollm2.path, ids)
    got = packed_logits(smollm2, [ids])[0]
    # fp32: logits are ~30 in magnitude; 2e-4 is float32 rounding over 30 layers.
    assert (got - expected).abs().max() < 2e-4


def test_packed_requests_equal_separate_forwards(tiny):
    sequences = [list(range(5, 30)), [7, 8, 9], list(range(100, 140))]
    together = packed_logits(tiny, sequences)
    for seq, logits in zip(sequences, together, strict=True):
        alone = packed_logits(tiny, [seq])[0]
        assert torch.allclose(logits, alone, atol=1e-5)


def test_incremental_decode_with_rollback_matches_full_forward(tiny):
    ids = list(range(10, 50))
    full = packed_logits(tiny, [ids])[0]
    cache = PagedKVCache(tiny.config, 16, 4)
    table = BlockTable()
    assert cache.reserve(table, len(ids) + 8)
    done = 0
    with torch.inference_mode():
        for step, count in enumerate([7, 1, 5, 1, 26]):
            chunk = ids[done : done + count]
            if step == 2:  # write 5 junk "drafts" first, then roll them back (O(1): no-op)
                junk = [3, 3, 3, 3, 3]
                batch = cache.attention_batch([table], np.array([done]), np.array([5]))
                tiny.model(torch.tensor(junk), torch.arange(done, done + 5), batch, cache.layers)
            batch = cache.attention_batch([table], np.array([done]), np.array([count]))
            hidden, _ = tiny.model(
                torch.tensor(chunk), torch.arange(done, done + count), batch, cache.layers
            )
            assert torch.allclose(tiny.model.logits(hidden), full[done : done + count], atol=1e-5)
            done += count


def test_unsupported_models_are_clear_errors():
    from dspark.models.config import ModelConfig
    from tests.conftest import tiny_config

    with pytest.raises(ValueError, match="not supported"):
        ModelConfig.from_hf(tiny_config(model_type="gpt2"))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig.from_hf(tiny_config(num_key_value_heads=3))
    with pytest.raises(FileNotFoundError, match="neither"):
        load_model("/nonexistent/model")


def test_captured_layer_outputs_match_transformers_hidden_states(tmp_path):
    loaded = make_tiny_model(tmp_path / "m", num_hidden_layers=4)
    ids = list(range(20, 45))
    cache = PagedKVCache(loaded.config, 8, 8)
    table = BlockTable()
    assert cache.reserve(table, len(ids))
    batch = cache.attention_batch([table], np.array([0]), np.array([len(ids)]))
    with torch.inference_mode():
        _, captured = loaded.model(
            torch.tensor(ids), torch.arange(len(ids)), batch, cache.layers, capture_layers=(0, 2)
        )
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    with torch.inference_mode():
        states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    # hidden_states[i + 1] is the output of layer i (before the final norm).
    assert torch.allclose(captured[0], states[1][0], atol=1e-5)
    assert torch.allclose(captured[1], states[3][0], atol=1e-5)
