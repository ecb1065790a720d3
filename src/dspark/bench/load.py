"""``dspark bench-serve``: a bounded load test of ``dspark serve`` on loopback.

Starts the server as a subprocess (or uses --url), then runs ``--clients`` asyncio clients
that each send streaming chat requests (ShareGPT prompts) back to back for ``--seconds``;
requests in flight at the deadline are awaited (bounded). Shorter rounds follow, to show
whether the server's memory keeps growing. Every response must end with a
finish reason and ``[DONE]``; anything else counts as failed. Reports requests/s,
tokens/s, TTFT percentiles and the server's resident memory before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from dspark.datasets import sharegpt_conversations


@dataclass
class LoadReport:
    clients: int
    seconds: float
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mb: list[float | None] = field(default_factory=list)  # at start, then after each round

    def summary(self) -> dict:
        ttft = sorted(self.ttft_s) or [float("nan")]
        return {
            "clients": self.clients,
            "seconds": round(self.seconds, 1),
            "completed": self.completed,
            "failed": self.failed,
            "rejected_429": self.rejected,
            "requests_per_s": round(self.completed / self.seconds, 2),
            "tokens_per_s": round(self.tokens / self.seconds, 1),
            "ttft_p50_s": round(statistics.median(ttft), 3),
            "ttft_p99_s": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 3),
            "rss_mb_at_start_then_after_each_round": self.rss_mb,
        }


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    report: LoadReport,
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    finish = done = None
    usage = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code == 429:
                report.rejected += 1
                await response.aread()
                return
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"]["message"])
                if event.get("usage"):
                    usage = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    if first is None and choice["delta"].get("content"):
                        first = time.perf_counter() - start
                    finish = choice.get("finish_reason") or finish
        if not (done and finish in ("stop", "length")):
            raise RuntimeError(f"incomplete stream (done={done}, finish={finish})")
        report.completed += 1
        report.tokens += usage
        if first is not None:
            report.ttft_s.append(first)
    except Exception as error:  # every failure is counted and kept, never swallowed
        report.failed += 1
        report.failures.append(repr(error)[:300])


async def run_load(
    url: str, model: str, clients: int, seconds: float, max_tokens: int, prompts: list[str]
) -> LoadReport:
    report = LoadReport(clients, seconds)
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:

        async def worker(index: int) -> None:
            turn = 0
            while time.perf_counter() < deadline:
                prompt = prompts[(index * 7919 + turn) % len(prompts)]
                await one_request(client, url, model, prompt, max_tokens, report)
                turn += 1

        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(worker(i) for i in range(clients))), timeout=seconds + 600
        )
        report.seconds = time.perf_counter() - start
    return report


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--spec", default="none", choices=["none", "fixed", "adaptive"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="load rounds (the first --seconds long, later ones half)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("results"))


def main(args: argparse.Namespace) -> None:
    prompts = [c.prompt[:1500] for c in sharegpt_conversations()[:2000]]
    server = None
    url = args.url
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.out_dir / "bench_serve_server.log"
    if url is None:
        url = f"http://127.0.0.1:{args.port}"
        server = start_serve(
            args.port,
            ["--max-num-seqs", str(args.clients), "--spec", args.spec, "--max-pending", "512"],
            log_path,
        )
    try:
        pid = server.pid if server else None
        report = None
        rss = [rss_mb(pid) if pid else None]
        later_rounds = []
        for round_index in range(args.rounds):
            # Later rounds are shorter: they are there to show whether memory keeps growing.
            seconds = args.seconds if round_index == 0 else args.seconds / 2
            result = asyncio.run(
                run_load(url, args.model, args.clients, seconds, args.max_tokens, prompts)
            )
            rss.append(rss_mb(pid) if pid else None)
            if report is None:
                report = result
            else:
                later_rounds.append(result)
                report.failed += result.failed
                report.failures += result.failures
        report.rss_mb = rss
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=120)
    summary = report.summary()
    summary["later_rounds"] = [
        {"completed": r.completed, "failed": r.failed, "seconds": round(r.seconds, 1)}
        for r in later_rounds
    ]
    print(json.dumps(summary, indent=1))
    if report.failures:
        print("failures:", *report.failures[:10], sep="\n  ")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "bench_serve.json"
    path.write_text(json.dumps({"summary": summary, "report": asdict(report)}, indent=1))
    print(f"wrote {path}")


def start_serve(
    port: int, extra_args: list[str], log_path: Path, env: dict | None = None
) -> subprocess.Popen:
    """``dspark serve --port PORT *extra_args`` as a subprocess, once it is healthy; its
    output goes to ``log_path``."""
    command = [sys.executable, "-m", "dspark.cli", "serve", "--port", str(port), *extra_args]
    with log_path.open("w") as log:  # a file: a pipe nobody reads would block the server
        server = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=log, env=env or os.environ.copy()
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not become healthy in 300 s")
