import subprocess
import sys

import pytest


def test_generate_prints_text_and_a_stats_line(smollm2):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dspark.cli",
            "generate",
            "--prompt",
            "What is the capital of France?",
            "--spec",
            "fixed",
            "--k",
            "3",
            "--max-tokens",
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Paris" in out.stdout
    stats = [line for line in out.stderr.splitlines() if line.startswith("[dspark]")]
    assert stats and "tok/s" in stats[0] and "acceptance length" in stats[0]


def test_generate_reports_bad_input_as_an_error(smollm2):
    out = subprocess.run(
        [sys.executable, "-m", "dspark.cli", "generate", "--prompt", "hi", "--temperature", "-1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "temperature must be" in out.stderr


def test_profile_round_trip(tmp_path, tiny):
    from dspark.engine.config import EngineConfig
    from dspark.engine.engine import LLMEngine
    from dspark.engine.profiling import EngineProfile

    path = tmp_path / "profile.json"
    config = EngineConfig(
        spec="adaptive",
        num_drafts=2,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        profile_path=str(path),
    )
    engine = LLMEngine(tiny, config)
    assert path.is_file()
    profile = EngineProfile.load(path)
    assert profile.matches(engine.runner, engine.drafter, 2)
    sizes = sorted({s.num_target_tokens for s in profile.samples})
    # Eager: every size up to 8 (a lone request's verify steps), then every power of two
    # up to the batch limit.
    assert sizes == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]
    # A restart reads the file instead of profiling again.
    before = path.stat().st_mtime_ns
    LLMEngine(tiny, config)
    assert path.stat().st_mtime_ns == before
    # Products under another small-row plan cost otherwise: that profile is not this one's.
    from dspark.ops.linear import forget_small_rows, tune_small_rows

    assert profile.row_plan is not None
    forget_small_rows(tiny.model.linear_weights())
    assert not profile.matches(engine.runner, engine.drafter, 2)
    tune_small_rows(tiny.model.linear_weights())  # the plan measured before, kept per model
    assert profile.matches(engine.runner, engine.drafter, 2)
    # A drafter whose block pass is cut to each depth drafts at other prices.
    assert not profile.block_cut
    engine.drafter.block_cut = True
    assert not profile.matches(engine.runner, engine.drafter, 2)
    engine.drafter.block_cut = False
    assert profile.matches(engine.runner, engine.drafter, 2)
    # Attention read in place (KV regions, on by default on the CPU) costs otherwise.
    assert profile.kv_regions and engine.runner.kv_regions == 4
    engine.runner.kv_regions = 0
    assert not profile.matches(engine.runner, engine.drafter, 2)
    engine.runner.kv_regions = 4
    assert profile.matches(engine.runner, engine.drafter, 2)
    # Split over ranks, every step costs otherwise (all-reduces, a share of the work).
    import dataclasses

    split = dataclasses.replace(profile, tensor_parallel_size=2)
    assert not split.matches(engine.runner, engine.drafter, 2)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="cannot read the engine profile"):
        EngineProfile.load(bad)


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
def test_generate_bench_and_serve_take_a_tensor_parallel_size(command):
    from dspark.cli import build_parser

    prompt = ["--prompt", "hi"] if command == "generate" else []
    args = build_parser().parse_args([command, *prompt, "--tensor-parallel-size", "2"])
    assert args.tensor_parallel_size == 2


def test_bench_refuses_a_random_shape_split_over_ranks(capsys):
    from dspark.cli import main

    assert main(["bench", "--shape", "tiny", "--tensor-parallel-size", "2"]) == 2
    assert "--tensor-parallel-size needs a model directory" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_with_two_ranks_prints_what_one_process_prints(smollm2):
    """Adaptive verification, profiled at start-up (about a minute per rank count)."""

    def generate(*extra: str) -> str:
        command = [sys.executable, "-m", "dspark.cli", "generate", "--max-tokens", "32"]
        command += ["--prompt", "Write a haiku about the sea.", "--spec", "adaptive", *extra]
        out = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    assert generate("--tensor-parallel-size", "2") == generate()
