"""A soak of ``dspark serve``: streaming and non-streaming clients in rounds, half of them
hanging up at random points; every request is accounted for and the server is idle again
after each round.

Each client sends short chat or completion requests back to back until the round's
deadline; requests in flight then are awaited (bounded by ``drain_s``). A request ends
completed (a 200 with a finish reason, ``[DONE]`` when streamed), cancelled (its client
hung up on purpose), rejected (429, retried after ``Retry-After``) or failed (anything
else: a lost request). After a round the server must hold no request, slot or KV block,
and its finish counters must match what the clients saw.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field

import httpx

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is.",
    "List three primary colors.",
    "Tell me a short story about a robot.",
    "How do airplanes fly?",
    "Give me a recipe for pancakes.",
    "What is two plus two?",
)


@dataclass
class RoundReport:
    seconds: float
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    failed: int = 0
    tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    server: dict = field(default_factory=dict)  # /metrics after the round, once idle

    def summary(self) -> dict:
        ttft = sorted(self.ttft_s) or [float("nan")]
        return {
            "seconds": round(self.seconds, 1),
            "completed": self.completed,
            "cancelled": self.cancelled,
            "rejected_429": self.rejected,
            "failed": self.failed,
            "tokens_per_s": round(self.tokens / self.seconds, 1),
            "ttft_p50_s": round(statistics.median(ttft), 3),
            "ttft_p99_s": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 3),
            "rss_mb": self.server.get("rss_mb"),
            "server_finished": self.server.get("finished"),
            "server_errors": self.server.get("errors"),
        }


@dataclass(frozen=True)
class SoakConfig:
    url: str
    model: str = "SmolLM2-135M-Instruct"
    clients: int = 64
    max_tokens: tuple[int, int] = (4, 32)  # each request draws its limit in this range
    cut_within_s: float = 3.0  # a hanging-up client waits up to this long before it does
    drain_s: float = 120.0
    api_key: str | None = None


async def _request(client: httpx.AsyncClient, config: SoakConfig, body: dict, is_chat: bool):
    """``(status, tokens, ttft_s)``; raises on any malformed answer."""
    path = "/v1/chat/completions" if is_chat else "/v1/completions"
    start = time.perf_counter()
    if not body["stream"]:
        response = await client.post(f"{config.url}{path}", json=body)
        if response.status_code != 200:
            return response.status_code, 0, None
        answer = response.json()
        if answer["choices"][0]["finish_reason"] not in ("stop", "length"):
            raise RuntimeError(f"no finish reason: {answer}")
        return 200, answer["usage"]["completion_tokens"], None
    first = finish = usage = None
    is_done = False
    async with client.stream("POST", f"{config.url}{path}", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, 0, None
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                is_done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"]["message"])
                usage = event.get("usage") or usage
                for choice in event["choices"]:
                    text = choice["delta"].get("content") if is_chat else choice["text"]
                    if first is None and text:
                        first = time.perf_counter() - start
                    finish = choice["finish_reason"] or finish
    if not (is_done and finish in ("stop", "length") and usage):
        raise RuntimeError(f"incomplete stream (done={is_done}, finish={finish})")
    return 200, usage["completion_tokens"], first


async def _client(
    index: int, client: httpx.AsyncClient, config: SoakConfig, deadline: float, report
) -> None:
    rng = random.Random(index * 7919 + int(deadline))
    hangs_up = index % 2 == 1  # half of the clients hang up at random points
    while time.perf_counter() < deadline:
        is_chat, is_stream = rng.random() < 0.5, rng.random() < 0.5
        body = {"model": config.model, "max_tokens": rng.randint(*config.max_tokens)}
        prompt = rng.choice(PROMPTS)
        body.update(
            {"messages": [{"role": "user", "content": prompt}]} if is_chat else {"prompt": prompt}
        )
        body["stream"] = is_stream
        if is_stream:
            body["stream_options"] = {"include_usage": True}
        work = _request(client, config, body, is_chat)
        try:
            if hangs_up:
                status, tokens, ttft = await asyncio.wait_for(
                    work, timeout=rng.uniform(0.0, config.cut_within_s)
                )
            else:
                status, tokens, ttft = await work
        except TimeoutError:
            report.cancelled += 1
            continue
        except Exception as error:  # every failure is counted and kept
            report.failed += 1
            report.failures.append(repr(error)[:300])
            continue
        if status == 429:
            report.rejected += 1
            await asyncio.sleep(1.0)
        elif status != 200:
            report.failed += 1
            report.failures.append(f"HTTP {status}")
        else:
            report.completed += 1
            report.tokens += tokens
            if ttft is not None:
                report.ttft_s.append(ttft)


async def soak_round(config: SoakConfig, seconds: float) -> RoundReport:
    """One round: the clients for ``seconds``, then the server's state once it is idle."""
    report = RoundReport(seconds)
    headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=config.clients + 4)
    timeout = httpx.Timeout(config.drain_s)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        before = await server_state(client, config.url)
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.wait_for(
            asyncio.gather(
                *(_client(i, client, config, deadline, report) for i in range(config.clients))
            ),
            timeout=seconds + config.drain_s,
        )
        report.seconds = time.perf_counter() - start
        after = await wait_idle(client, config.url)
    report.server = {
        **after,
        "finished": after["finished"] - before["finished"],
        "errors": after["errors"] - before["errors"],
    }
    return report


async def server_state(client: httpx.AsyncClient, url: str) -> dict:
    text = (await client.get(f"{url}/metrics")).text

    def value(name: str) -> float:
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(match.group(1)) if match else float("nan")

    reasons = ("stop", "length", "abort", "error")
    return {
        "finished": sum(value(f'dspark_requests_total{{finish_reason="{r}"}}') for r in reasons),
        "errors": value('dspark_requests_total{finish_reason="error"}'),
        "running": value("dspark_running_requests"),
        "queued": value("dspark_queue_depth"),
        "free_slots": value("dspark_free_slots"),
        "slots": value("dspark_slots"),
        "kv_free_blocks": value("dspark_kv_cache_free_blocks"),
        "rss_mb": round(value("process_resident_memory_bytes") / 2**20, 1),
    }


async def wait_idle(client: httpx.AsyncClient, url: str, timeout: float = 10.0) -> dict:
    """The server's state once it runs and queues nothing (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        state = await server_state(client, url)
        if (state["running"] == 0 and state["queued"] == 0) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


def run_soak(config: SoakConfig, rounds: int, seconds: float) -> dict:
    """``rounds`` rounds of ``seconds`` each; the idle state before them and each round."""

    async def soak() -> dict:
        async with httpx.AsyncClient(timeout=30) as client:
            idle = await wait_idle(client, config.url)
        reports = [await soak_round(config, seconds) for _ in range(rounds)]
        return {"idle_before": idle, "rounds": reports}

    return asyncio.run(soak())


def problems(result: dict) -> list[str]:
    """Every way the soak went wrong (empty: it passed); the checks tests and the script
    share. RSS is compared between the last two rounds (the first one warms up)."""
    idle, rounds = result["idle_before"], result["rounds"]
    found = []
    for number, r in enumerate(rounds, 1):
        s = r.server
        if r.failed:
            found.append(f"round {number}: {r.failed} failed: {r.failures[:3]}")
        if not r.completed:
            found.append(f"round {number}: nothing completed")
        if s["running"] or s["queued"]:
            found.append(f"round {number}: {s['running']} running, {s['queued']} queued after")
        if s["free_slots"] != s["slots"] or s["kv_free_blocks"] != idle["kv_free_blocks"]:
            found.append(f"round {number}: slots or KV blocks still held: {s}")
        if s["errors"]:
            found.append(f"round {number}: the server ended {s['errors']} requests in error")
        # What reached the engine ended there: the completed ones, and hung-up ones at most.
        if not r.completed <= s["finished"] <= r.completed + r.cancelled:
            found.append(f"round {number}: the server finished {s['finished']} requests")
    if len(rounds) >= 3 and rounds[-1].server["rss_mb"] > 1.05 * rounds[-2].server["rss_mb"]:
        found.append(f"RSS grew over 5%: {[r.server['rss_mb'] for r in rounds]}")
    return found


def to_json(result: dict) -> dict:
    return {
        "idle_before": result["idle_before"],
        "rounds": [{"summary": r.summary(), "report": asdict(r)} for r in result["rounds"]],
        "problems": problems(result),
    }
