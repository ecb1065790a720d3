"""The drafted-step overhead line, replayed over logged GPU steps: as learnt before
session 26's changes and as learnt now.

    python scripts/depth_line_replay.py [LOG.json ...]   # default: session 26's logs

Reads per-step logs of ``scripts/gpu/tree_steps.py`` (the 8B shape at 256 on an H200),
takes adaptive's decode-only drafted steps that captured nothing, and prices each with the
saved 8B profile as ``ObservedDraftCost.record_step`` does (verify the step's tokens,
draft its depth; the drafter's measured scale taken as 1, which the logs lack): before,
at its own token count, and now, with the tokens a larger captured graph padded it by
(``padded_tokens``, logged from call 2 on). What each price missed is fed, step by step,
through a window of the last 16 such steps to the line fit of the time: every depth's
median before, and now the current ``_depth_line``, which leaves out depths seen fewer
than ``LINE_MIN_STEPS`` times beside one seen that often. Prints per run how many steps
the fitted slope exceeded 3 ms a depth (the profile's own slope at 256 is 0.63) and its
largest value. A replay, not a rerun: the steps are what the old fit's decisions
drafted, so it shows how each reads the same measurements, not what the new one would
have decided.
"""

from __future__ import annotations

import glob
import json
import sys
from collections import deque
from pathlib import Path

from dspark.engine.profiling import EngineProfile
from dspark.scheduling.cost import LINE_MIN_STEPS, OVERHEAD_WINDOW, _depth_line

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "docs/results/profiles/h200_llama3-8b_c256.json"
LOGS = ROOT / "docs/results/bench/h200/session26"
STEEP_MS = 3.0


def every_depth_line(points) -> tuple[float, float]:
    """The line as fitted until session 26, every depth's median however few steps: the
    current fit over every point repeated ``LINE_MIN_STEPS`` times (the same medians, and
    every depth seen that often)."""
    return _depth_line(deque(point for point in points for _ in range(LINE_MIN_STEPS)))


def main() -> None:
    paths = sys.argv[1:] or sorted(glob.glob(str(LOGS / "*" / "steps_*.json")))
    profile = EngineProfile.load(PROFILE)
    verify_ms, depth_ms = profile.tables.verify_ms, profile.depth_costs()
    print(f"{'log':44s} {'steps':>5s} | before: >{STEEP_MS:g} ms, max | now: >{STEEP_MS:g} ms, max")
    for path in paths:
        log = json.loads(Path(path).read_text())
        before: deque = deque(maxlen=OVERHEAD_WINDOW)
        now: deque = deque(maxlen=OVERHEAD_WINDOW)
        old, new = [], []
        for step in log["steps"]:
            n, depth = step["rounds"], step["depth"]
            decode_only = n > 0 and n == step["running"]
            if not step["label"].startswith("adaptive") or step["captured"] or not decode_only:
                continue
            if not depth:
                continue
            limit = verify_ms.shape[0] - 1
            tokens = min(step["verified"], limit)  # n decodes + drafts
            padded = min(tokens + step.get("padded_tokens", 0), limit)  # as the graph ran
            draft = float(depth_ms[depth, min(n, depth_ms.shape[1] - 1)])
            before.append((depth, step["wall_ms"] - float(verify_ms[tokens]) - draft))
            now.append((depth, step["wall_ms"] - float(verify_ms[padded]) - draft))
            old.append(every_depth_line(before)[1])
            new.append(_depth_line(now)[1])
        name = "/".join(Path(path).parts[-2:])
        steep = [sum(s > STEEP_MS for s in fit) for fit in (old, new)]
        print(
            f"{name:44s} {len(old):5d} | {steep[0]:4d} {max(old, default=0):6.1f}"
            f"       | {steep[1]:4d} {max(new, default=0):6.1f}"
        )


if __name__ == "__main__":
    main()
