"""The server over a tensor-parallel engine (gloo, 2 ranks): a rank that dies or stalls
makes the one HTTP front answer 503 naming it, within a bound, and no worker is left."""

import contextlib
import os
import signal
import time

import torch

from dspark.engine.config import EngineConfig
from tests.conftest import make_tiny_model
from tests.engine.test_tensor_parallel import child_pids

TIMEOUT_S = 2.0
BODY = {"model": "tiny", "prompt": "Hello there", "max_tokens": 8}


@contextlib.contextmanager
def serving(tmp_path, tokenizer):
    """A client of the app over a tiny random model with SmolLM2's vocabulary, split over
    two ranks, and the worker's pid; on exit the app has shut down."""
    from fastapi.testclient import TestClient

    from dspark.server.serve import create_app

    path = tmp_path / "tiny"
    make_tiny_model(path, vocab_size=len(tokenizer))
    tokenizer.save_pretrained(path)
    before = set(child_pids())
    config = EngineConfig(
        tensor_parallel_size=2,
        tp_timeout_s=TIMEOUT_S,
        max_num_seqs=2,
        max_num_batched_tokens=128,
        kv_cache_tokens=1024,
    )
    threads = torch.get_num_threads()
    app, _ = create_app(str(path), config, served_name="tiny")
    [worker] = set(child_pids()) - before
    try:
        with TestClient(app) as client:
            yield client, worker
    finally:
        # The engine took this thread's CPU threads for rank 0 and the app's shutdown
        # closed it on another thread, which gives back only that thread's count.
        torch.set_num_threads(threads)


def test_a_worker_dead_while_idle_turns_health_and_requests_into_503(tmp_path, smollm2):
    before = set(child_pids())
    with serving(tmp_path, smollm2.tokenizer) as (client, worker):
        assert client.post("/v1/completions", json=BODY).status_code == 200
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 3.0  # the idle loop looks twice a second
        while (health := client.get("/health")).status_code == 200:
            assert time.monotonic() < deadline, "the server still says it is healthy"
            time.sleep(0.05)
        assert health.status_code == 503
        assert f"rank 1 (pid {worker}) died: killed by signal SIGKILL" in health.json()["status"]
        answer = client.post("/v1/completions", json=BODY)
        assert answer.status_code == 503
        assert f"rank 1 (pid {worker})" in answer.json()["error"]["message"]
    assert set(child_pids()) == before


def test_a_worker_stalled_mid_request_fails_it_in_bounded_time_then_503(tmp_path, smollm2):
    before = set(child_pids())
    with serving(tmp_path, smollm2.tokenizer) as (client, worker):
        os.kill(worker, signal.SIGSTOP)
        start = time.monotonic()
        failed = client.post("/v1/completions", json=BODY)
        assert time.monotonic() - start < TIMEOUT_S + 2.5
        assert failed.status_code >= 500
        assert f"rank 1 (pid {worker}) stalled" in failed.json()["error"]["message"]
        assert client.get("/health").status_code == 503
        assert client.post("/v1/completions", json=BODY).status_code == 503
    assert set(child_pids()) == before
