"""A tensor-parallel worker: ``python -m dspark.engine.tp_worker SPEC`` (the engine runs it).

It decides nothing. It loads its shard, builds the same runner and KV cache geometry as
rank 0 (from rank 0's ``EngineConfig``), then runs every plan message rank 0 sends, in
order, as its shard of the step's forward; the layers' all-reduces meet rank 0's. It
exits when told to, when its plan pipe closes (rank 0 is gone) or when its parent dies.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dspark.engine.config import EngineConfig
from dspark.engine.distributed import (
    REPLY,
    Collectives,
    ReplyKind,
    open_group,
    read_message,
    write_all,
)
from dspark.engine.runner import ModelRunner
from dspark.engine.step_message import MessageKind, StepPlanMessage, digest
from dspark.engine.tp_runner import rank_device
from dspark.models.loader import LoadedModel, load_target
from dspark.models.parallel import TensorShard

PARENT_POLL_S = 0.2


def reply(fd: int, kind: ReplyKind, body: bytes = b"") -> None:
    os.set_blocking(fd, True)
    write_all(fd, REPLY.pack(kind, len(body)) + body, 30.0)


def watch_parent() -> None:
    """Exit as soon as the engine's process is gone, whatever this one is doing."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="dspark-parent-watch", daemon=True).start()


def serve(spec: dict) -> None:
    rank, size = spec["rank"], spec["size"]
    torch.set_num_threads(spec["threads"])
    device = torch.device(rank_device(torch.device(spec["device"]), rank))
    shard = TensorShard(rank, size)
    path = Path(spec["model"])
    model, model_config = load_target(path, getattr(torch, spec["dtype"]), device, shard)
    loaded = LoadedModel(model, None, model_config, path, shard)
    runner = ModelRunner(loaded, EngineConfig.from_dict(spec["engine"]), spec["max_model_len"])
    progress = np.memmap(spec["progress"], dtype=np.int64, mode="r+", shape=(size,))
    timeout = timedelta(seconds=spec["timeout_s"])
    store = dist.TCPStore("127.0.0.1", spec["port"], size, False, timeout=timeout)
    reply(spec["reply_fd"], ReplyKind.READY)
    group = open_group(store, rank, size, spec["timeout_s"], device)
    runner.all_reduce = Collectives(group, progress, rank).all_reduce
    digests: list[int] = []
    with torch.inference_mode():
        while True:
            kind, sequence, payload, sent = read_message(spec["plan_fd"])
            if kind is MessageKind.STOP:
                return
            if kind is MessageKind.DIGESTS:
                reply(spec["reply_fd"], ReplyKind.DIGESTS, np.array(digests, np.uint64).tobytes())
                continue
            if digest(payload) != sent:
                raise ValueError(f"plan {sequence} arrived corrupted (its digest differs)")
            digests.append(sent)
            plan = StepPlanMessage.decode(payload)
            runner.forward(plan.tables, plan.num_cached, plan.num_query, plan.tokens)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops rank 0, which stops us
    watch_parent()
    try:
        serve(spec)
    except EOFError:  # rank 0 closed the plan pipe: it is gone
        pass
    except BaseException:
        text = traceback.format_exc()
        print(f"dspark tensor-parallel rank {spec['rank']}:\n{text}", file=sys.stderr)
        try:
            reply(spec["reply_fd"], ReplyKind.ERROR, text.encode())
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(status)  # nothing to tear down: the interpreter's own exit takes a second
