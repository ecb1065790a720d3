"""The DSpark drafters shipped with the package (``SHIPPED_DIR``) and the lookup of the one
built for a target model (``find_drafter``)."""

from __future__ import annotations

from pathlib import Path

from dspark.models.config import ModelConfig
from dspark.models.drafter import CONFIG_FILE, read_drafter_config

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "drafters"


def find_drafter(target: ModelConfig, required: bool = False) -> Path | None:
    """The shipped drafter built for a target of this shape, or None (an error with
    ``required``)."""
    for directory in sorted(SHIPPED_DIR.glob("*")):
        if (directory / CONFIG_FILE).is_file() and read_drafter_config(directory)[0].matches(
            target
        ):
            return directory
    if required:
        raise ValueError(
            "no shipped DSpark drafter matches this model; train one with "
            "dspark train-drafter and pass its directory, or use --drafter ngram"
        )
    return None
