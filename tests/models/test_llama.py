import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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

    monkeypatch.setitem(llama._ROW_PLAN, (96, 40), (0, 2, -2))
    monkeypatch.setattr(llama.torch, "mm", spy)
    out = llama.linear(x, weight, bias)
    assert calls == [(40, 2)]  # the row twice, one product
    assert out.shape == (*shape[:-1], 96)
    torch.testing.assert_close(out, F.linear(x, weight, bias))


def test_plan_from_times_pads_only_to_a_clearly_faster_larger_count():
    """Hand-made times ([F.linear, weight @ x.T] per count timed): 3 runs slower than 4,
    8 and 12 slower than 16 (by more than PAD_GAIN), 2 within it of 4's time, 24
    F.linear's and 48 faster than 24 but by less than PAD_GAIN; targets are multiples of
    PAD_MULTIPLE only."""
    from dspark.models.llama import PAD_GAIN, PAD_MULTIPLE, plan_from_times

    assert (PAD_GAIN, PAD_MULTIPLE) == (0.9, 4)
    best = {
        1: [60.0, 40.0],  # weight @ x.T (the row padded to two)
        2: [50.0, 36.0],
        3: [70.0, 49.0],  # 4 is faster: padded to 4
        4: [80.0, 39.0],
        8: [90.0, 84.0],  # 16 is faster: padded to 16, and 5-7 with it
        12: [95.0, 89.0],
        16: [99.0, 74.0],
        24: [90.0, 96.0],  # F.linear over its own rows; 48's 88 is not 5% faster
        48: [88.0, 120.0],
    }
    plan = plan_from_times(best)
    assert len(plan) == 49
    assert plan[1] == 2 and plan[2] == 2  # one row padded to two, as timed; two as itself
    assert plan[3] == 4 and plan[4] == 4
    assert plan[5:9] == (16, 16, 16, 16)  # 5-7 follow 8, padded to 16
    assert plan[9:13] == (16, 16, 16, 16)
    assert plan[13:17] == (13, 14, 15, 16)  # as 16: weight @ x.T over their own rows
    assert plan[17:25] == tuple(-n for n in range(17, 25))  # as 24: F.linear, unpadded
    assert plan[25:49] == tuple(-n for n in range(25, 49))
    # No larger multiple of 4 timed: nothing is padded.
    flat = plan_from_times({1: [10.0, 20.0], 2: [10.0, 9.6], 3: [10.0, 9.7]})
    assert flat == (0, -1, 2, 3)
    # 6 is much faster than 5 but not a multiple of 4; 8 is not faster by PAD_GAIN: 5 and
    # 6 as themselves. At exactly PAD_GAIN of its time, 7 pads to 8.
    odd = plan_from_times({5: [50.0, 46.0], 6: [50.0, 30.0], 7: [60.0, 50.0], 8: [60.0, 45.0]})
    assert odd[5:] == (5, 6, 8, 8)


def test_tune_small_rows_times_every_count_and_pads_where_measured_faster(monkeypatch):
    """A scripted clock: weight @ x.T takes 1 + rows / 20 and F.linear 1 more, but 9 rows
    take 2.5 either way (so 9 pads to 12, the fastest multiple of 4 above, at 1.6) and
    F.linear at 64 takes 3.5 (against 4.2). Calls come as (start, end) pairs per repeat,
    count and product (F.linear first): every count once a round."""
    import torch.nn.functional as F

    from dspark.models import llama

    weights = [torch.randn(24, 40), torch.randn(40, 24)]
    ticks = []
    for _ in range(2):  # two repeats
        for rows in llama.TUNED_ROWS:
            pair = [2.0 + rows / 20, 1.0 + rows / 20]
            if rows == 9:
                pair = [2.5, 2.5]
            elif rows == 64:
                pair = [3.5, 4.2]
            ticks += pair
    now, calls = [0.0], [0]

    def clock():
        if calls[0] % 2:  # an end: the scripted sweep has run
            now[0] += ticks[calls[0] // 2]
        calls[0] += 1
        return now[0]

    try:
        assert llama.tune_small_rows(weights, clock=clock) == {64}
        assert calls[0] == 2 * len(ticks)
        # Measured once per weight set: a second engine on the model reads the answer.
        assert llama.tune_small_rows(weights, clock=clock) == {64}
        assert calls[0] == 2 * len(ticks)
        plan = llama.row_plan((24, 40))
        assert plan[1] == 2 and plan[2:9] == tuple(range(2, 9))
        assert plan[9] == 12 and plan[10] == 10
        assert plan[17:25] == tuple(range(17, 25))  # as 24: their own rows
        assert plan[49:65] == tuple(-n for n in range(49, 65))  # as 64: F.linear
        assert llama.row_plan((40, 24)) == plan
        columns, seen = [], []
        mm, f_linear = torch.mm, F.linear

        def spy_mm(a, b):
            columns.append(b.shape[1])
            return mm(a, b)

        def spy_linear(x, w, b=None):
            seen.append(x.shape[0])
            return f_linear(x, w, b)

        monkeypatch.setattr(llama.torch, "mm", spy_mm)
        monkeypatch.setattr(llama.F, "linear", spy_linear)
        for rows in (1, 3, 9, 20, 50, 64, 65):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(llama.linear(x, weights[0]), f_linear(x, weights[0]))
        assert columns == [2, 3, 12, 20]  # one row padded to two, 9 to 12
        assert seen == [50, 64, 65]  # F.linear as timed at 64; 65 past the plan
        columns.clear()
        llama.forget_small_rows(weights)  # back to weight @ x.T for 2 ... 16 rows
        assert llama.row_plan((24, 40)) is None
        seen.clear()
        for rows in (1, 2, 16, 17):
            llama.linear(torch.randn(rows, 40), weights[0])
        assert seen == [1, 17] and columns == [2, 16]  # the default: 2 ... 16 transposed
    finally:
        llama.forget_small_rows(weights)
        for key in [k for k in llama._TUNED if k[0] == ((24, 40), (40, 24))]:
            del llama._TUNED[key]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 20),
    extra=st.integers(0, 12),
    transposed=st.booleans(),
    leading=st.sampled_from([(), (1,)]),
    with_bias=st.booleans(),
)
def test_padded_products_match_f_linear(rows, extra, transposed, leading, with_bias):
    """Whatever the plan pads a row count to, and with either product, ``linear`` gives
    F.linear's rows: the zero rows added never reach the output."""
    import torch.nn.functional as F

    from dspark.models import llama

    gen = torch.Generator().manual_seed(rows * 31 + extra)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(*leading, rows, 40, generator=gen)
    size = rows + extra
    plan = [0] * (rows + 1)
    plan[rows] = size if transposed else -size
    if transposed and size == 1:
        plan[rows] = 2
    saved = llama._ROW_PLAN.get((96, 40))
    llama._ROW_PLAN[(96, 40)] = tuple(plan)
    try:
        b = bias if with_bias else None
        out = llama.linear(x, weight, b)
        assert out.shape == (*leading, rows, 96)
        torch.testing.assert_close(out, F.linear(x, weight, b))
        if transposed and rows <= llama.ROW_MAJOR_MAX_ROWS:
            assert out.is_contiguous()
    finally:
        if saved is None:
            llama._ROW_PLAN.pop((96, 40), None)
        else:
            llama._ROW_PLAN[(96, 40)] = saved
