"""Tensor-parallel worker processes, their process group and how their failures surface.

Rank 0 is the engine's own process; ranks 1..N-1 are child processes it starts
(``python -m dspark.engine.tp_worker``) and stops. Each worker reads rank 0's plan
messages from a pipe and runs its shard of every forward in lock-step, the layers'
all-reduces going over a ``torch.distributed`` process group (gloo on CPU, NCCL on
CUDA) built without touching the process-wide default group.

Nothing blocks without a bound: plan writes and replies carry a deadline, collectives
the group's timeout. A failure is diagnosed into one ``TensorParallelError`` naming the
rank (died, with its signal or exit status and the error it reported; or alive but
stalled, behind rank 0 in the collectives it joined), and every worker is stopped. A
worker exits when rank 0 does: its plan pipe reads end of file, and a thread watches
for its parent's death besides.
"""

from __future__ import annotations

import enum
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dspark.engine.step_message import HEADER, MessageKind, digest, frame

REPLY = struct.Struct("<II")  # kind, body bytes
STOP_GRACE_S = 5.0  # how long a worker may take to exit once told to stop
EXIT_GRACE_S = 1.0  # how long a failure waits for a dying worker's exit status


class ReplyKind(enum.IntEnum):
    READY = 1  # loaded and joining the process group
    DIGESTS = 2  # body: uint64 digests of every FORWARD payload received
    ERROR = 3  # body: the worker's traceback, before it exits


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank died, stalled or failed; the engine cannot step again."""


def write_all(fd: int, data: bytes, timeout_s: float) -> None:
    """Write ``data`` to a non-blocking pipe, waiting at most ``timeout_s`` for room."""
    deadline = time.monotonic() + timeout_s
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError(f"no room in the pipe for {timeout_s:.0f} s") from None


def read_exact(fd: int, size: int, timeout_s: float | None = None) -> bytes:
    """``size`` bytes from a pipe; EOFError at its end, TimeoutError past ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    chunks, left = [], size
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError(f"no answer for {timeout_s:.0f} s")
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError("the pipe was closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_reply(fd: int, timeout_s: float | None) -> tuple[ReplyKind, bytes]:
    kind, size = REPLY.unpack(read_exact(fd, REPLY.size, timeout_s))
    return ReplyKind(kind), read_exact(fd, size, timeout_s)


def read_message(fd: int) -> tuple[MessageKind, int, bytes, int]:
    """The next plan message: kind, sequence number, payload and the digest sent."""
    kind, sequence, size, sent_digest = HEADER.unpack(read_exact(fd, HEADER.size))
    return MessageKind(kind), sequence, read_exact(fd, size), sent_digest


def open_group(store, rank: int, size: int, timeout_s: float, device: torch.device):
    """A process group of its own (never the process-wide default, so several engines
    may live in one process): NCCL for CUDA, gloo otherwise."""
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class Collectives:
    """The all-reduce a shard's layers complete their outputs with. ``progress[rank]``
    counts the collectives this rank entered (shared memory, read when diagnosing a
    stall: the stalled rank is the one behind)."""

    def __init__(self, group, progress: np.ndarray, rank: int) -> None:
        self.group, self.progress, self.rank = group, progress, rank

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.contiguous()  # a small-row product can leave its result transposed
        self.progress[self.rank] += 1
        self.group.allreduce([tensor]).wait()
        return tensor


@dataclass
class _Worker:
    rank: int
    process: subprocess.Popen
    plan_fd: int  # the write end of its plan pipe
    reply_fd: int  # the read end of its reply pipe


def package_path() -> str:
    """The directory that holds this ``dspark`` package (the workers import the same)."""
    return str(Path(__file__).resolve().parents[2])


class WorkerPool:
    """Ranks 1..N-1 of one engine: started here, joined by ``connect``, stopped by
    ``close`` (or when this object is collected, or at exit)."""

    def __init__(
        self, spec: dict, size: int, device: torch.device, timeout_s: float, start_timeout_s: float
    ) -> None:
        self.size, self.device = size, device
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.sequence = 0  # plan messages sent
        self.digests: list[int] = []  # of every FORWARD payload sent, in order
        self.failure: TensorParallelError | None = None
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            size,
            True,
            timeout=timedelta(seconds=start_timeout_s),
            wait_for_workers=False,
        )
        handle, progress_path = tempfile.mkstemp(prefix="dspark-tp-progress-")
        os.close(handle)
        self.progress = np.memmap(progress_path, dtype=np.int64, mode="w+", shape=(size,))
        spec = {**spec, "size": size, "port": self._store.port, "progress": progress_path}
        spec["timeout_s"] = timeout_s
        self.workers: list[_Worker] = []
        self._shutdown = _Shutdown(self.workers, progress_path)
        self._finalizer = weakref.finalize(self, self._shutdown)
        for rank in range(1, size):
            self.workers.append(_spawn(rank, spec))
        self.group = None
        self.collectives: Collectives | None = None

    def connect(self) -> None:
        """Wait until every worker has loaded its shard, then join the process group."""
        for worker in self.workers:
            try:
                kind, body = read_reply(worker.reply_fd, self.start_timeout_s)
            except (EOFError, TimeoutError, OSError) as error:
                raise self.fail(error, starting=True) from None
            if kind is not ReplyKind.READY:
                raise self.fail(RuntimeError(body.decode(errors="replace")), starting=True)
        # Every rank has the progress counters mapped: without a name, a killed engine
        # leaves no file behind.
        Path(self._shutdown.progress_path).unlink(missing_ok=True)
        self.group = open_group(self._store, 0, self.size, self.timeout_s, self.device)
        self.collectives = Collectives(self.group, self.progress, 0)

    def send_plan(self, payload: bytes) -> None:
        """One FORWARD message to every worker."""
        self.digests.append(self._send(MessageKind.FORWARD, payload))

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self._check()
        try:
            return self.collectives.all_reduce(tensor)
        except RuntimeError as error:
            raise self.fail(error) from None

    def plan_digests(self) -> dict[int, list[int]]:
        """Per rank, the digest of every plan it ran, in order (rank 0: those it sent)."""
        self._send(MessageKind.DIGESTS)
        result = {0: list(self.digests)}
        for worker in self.workers:
            try:
                kind, body = read_reply(worker.reply_fd, self.timeout_s)
            except (EOFError, TimeoutError, OSError) as error:
                raise self.fail(error) from None
            if kind is not ReplyKind.DIGESTS:
                raise self.fail(RuntimeError(body.decode(errors="replace")))
            result[worker.rank] = np.frombuffer(body, dtype=np.uint64).tolist()
        return result

    def _send(self, kind: MessageKind, payload: bytes = b"") -> int:
        self._check()
        self.sequence += 1
        message = frame(kind, self.sequence, payload)
        for worker in self.workers:
            try:
                write_all(worker.plan_fd, message, self.timeout_s)
            except (OSError, TimeoutError) as error:
                raise self.fail(error) from None
        return digest(payload) if kind is MessageKind.FORWARD else 0

    def check_alive(self) -> None:
        """Raise the diagnosis if a worker has exited: an idle engine runs no collective
        that would notice."""
        self._check()
        if any(worker.process.poll() is not None for worker in self.workers):
            raise self.fail(RuntimeError("a worker exited"))

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def fail(self, cause: BaseException, starting: bool = False) -> TensorParallelError:
        """Diagnose ``cause`` into an error naming the rank, and stop every worker."""
        if self.failure is None:
            when = "while starting" if starting else f"at plan {self.sequence}"
            self.failure = TensorParallelError(
                f"{self._diagnosis(cause)} {when}; the engine stopped its tensor-parallel "
                "workers and cannot run again: create a new engine"
            )
            self._shutdown.grace_s = 0.0  # a failed group: no worker is waited for
            self.close()
        return self.failure

    def _diagnosis(self, cause: BaseException) -> str:
        deadline = time.monotonic() + EXIT_GRACE_S
        while time.monotonic() < deadline and all(w.process.poll() is None for w in self.workers):
            time.sleep(0.02)
        for worker in self.workers:
            code = worker.process.poll()
            if code is not None:
                return f"tensor-parallel rank {worker.rank} (pid {worker.process.pid}) " + (
                    _exit_reason(code) + _reported_error(worker.reply_fd)
                )
        entered = self.progress[0]
        for worker in self.workers:
            if self.progress[worker.rank] < entered:
                return (
                    f"tensor-parallel rank {worker.rank} (pid {worker.process.pid}) stalled: "
                    f"it is alive but joined {self.progress[worker.rank]} of the {entered} "
                    f"collectives rank 0 entered, and gave no answer within "
                    f"{self.timeout_s:g} s (EngineConfig.tp_timeout_s)"
                )
        return f"tensor-parallel rank 0 failed ({type(cause).__name__}: {cause})"

    def close(self) -> None:
        """Stop every worker (told to, then killed past ``STOP_GRACE_S``) and free the pipes."""
        self.group = self.collectives = None
        self._finalizer()


def _spawn(rank: int, spec: dict) -> _Worker:
    import json

    plan_read, plan_write = os.pipe()
    reply_read, reply_write = os.pipe()
    spec = {**spec, "rank": rank, "plan_fd": plan_read, "reply_fd": reply_write}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_path(), env.get("PYTHONPATH")) if p)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "dspark.engine.tp_worker", json.dumps(spec)],
            pass_fds=(plan_read, reply_write),
            stdin=subprocess.DEVNULL,
            env=env,
        )
    finally:
        os.close(plan_read)
        os.close(reply_write)
    os.set_blocking(plan_write, False)
    return _Worker(rank, process, plan_write, reply_read)


class _Shutdown:
    """Stops the workers once: tells them to, waits ``grace_s``, then kills the rest."""

    def __init__(self, workers: list[_Worker], progress_path: str) -> None:
        self.workers, self.progress_path = workers, progress_path
        self.grace_s = STOP_GRACE_S

    def __call__(self) -> None:
        stop = frame(MessageKind.STOP, 0)
        for worker in self.workers:
            try:
                write_all(worker.plan_fd, stop, 0.1)
            except (OSError, TimeoutError):
                pass  # a dead or stalled worker is killed below
        deadline = time.monotonic() + self.grace_s
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            for fd in (worker.plan_fd, worker.reply_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.workers.clear()
        Path(self.progress_path).unlink(missing_ok=True)


def _exit_reason(code: int) -> str:
    if code < 0:
        return f"died: killed by signal {signal.Signals(-code).name}"
    return f"died: exited with status {code}"


def _reported_error(fd: int) -> str:
    """The error a worker sent before exiting, if it sent one."""
    try:
        if not select.select([fd], [], [], 0)[0]:
            return ""
        kind, body = read_reply(fd, 0.5)
    except (EOFError, TimeoutError, OSError, ValueError):
        return ""
    if kind is not ReplyKind.ERROR:
        return ""
    return f" after reporting: {body.decode(errors='replace').strip().splitlines()[-1]}"
