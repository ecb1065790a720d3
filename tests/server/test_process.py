"""``dspark serve`` as its own process: its key from the environment, and signals."""

import os
import signal
import threading
import time
from pathlib import Path

import httpx

from dspark.bench.load import start_serve
from tests.server.conftest import free_port
from tests.server.test_server import MODEL

ROOT = Path(__file__).resolve().parents[2]


def test_the_key_comes_from_the_environment_and_a_second_signal_exits_at_once(smollm2, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    src = str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "DSPARK_API_KEY": "env-key", "PYTHONPATH": path}
    serve_args = ["--max-num-seqs", "2", "--kv-cache-tokens", "4096", "--grace-seconds", "60"]
    server = start_serve(port, serve_args, tmp_path / "serve.log", env)
    try:
        assert httpx.get(f"{base}/v1/models").status_code == 401
        key = {"authorization": "Bearer env-key"}
        assert httpx.get(f"{base}/v1/models", headers=key).json()["data"][0]["id"] == MODEL
        started = threading.Event()

        def long_stream():
            body = {"model": MODEL, "prompt": "Write a long poem.", "max_tokens": 4000}
            body.update(ignore_eos=True, stream=True)
            try:
                with httpx.stream(
                    "POST", f"{base}/v1/completions", json=body, headers=key, timeout=60
                ) as response:
                    for _ in response.iter_lines():
                        started.set()
            except httpx.HTTPError:
                pass  # the server went away: that is the point

        threading.Thread(target=long_stream, daemon=True).start()
        assert started.wait(60)
        server.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert server.poll() is None  # the first signal waits for the request (60 s grace)
        assert httpx.get(f"{base}/health", timeout=5).status_code == 503
        signal_time = time.monotonic()
        server.send_signal(signal.SIGINT)
        server.wait(timeout=10)
        assert time.monotonic() - signal_time < 2.0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
