"""The engine's own thread, fed by a command queue; results go back to asyncio queues.

HTTP handlers never touch the engine: they ``submit`` a request and read events
(text deltas, then a final event with the finish reason and usage) from an
``asyncio.Queue``; ``abort`` cancels one (a client that disconnected). The thread steps
the engine while there is work and sleeps on the command queue otherwise. An exception
inside a step fails the requests in flight with an error event; the loop carries on,
unless a tensor-parallel rank died or stalled (seen at a step, or between steps): then
the server answers 503 from then on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from dspark.engine.distributed import TensorParallelError
from dspark.engine.engine import LLMEngine
from dspark.engine.request import PromptTooLongError, Request
from dspark.engine.sampling import SamplingParams
from dspark.server.metrics import ServerMetrics

log = logging.getLogger("dspark.server")

# What clients learn of a failure inside the engine; the traceback goes to the log.
INTERNAL_ERROR = "internal engine error (details are in the server log)"


class QueueFullError(RuntimeError):
    """More requests are pending than the server accepts (HTTP 429)."""


class ShuttingDownError(RuntimeError):
    """The server is shutting down and takes no new requests (HTTP 503)."""


@dataclass
class Event:
    text: str = ""  # new text since the previous event
    num_tokens: int = 0  # new tokens since the previous event
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    stop: tuple[str, ...]
    num_prompt: int
    sent_chars: int = 0
    sent_tokens: int = 0
    arrival: float = field(default_factory=time.perf_counter)

    def put(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class EngineRunner:
    def __init__(self, engine: LLMEngine, max_pending: int) -> None:
        self.engine = engine
        self.max_pending = max_pending
        self.metrics = ServerMetrics()
        self._commands: queue.Queue = queue.Queue()
        self._sinks: dict[str, _Sink] = {}
        self._pending = 0
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._accepting = True
        self.unavailable: str | None = None  # why the engine cannot serve (HTTP 503)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dspark-engine", daemon=True)
        self._update_gauges()  # /metrics shows the engine before its first step

    # ---- called from the HTTP side ---------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, id_prefix: str = "cmpl"
    ) -> tuple[str, asyncio.Queue]:
        """Queue a request (its id starts with ``id_prefix``); raises
        ``ShuttingDownError``, ``QueueFullError`` or ``ValueError`` (bad prompt) without
        touching the engine."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.engine.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds "
                f"{self.engine.max_model_len} (prompt plus at least one generated token)"
            )
        with self._lock:
            if not self._accepting:
                raise ShuttingDownError(self.unavailable or "the server is shutting down")
            if self._pending >= self.max_pending:
                raise QueueFullError(
                    f"{self._pending} requests are already pending (the limit is "
                    f"{self.max_pending}); retry later"
                )
            self._pending += 1
        request_id = f"{id_prefix}-{next(self._ids)}-{time.monotonic_ns() % 10**9}"
        sink = _Sink(asyncio.get_running_loop(), asyncio.Queue(), params.stop, len(prompt_ids))
        self._commands.put(("add", request_id, prompt_ids, params, sink))
        return request_id, sink.events

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def shutdown(self, grace_seconds: float) -> None:
        """Stop taking requests, let those in flight finish for ``grace_seconds``, then
        end the rest with an error event saying why, and stop the thread."""
        with self._lock:
            self._accepting = False
        if self._stopped.is_set() or not self._thread.is_alive():
            return
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and self.num_pending:
            time.sleep(0.05)
        self._commands.put(("stop",))
        self._thread.join(timeout=30)
        self.engine.close()  # its tensor-parallel workers, if any

    @property
    def accepting(self) -> bool:
        with self._lock:
            return self._accepting

    @property
    def num_pending(self) -> int:
        with self._lock:
            return self._pending

    # ---- the engine thread -----------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain_commands(block=not self.engine.has_unfinished())
            if self._stopped.is_set() or not self.engine.has_unfinished():
                self._update_gauges()  # aborts and rejections change them without a step
                self._check_workers()
                continue
            try:
                touched = self.engine.step()
            except TensorParallelError as error:  # a rank is gone: no step can run again
                self._cannot_serve(error)
                continue
            except Exception:  # a bug must not take the server down
                log.exception("engine step failed")
                self._fail_all(INTERNAL_ERROR)
                continue
            for request in touched:
                self._publish(request)
            self._update_gauges()

    def _check_workers(self) -> None:
        """An idle engine's dead worker turns the server unavailable before any request
        is sent to it."""
        if self.unavailable is None:
            try:
                self.engine.check_workers()
            except TensorParallelError as error:
                self._cannot_serve(error)

    def _cannot_serve(self, error: TensorParallelError) -> None:
        """From now on: 503 for new requests and /health; those in flight end with why."""
        log.error("the engine cannot serve: %s", error)
        with self._lock:
            self._accepting = False
            self.unavailable = f"the engine cannot serve: {error}"
        self._fail_all(self.unavailable)

    def _drain_commands(self, block: bool) -> None:
        while True:
            try:
                command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return
            block = False
            kind = command[0]
            if kind == "add":
                _, request_id, prompt_ids, params, sink = command
                self._sinks[request_id] = sink
                try:
                    self.engine.add_request(prompt_ids, params, request_id)
                except ValueError as error:
                    self._close(request_id, Event(finish_reason="error", error=str(error)))
                except Exception:  # a bug must fail this request only, not the thread
                    log.exception("adding request %s failed", request_id)
                    self._close(request_id, Event(finish_reason="error", error=INTERNAL_ERROR))
            elif kind == "abort":
                request = self.engine.requests.get(command[1])
                if request is not None and not request.is_finished:
                    self.engine.abort(command[1])
                    self._publish(request)
            elif kind == "stop":
                self._fail_all("the server shut down before this request finished")
                self._stopped.set()
                return

    def _publish(self, request: Request) -> None:
        sink = self._sinks.get(request.request_id)
        if sink is None:
            return
        if request.is_finished:
            text = request.text
            event = Event(
                text[sink.sent_chars :],
                len(request.output_ids) - sink.sent_tokens,
                request.finish_reason.value,
                request.error,
                sink.num_prompt,
                len(request.output_ids),
            )
            self._record(request)
            self._close(request.request_id, event)
            return
        text = self.engine.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        safe = len(text) - _held_back(text, sink.stop)
        if safe > sink.sent_chars:
            sink.put(
                Event(text[sink.sent_chars : safe], len(request.output_ids) - sink.sent_tokens)
            )
            sink.sent_chars, sink.sent_tokens = safe, len(request.output_ids)

    def _close(self, request_id: str, event: Event) -> None:
        sink = self._sinks.pop(request_id, None)
        self.engine.requests.pop(request_id, None)
        with self._lock:
            self._pending -= 1
        if sink is not None:
            sink.put(event)
        with self.metrics.lock:
            self.metrics.finished[event.finish_reason or "error"] += 1

    def _record(self, request: Request) -> None:
        with self.metrics.lock:
            m = self.metrics
            m.prompt_tokens += len(request.prompt_ids)
            m.generation_tokens += len(request.output_ids)
            if request.first_token_time is not None:
                m.ttft.observe(request.first_token_time - request.arrival)
                if len(request.output_ids) > 1 and request.finish_time is not None:
                    m.tpot.observe(
                        (request.finish_time - request.first_token_time)
                        / (len(request.output_ids) - 1)
                    )

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._sinks):
            request = self.engine.requests.get(request_id)
            if request is not None:
                self.engine.abort(request_id, error=message)
            self._close(request_id, Event(finish_reason="error", error=message))

    def _update_gauges(self) -> None:
        engine = self.engine
        stats = engine.stats
        gauges = {
            "queue_depth": len(engine.scheduler.waiting),
            "running_requests": len(engine.scheduler.running),
            "free_slots": len(engine.scheduler.free_slots),
            "slots": engine.config.max_num_seqs,
            "kv_cache_free_blocks": engine.cache.num_free_blocks,
            "kv_cache_blocks": engine.cache.num_blocks,
            "acceptance_length": stats.acceptance_length,
            "verified_tokens_per_step": stats.verified_per_step,
            # The latest decided step's budget (settled steps verify every draft).
            "draft_budget": stats.budgets[-1] if stats.budgets else 0,
            "steps_total": stats.num_steps,
            # ``EngineConfig.settle``: drafting steps run undecided, and the depth they
            # draft while settled (0: deciding every step).
            "settled_steps_total": stats.settled_steps,
            "settled_depth": engine.settled_depth,
        }
        with self.metrics.lock:
            self.metrics.gauges.update(gauges)


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of ``text`` not safe to stream yet: an incomplete UTF-8
    character, or the start of a stop string that may still complete."""
    held = 1 if text.endswith("\ufffd") else 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                held = max(held, k)
                break
    return held
