"""``dspark bench --step-log``: every measured step of every run, written to steps.json."""

from __future__ import annotations

import json
from pathlib import Path

from dspark.bench.measurement import Measurement
from dspark.engine.engine import LLMEngine
from dspark.engine.stats import STEP_FIELDS


class StepLog:
    """``--step-log``: every measured run's steps (``EngineStats.step_log``, fields
    ``STEP_FIELDS``), rewritten to ``path`` after each run so an interrupted bench keeps
    what it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: list[dict] = []

    def add(self, result: Measurement, repeat: int, engine: LLMEngine) -> None:
        rows = list(engine.stats.step_log)
        if len(rows) < engine.stats.num_steps:
            print(
                f"[dspark] --step-log: {result.label} at {result.concurrency} ran "
                f"{engine.stats.num_steps} steps; the log keeps the last {len(rows)}"
            )
        self.runs.append(
            {
                "label": result.label,
                "concurrency": result.concurrency,
                "repeat": repeat,
                "fields": list(STEP_FIELDS),
                "steps": [
                    [round(v, 4) if isinstance(v, float) else v for v in row] for row in rows
                ],
            }
        )
        self.path.write_text(json.dumps(self.runs))
