"""The drafter's context updates held back on undrafted steps, and what catching up costs.

Only a drafting step needs the drafter's context complete, so a step that decided not to
draft keeps the target features of the positions it kept and hands them to the drafter
later in one batched call: before the next drafting step, or once ``DEFER_LIMIT`` steps
are held. The drafter ends exactly as if it had observed every step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from dspark.engine.request import Request

DEFER_LIMIT = 32
"""Most undrafted steps whose drafter context updates are held back at once."""

UPKEEP_DECAY = 0.25
"""Weight of the latest catch-up in the running cost of one held step's upkeep."""


class DeferredUpkeep:
    """Held-back ``observe`` calls of one drafter, in order, and their measured cost."""

    def __init__(self, drafter, device: torch.device) -> None:
        self.drafter = drafter
        self.device = device
        # Per held step: (request, start, count, preemptions when held) and its features.
        self._held: list[tuple[list[tuple[Request, int, int, int]], torch.Tensor]] = []
        # Catch-ups run in the step under way: host ms, CUDA events or None, steps caught up.
        self._flushes: list[tuple[float, tuple | None, int]] = []
        # What catching up one held step costs (ms, a running average; None until measured):
        # the price an undrafted step's own wall time lacks.
        self.ms_per_step: float | None = None

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, kept: Sequence[tuple[Request, int, int, int]], features: torch.Tensor) -> None:
        """Keep one step's update (``kept``: request, start, row, count) for later; catch up
        at once when ``DEFER_LIMIT`` steps are held."""
        items = [(r, start, count, r.num_preemptions) for r, start, _, count in kept]
        self._held.append((items, features))
        if len(self._held) >= DEFER_LIMIT:
            self.flush_timed()

    def clear(self) -> None:
        """Forget what is held (every request it was for has finished)."""
        self._held.clear()

    def flush_timed(self) -> None:
        """``flush``, timed: host time on the CPU, device time on CUDA."""
        if not self._held:
            return
        steps = len(self._held)
        start = time.perf_counter()
        events = None
        if self.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        self.flush()
        if events is not None:
            events[1].record()
        self._flushes.append(((time.perf_counter() - start) * 1e3, events, steps))

    def take_cost(self) -> float:
        """Milliseconds of catch-up in the step under way, and the running cost of one held
        step's. On CUDA a catch-up queued on an idle device delays the step by its device
        time, not its launches; the step waits for it here so its time stays in this step."""
        cost = 0.0
        for host_ms, events, steps in self._flushes:
            flush_ms = host_ms
            if events is not None:
                events[1].synchronize()
                flush_ms = events[0].elapsed_time(events[1])
            cost += flush_ms
            per_step = flush_ms / steps
            last = self.ms_per_step
            self.ms_per_step = per_step if last is None else last + UPKEEP_DECAY * (per_step - last)
        self._flushes.clear()
        return cost

    def flush(self) -> None:
        """Hand the drafter every held update in one call; requests finished or preempted
        since are skipped (the drafter has forgotten them)."""
        if not self._held:
            return
        requests, starts, counts, pieces = [], [], [], []
        for items, selected in self._held:
            live = [
                i
                for i, (r, _, _, preemptions) in enumerate(items)
                if not r.is_finished and r.num_preemptions == preemptions
            ]
            if not live:
                continue
            if len(live) < len(items):
                offsets = np.cumsum([0] + [item[2] for item in items])
                rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in live])
                selected = selected[torch.from_numpy(rows).to(selected.device)]
            requests += [items[i][0] for i in live]
            starts += [items[i][1] for i in live]
            counts += [items[i][2] for i in live]
            pieces.append(selected)
        self._held.clear()
        if requests:
            self.drafter.observe(requests, starts, counts, torch.cat(pieces))
