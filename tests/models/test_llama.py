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


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 17])
def test_skinny_linear_matches_f_linear(rows):
    import torch.nn.functional as F

    from dspark.models.llama import ROW_MAJOR_MAX_ROWS, linear

    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 40, generator=gen)
    torch.testing.assert_close(linear(x, weight, bias), F.linear(x, weight, bias))
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight))
    # Row-major for a few rows whichever product ran: what follows runs along its rows.
    if rows <= ROW_MAJOR_MAX_ROWS:
        assert linear(x, weight).is_contiguous() and linear(x, weight, bias).is_contiguous()
    batched = x.reshape(1, rows, 40)
    assert linear(batched, weight).shape == (1, rows, 96)
    torch.testing.assert_close(linear(batched, weight), F.linear(batched, weight))


@pytest.mark.parametrize("shape", [(40,), (1, 40), (1, 1, 40)])
def test_one_row_doubled_through_the_transposed_product_matches_f_linear(monkeypatch, shape):
    import torch.nn.functional as F

    from dspark.models import llama

    gen = torch.Generator().manual_seed(len(shape))
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(*shape, generator=gen)
    calls = []
    original = torch.mm

    def spy(a, b):
        calls.append(tuple(b.shape))
        return original(a, b)

    monkeypatch.setitem(llama._ROW_PLAN, (96, 40), (False, True, False))
    monkeypatch.setattr(llama.torch, "mm", spy)
    out = llama.linear(x, weight, bias)
    assert calls == [(40, 2)]  # the row twice, one product
    assert out.shape == (*shape[:-1], 96)
    torch.testing.assert_close(out, F.linear(x, weight, bias))


def test_tune_small_rows_keeps_the_faster_product_per_row_count(monkeypatch):
    """A scripted clock: F.linear is faster at 2 and 3 rows and at 64, weight @ x.T at the
    counts timed in between. Calls come as (start, end) pairs per row count timed, repeat
    and product (F.linear first). A count not timed takes the next timed one's choice."""
    import torch.nn.functional as F

    from dspark.models import llama

    weights = [torch.randn(24, 40), torch.randn(40, 24)]
    blas = {2, 3, 64}
    ticks = []
    for rows in llama.TUNED_ROWS:
        for _ in range(2):
            ticks += [1.0, 2.0] if rows in blas else [2.0, 1.5]
    now, calls = [0.0], [0]

    def clock():
        if calls[0] % 2:  # an end: the scripted sweep has run
            now[0] += ticks[calls[0] // 2]
        calls[0] += 1
        return now[0]

    try:
        assert llama.tune_small_rows(weights, clock=clock) == blas
        assert calls[0] == 2 * len(ticks)
        # Measured once per weight set: a second engine on the model reads the answer.
        assert llama.tune_small_rows(weights, clock=clock) == blas
        assert calls[0] == 2 * len(ticks)
        seen = []
        original = F.linear

        def spy(x, w, b=None):
            seen.append(x.shape[0])
            return original(x, w, b)

        monkeypatch.setattr(llama.F, "linear", spy)
        # 5 takes 6's choice, 20 takes 24's, 50 takes 64's; 65 is past the plan.
        for rows in (1, 2, 3, 4, 5, 20, 48, 50, 64, 65):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(llama.linear(x, weights[0]), original(x, weights[0]))
        assert seen == [2, 3, 50, 64, 65]  # one row, doubled, measured faster than F.linear
        plan = llama.row_plan((24, 40))
        assert plan[1] is True and plan[2] is False and plan[20] is True
        llama.forget_small_rows(weights)  # back to weight @ x.T for 2 ... 16 rows
        assert llama.row_plan((24, 40)) is None
        seen.clear()
        for rows in (1, 2, 16, 17):
            llama.linear(torch.randn(rows, 40), weights[0])
        assert seen == [1, 17]
    finally:
        llama.forget_small_rows(weights)
        for key in [k for k in llama._TUNED if k[0] == ((24, 40), (40, 24))]:
            del llama._TUNED[key]
