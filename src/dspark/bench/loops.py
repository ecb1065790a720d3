"""How ``dspark bench`` runs and measures a setting's engine.

``closed_loop`` (a fixed number of requests in flight until the prompts are done) and
``measure`` (one run of it after ``warm_up``); ``SlicedLoop`` and ``sliced_windows`` for
``--slice-ms`` (every setting's loop stepped in turns over the same stretch of wall
time); ``host_probe_ms``, the host's speed around each measurement; and the
``Measurement`` each of those runs gives, from the engine's stats.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import torch

from dspark.bench.measurement import Measurement, learnt_state
from dspark.bench.settings import Setting
from dspark.engine.engine import LLMEngine
from dspark.engine.heap import CollectorPauses, frozen_heap
from dspark.engine.sampling import SamplingParams

PROBE_TRIES = 7


def host_probe_ms(tries: int = PROBE_TRIES) -> float:
    """Milliseconds a fixed piece of host work takes here, the fastest of ``tries``:
    the kind of work an engine's step does around its kernels (list and dict
    bookkeeping over a batch, a few small NumPy calls). The fastest try leaves out
    preemptions; what remains is the host's speed."""
    best = float("inf")
    values = np.arange(64, dtype=np.int64)
    for _ in range(tries):
        start = time.perf_counter()
        for step in range(40):
            table = {i: i * step for i in range(64)}
            counts = [table[i] % 7 for i in range(64)]
            order = np.argsort(np.array(counts, dtype=np.int64) - values)
            float(np.add.accumulate(values[order]).max())
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _phase_medians(stats) -> dict[str, float]:
    phases = {"drafter": stats.drafter_ms, "apply": stats.apply_ms, "forward": stats.forward_ms}
    return {name: float(np.median(ms)) for name, ms in phases.items() if len(ms)}


def closed_loop(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, concurrency: int
) -> tuple[list, float]:
    """Run ``prompts`` keeping ``concurrency`` in flight; finished requests and seconds."""
    queue = list(prompts)
    running, finished = [], []
    start = time.perf_counter()
    while queue or running:
        while queue and len(running) < concurrency:
            running.append(engine.add_request(queue.pop(0), params))
        engine.step()
        still = []
        for request in running:
            (finished if request.is_finished else still).append(request)
        running = still
    seconds = time.perf_counter() - start
    for request in finished:
        engine.requests.pop(request.request_id, None)
    return finished, seconds


class SlicedLoop:
    """One setting's closed loop for ``--slice-ms``: ``concurrency`` requests in flight,
    the prompts taken in order and taken again from the start when they run out, stepped
    a slice of time at a time while other settings' loops take their turns
    (``sliced_windows``). The engine's request clock leaves out the turns of the others
    (``LLMEngine.idle_s``), so TPOT is this engine's own."""

    def __init__(
        self,
        engine: LLMEngine,
        setting: Setting,
        prompts: list[list[int]],
        params: SamplingParams,
        concurrency: int,
    ) -> None:
        if not prompts:
            raise ValueError("a sliced loop needs prompts")
        self.engine, self.setting = engine, setting
        self.prompts, self.params, self.concurrency = prompts, params, concurrency
        self.next_prompt = 0
        self.running: list = []
        self.finished: list = []  # since the window began
        self.busy_s = 0.0  # this engine's own time in the window
        self._last_end: float | None = None
        self._on_cuda = engine.device.type == "cuda"

    def begin_window(self) -> _Marks:
        self.engine.stats.__init__()
        self.finished, self.busy_s = [], 0.0
        return _Marks(self.engine)

    def run_slice(self, until_s: float) -> None:
        """Steps (at least one) until this window's own time reaches ``until_s``: a turn
        that overran its target starts the next one later, so over a window every loop
        keeps pace with the rounds whatever its step time (``sliced_windows``)."""
        engine = self.engine
        start = time.perf_counter()
        if self._last_end is not None:
            engine.idle_s += start - self._last_end
        until = until_s - self.busy_s
        while True:
            while len(self.running) < self.concurrency:
                prompt = self.prompts[self.next_prompt % len(self.prompts)]
                self.next_prompt += 1
                self.running.append(engine.add_request(prompt, self.params))
            engine.step()
            still = []
            for request in self.running:
                if request.is_finished:
                    if request.error:
                        raise ValueError(f"a benchmark request failed: {request.error}")
                    self.finished.append(request)
                    engine.requests.pop(request.request_id, None)
                else:
                    still.append(request)
            self.running = still
            if time.perf_counter() - start >= until:
                break
        if self._on_cuda:  # the device's work is this engine's, not the next one's
            torch.cuda.synchronize(engine.device)
        end = time.perf_counter()
        self.busy_s += end - start
        self._last_end = end


def sliced_windows(
    loops: list[SlicedLoop],
    window_s: float,
    slice_s: float,
    freeze_gc: bool = True,
    rotation: int = 0,
) -> list[Measurement]:
    """One window of ``--slice-ms``: every loop runs ``window_s`` of its own time in turns,
    round robin, so every setting meets the machine's speed of the same stretch of wall
    time; a measurement each, of the tokens it emitted and the requests that finished in
    its turns. Round ``r`` takes each loop to ``(r + 1) * slice_s`` of its own time (a
    loop whose last step overran that sits the round out), so loops of long steps and of
    short ones end the window together; the first turn moves one loop on each round,
    starting at ``rotation``. Requests in flight carry over from window to window, as
    does what adaptive verification learnt: the steady state of a serving engine."""
    marks = [loop.begin_window() for loop in loops]
    pauses = [CollectorPauses() for _ in loops]
    probe_before = host_probe_ms()
    turn = rotation
    with frozen_heap() if freeze_gc else nullcontext():
        target = 0.0
        while any(loop.busy_s < window_s for loop in loops):
            target = min(target + slice_s, window_s)
            for j in range(len(loops)):
                i = (turn + j) % len(loops)
                if loops[i].busy_s < target:
                    with pauses[i].watching():
                        loops[i].run_slice(target)
            turn += 1
    probe_ms = (probe_before, host_probe_ms())
    results = []
    for loop, start, paused in zip(loops, marks, pauses, strict=True):
        engine = loop.engine
        results.append(
            _measurement(
                engine,
                loop.setting,
                loop.concurrency,
                loop.finished,
                engine.stats.num_generated,
                loop.busy_s,
                start,
                paused,
                probe_ms,
                freeze_gc,
                window=True,
            )
        )
    return results


def measure(
    engine: LLMEngine,
    setting: Setting,
    prompts: list[list[int]],
    params: SamplingParams,
    concurrency: int,
    warmup: list[list[int]] | None = None,
    full_warmup: bool = False,
    freeze_gc: bool = True,
) -> Measurement:
    """One closed-loop run of ``prompts``, after a shorter one over ``warmup`` (default:
    the first prompt) at the same concurrency: a serving engine runs in steady state, with
    its graphs captured and (adaptive) its step costs measured, and so does the bench.
    ``full_warmup``: the warm-up requests run as many tokens as the measured ones (else a
    quarter), so that they meet the measured run's step shapes (contexts as long). The
    warm-up samples as the measured run does: what adaptive verification learns there
    (the drafts' survival, what drafting costs and earns) is what it meets next, and a
    greedy warm-up before a sampled run would teach it greedy acceptance.

    ``freeze_gc``: the heap as the warm-up leaves it is frozen for the measured run
    (``dspark.engine.heap``), as a serving engine freezes its start-up heap, so that a
    full collection does not walk the model's objects in some run's step; the run's
    collections are counted either way (``gc_full``, ``gc_full_s``, ``gc_s``)."""
    warm_up(engine, params, concurrency, warmup or prompts[:1], full_warmup)
    start = _Marks(engine)
    pauses = CollectorPauses()
    probe_before = host_probe_ms()
    with frozen_heap() if freeze_gc else nullcontext(), pauses.watching():
        finished, seconds = closed_loop(engine, prompts, params, concurrency)
    probe_ms = (probe_before, host_probe_ms())
    failed = [r for r in finished if r.error]
    if failed:
        raise ValueError(f"{len(failed)} benchmark requests failed: {failed[0].error}")
    tokens = sum(len(r.output_ids) for r in finished)
    return _measurement(
        engine, setting, concurrency, finished, tokens, seconds, start, pauses, probe_ms, freeze_gc
    )


def warm_up(
    engine: LLMEngine,
    params: SamplingParams,
    concurrency: int,
    warmup: list[list[int]],
    full_warmup: bool,
) -> None:
    """The closed loop over ``warmup`` that ``measure`` runs first; clears the stats."""
    warm_tokens = params.max_tokens if full_warmup else max(4, params.max_tokens // 4)
    closed_loop(engine, warmup, replace(params, max_tokens=warm_tokens), concurrency)
    engine.stats.__init__()


class _Marks:
    """An engine's capture and cover counters when a measurement began."""

    def __init__(self, engine: LLMEngine) -> None:
        self.captures, self.capture_s = engine.num_captures(), engine.capture_seconds()
        graphs = engine.graphs
        self.covered = graphs.num_covered if graphs is not None else 0
        self.padding = graphs.covered_tokens if graphs is not None else 0


def _measurement(
    engine: LLMEngine,
    setting: Setting,
    concurrency: int,
    finished: list,
    tokens: int,
    seconds: float,
    start: _Marks,
    pauses: CollectorPauses,
    probe_ms: tuple[float, float],
    freeze_gc: bool,
    window: bool = False,
) -> Measurement:
    """One measurement from what the engine's stats hold since ``start`` (``seconds``:
    the engine's own time, ``tokens``: those it emitted in it, ``finished``: the requests
    that finished in it)."""
    capture_s = engine.capture_seconds() - start.capture_s
    covered = padding = 0
    if engine.graphs is not None:
        covered = engine.graphs.num_covered - start.covered
        padding = engine.graphs.covered_tokens - start.padding
    stats = engine.stats
    steady_s = seconds - capture_s
    tpot = [
        (r.finish_time - r.first_token_time) / (len(r.output_ids) - 1)
        for r in finished
        if len(r.output_ids) > 1
    ]
    tpot = np.array(tpot) if tpot else np.array([np.nan])
    return Measurement(
        label=setting.label,
        spec=setting.spec,
        k=setting.k,
        concurrency=concurrency,
        requests=len(finished),
        tokens=tokens,
        seconds=seconds,
        tok_s=tokens / steady_s,
        per_user_tok_s=float(np.median(1.0 / tpot)),
        tpot_p50_ms=float(np.percentile(tpot, 50) * 1e3),
        tpot_p99_ms=float(np.percentile(tpot, 99) * 1e3),
        acceptance_length=stats.acceptance_length,
        verified_per_round=stats.verified_per_step,
        schedule_share=sum(stats.schedule_ms) / (steady_s * 1e3),
        step_ms=steady_s * 1e3 / max(stats.num_steps, 1),
        schedule_us_per_step=sum(stats.schedule_ms) * 1e3 / max(stats.num_steps, 1),
        graph_captures=engine.num_captures() - start.captures,
        capture_s=capture_s,
        capture_steps=stats.capture_steps,
        covered_steps=covered,
        covered_tokens=padding,
        filled_steps=stats.filled_steps,
        settled_steps=stats.settled_steps,
        filled_drafts=stats.filled_drafts,
        tok_s_wall=tokens / seconds,
        undrafted_steps=stats.undrafted_steps,
        gate_vetoes=stats.gate_vetoes,
        probes=stats.probes,
        lookahead_hits=stats.lookahead_hits,
        lookahead_reused=stats.lookahead_reused,
        lookahead_plans=stats.lookahead_plans,
        drafting_plans=stats.drafting_plans,
        share_plans=stats.share_plans,
        recut_plans=stats.recut_plans,
        lookahead_us_per_step=sum(stats.lookahead_ms) * 1e3 / max(stats.num_steps, 1),
        heap_frozen=freeze_gc,
        gc_full=pauses.counts[2],
        gc_full_s=pauses.seconds[2],
        gc_s=sum(pauses.seconds),
        probe_ms=probe_ms,
        phase_ms=_phase_medians(stats),
        learnt=learnt_state(engine, concurrency),
        window=window,
        depth_steps=[stats.depth_steps[d] for d in range(setting.k + 1)]
        if setting.spec == "adaptive"
        else [],
    )
