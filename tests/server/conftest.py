import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningServer:
    def __init__(self, max_pending=8, grace_seconds=30.0, max_num_seqs=4, api_key=None):
        from dspark.engine.config import EngineConfig
        from dspark.server.serve import GracefulServer, create_app

        config = EngineConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=512, kv_cache_tokens=4096
        )
        self.api_key = api_key
        self.app, self.runner = create_app(
            None, config, max_pending, grace_seconds=grace_seconds, api_key=api_key
        )
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = GracefulServer(
            self.app, self.runner, "127.0.0.1", self.port, grace_seconds, log_level="warning"
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)

    def client(self):
        import openai

        key = self.api_key or "unused"
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key, max_retries=0)

    @property
    def headers(self) -> dict:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def close(self):
        self.server.stop()
        self.thread.join(timeout=60)


API_KEY = "test-key"


@pytest.fixture(scope="module")
def server(smollm2):
    running = RunningServer(api_key=API_KEY)
    yield running
    running.close()
