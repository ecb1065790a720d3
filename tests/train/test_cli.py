"""``dspark train-drafter`` from the command line, on the real SmolLM2 target."""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import load_file

from dspark.cli import main
from dspark.engine.shipped import SHIPPED_DIR
from dspark.models.drafter import read_drafter_config
from dspark.train.data import DistillSet


def write_splits(directory, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    for split in ("train", "calib", "eval"):
        prompts = [rng.integers(1, 49152, 6).tolist() for _ in range(3)]
        answers = [rng.integers(1, 49152, 20).tolist() for _ in range(3)]
        DistillSet.build(prompts, answers).save(directory / f"{split}.npz")


def test_init_starts_from_the_shipped_drafter_and_drops_its_calibration(tmp_path, smollm2):
    write_splits(tmp_path / "data")
    argv = ["train-drafter", "--device", "cpu", "--dtype", "float32", "--data"]
    argv += [str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--init", "shipped"]
    # a step too small to move a bf16 weight; --layers loses to the shipped shape
    argv += ["--steps", "1", "--lr", "1e-12", "--batch-size", "2", "--max-length", "32"]
    assert main([*argv, "--layers", "3", "--anchors", "4"]) == 0

    (shipped,) = [d for d in SHIPPED_DIR.iterdir() if (d / "drafter.json").is_file()]
    old, _ = read_drafter_config(shipped)
    new, metadata = read_drafter_config(tmp_path / "run")
    assert old.calibration and not new.calibration and not new.calibration_bias
    assert new.num_layers == old.num_layers == 2
    assert metadata["init"] == "shipped"
    before = load_file(str(shipped / "drafter.safetensors"))
    after = load_file(str(tmp_path / "run" / "drafter.safetensors"))
    assert before.keys() == after.keys()
    for name, weight in before.items():
        assert torch.equal(weight, after[name]), name
