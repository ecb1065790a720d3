"""Data files shipped inside the package (measured cost surfaces, published figures)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

H200_COST_SURFACE = "h200_llama8b_cost_surface.json"
PUBLISHED_ACCEPTANCE = "published_acceptance.json"


def load_json(name: str) -> Any:
    """A JSON file from ``dspark/data``."""
    path = resources.files("dspark") / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"dspark ships no data file named {name!r}")
    return json.loads(path.read_text())
