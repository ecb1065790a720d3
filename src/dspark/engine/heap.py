"""Python's cyclic garbage collector and a serving loop.

A full (oldest-generation) collection walks every tracked object in the process: the
model's modules and parameters, the tokenizer, transformers' and torch's own state,
hundreds of thousands of objects. CPython starts one on its own whenever enough objects
have survived the younger generations, in the middle of whichever step allocated the
last of them: a pause of several GPU steps, which in a short benchmark run lands in one
configuration and not another.

Almost none of those objects ever becomes garbage: they live as long as the server.
``gc.freeze()`` moves every object alive at the call into a permanent generation that
collections skip, so a later full collection walks only what was allocated since (the
engine's per-step objects, which reference counting frees anyway). Serving engines do
this once start-up is over (vLLM's engine core and workers, SGLang after its warm-up).
Objects frozen are never collected: an engine that is dropped later, while frozen, keeps
its memory, so a process that builds engines one after another (the benchmark) unfreezes
before dropping one (``frozen_heap``). Only a heap frozen for the rest of the process
(``keep_heap_frozen``, which ``dspark serve`` calls) stays frozen after such a block: a
heap frozen before it by anyone else is thawed too, since Python cannot thaw part of it
(left frozen, every engine a benchmark drops would keep its GPU memory).

``CollectorPauses`` counts what the collector did during a window, by generation, so that
a benchmark can say whether a full collection fell inside a measured run.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def freeze_heap() -> int:
    """Collect what is garbage now, then freeze every live object (see the module doc);
    the number of objects frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_KEPT_FROZEN = False  # keep_heap_frozen was called: frozen_heap must not thaw


def keep_heap_frozen() -> int:
    """``freeze_heap`` for the rest of the process (a server once started): later
    ``frozen_heap`` blocks leave the heap frozen. The number of objects frozen."""
    global _KEPT_FROZEN
    _KEPT_FROZEN = True
    return freeze_heap()


@contextmanager
def frozen_heap() -> Iterator[int]:
    """``freeze_heap`` for the ``with`` block (yields the number frozen), then unfreeze:
    what was frozen is collectable again, so an engine dropped afterwards is freed. The
    whole heap is thawed, whoever froze it before, unless ``keep_heap_frozen`` froze it
    for good (then it stays frozen, with what the block froze besides)."""
    count = freeze_heap()
    try:
        yield count
    finally:
        if not _KEPT_FROZEN:
            gc.unfreeze()


@dataclass
class CollectorPauses:
    """Collections and their seconds by generation (0, 1, 2) while ``watching``."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _started: float = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = min(int(info["generation"]), 2)
        self.counts[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started

    @contextmanager
    def watching(self) -> Iterator[CollectorPauses]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)
