"""``dspark roofline``: the work a step must do, counted by hand; the probes and the run
end to end on a small shape."""

import json

import pytest
import torch

from dspark.bench.roofline import (
    StepWork,
    copy_bandwidth,
    decode_room,
    engine_decode_ms,
    gemm_peak,
    kernel_class,
    step_work,
)
from dspark.cli import main
from dspark.models.config import ModelConfig


def test_step_work_counts_weights_once_and_every_cached_key():
    config = ModelConfig(
        vocab_size=100,
        hidden_size=8,
        intermediate_size=16,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=2,
    )
    # 3 requests of 2 new tokens over 10 cached, bf16, 1,000 multiplied weights.
    work = step_work(config, weight_params=1000, element_bytes=2, num_reqs=3, query=2, context=10)
    per_token = 2 * 2 * 2 * 2 * 2  # layers x (key, value) x kv heads x head dim x bytes
    assert per_token == 32
    assert work.weight_bytes == 2000
    assert work.kv_read_bytes == 3 * 10 * 32
    assert work.kv_write_bytes == 6 * 32
    assert work.bytes == 2000 + 960 + 192
    # Products: 2 x 1,000 x 6 tokens; attention: each request's tokens see 11 and 12
    # keys, QK and PV are 2 FLOPs a multiply-add each: 4 x layers x heads x dim x keys.
    assert work.flops == 12_000 + 4 * 2 * 4 * 2 * 3 * (11 + 12)


def test_the_bound_is_the_larger_of_bytes_and_flops():
    work = StepWork(weight_bytes=900, kv_read_bytes=90, kv_write_bytes=10, flops=5e3)
    assert work.bound_ms(bandwidth=1e6, peak=1e9) == pytest.approx(1.0)  # bytes: 1 ms
    assert work.bound_ms(bandwidth=1e9, peak=1e6) == pytest.approx(5.0)  # FLOPs: 5 ms


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("mkldnn::_linear_pointwise", "gemm"),
        ("aten::mm", "gemm"),
        ("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNT", "gemm"),
        ("void gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16>", "gemm"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
        ("void at::native::reduce_kernel<512, 1, ReduceOp<float, ArgMaxOps<float>>>", "sampling"),
        ("Memcpy DtoH (Device -> Pinned)", "copies"),
        ("aten::index_select", "copies"),
        (
            "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>",
            "norm, rotary, activations",
        ),
        ("aten::rms_norm", "norm, rotary, activations"),
        ("cudaLaunchKernel", "other"),
    ],
)
def test_kernels_fall_into_their_class(name, cls):
    assert kernel_class(name) == cls


def test_engine_steps_are_timed_with_every_request_decoding(tiny):
    """A prefill of 6 x 40 tokens in steps of 32 takes many steps while the first requests
    already decode: the room asked for keeps every request decoding to the last timed step,
    and too little room is refused rather than timing a shrinking batch."""
    from dspark.engine.config import EngineConfig
    from dspark.engine.engine import LLMEngine

    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=32, kv_cache_tokens=6 * 128)
    engine = LLMEngine(tiny, config)
    room = decode_room(6, 40, repeats=3, step_tokens=32)
    assert room >= 6 * 41 // 26 + 3
    decoding = []
    step = engine.step

    def counted():
        out = step()
        decoding.append(sum(r.num_computed >= 40 for r in engine.requests.values()))
        return out

    engine.step = counted
    assert len(engine_decode_ms(engine, 6, 40, 3, room)) == 3
    assert decoding[-3:] == [6, 6, 6]
    assert not engine.requests and not engine.has_unfinished()
    with pytest.raises(RuntimeError, match="max_tokens"):
        engine_decode_ms(engine, 6, 40, 3, 4)
    assert not engine.requests and not engine.has_unfinished()


def test_probes_measure_a_positive_rate_on_the_cpu():
    cpu = torch.device("cpu")
    assert 1e8 < copy_bandwidth(cpu, 16 << 20, 3) < 1e13
    assert 1e7 < gemm_peak(cpu, torch.float32, 128, 3) < 1e14


def test_roofline_runs_end_to_end_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "roofline"
    argv = ["roofline", "--shape", "tiny", "--concurrency", "1", "3", "--context", "40"]
    argv += ["--k", "2", "--repeats", "3", "--trace", "--copy-mib", "16", "--gemm-n", "128"]
    assert main([*argv, "--out-dir", str(out)]) == 0
    payload = json.loads((out / "roofline_tiny_cpu.json").read_text())
    assert (out / "roofline_tiny_cpu.png").stat().st_size > 0
    rows = payload["rows"]
    assert [(r["kind"], r["num_reqs"], r["tokens"]) for r in rows] == [
        ("decode", 1, 1),
        ("verify", 1, 3),
        ("decode", 3, 3),
        ("verify", 3, 9),
    ]
    for row in rows:
        assert len(row["step_ms_runs"]) == 3 and row["step_ms"] > 0
        assert 0 < row["fraction"] < 1  # no step beats the hardware
        assert row["device_ms"] and row["host_ms"] >= 0
        assert (row["engine_ms"] is not None) == (row["kind"] == "decode")
    assert "gemm" in rows[0]["device_ms"] and "attention" in rows[0]["device_ms"]
    printed = capsys.readouterr().out
    assert "copy bandwidth" in printed and "of bound" in printed


def test_roofline_refuses_bad_arguments(capsys):
    assert main(["roofline", "--shape", "tiny", "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_roofline_times_the_drafters_proposal_for_the_verify_steps(tmp_path):
    out = tmp_path / "roofline"
    argv = ["roofline", "--shape", "tiny", "--concurrency", "2", "--context", "24", "--k", "3"]
    argv += ["--repeats", "2", "--drafter", "ngram", "--copy-mib", "16", "--gemm-n", "128"]
    assert main([*argv, "--out-dir", str(out)]) == 0
    rows = json.loads((out / "roofline_tiny_cpu.json").read_text())["rows"]
    assert [(r["kind"], r["drafter_ms"] is not None) for r in rows] == [
        ("decode", False),
        ("verify", True),
    ]
    assert rows[1]["drafter_ms"] >= 0
