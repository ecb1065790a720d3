"""Server metrics in the Prometheus text format (no client library needed)."""

from __future__ import annotations

import bisect
import os
import threading
from collections import Counter
from dataclasses import dataclass, field

TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
TTFT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            cumulative += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines += [f"{name}_sum {self.total}", f"{name}_count {self.count}"]
        return lines


class ServerMetrics:
    """Counters the engine thread writes and the HTTP thread reads (under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished: Counter[str] = Counter()  # by finish reason
        self.rejected: Counter[str] = Counter()  # by HTTP status
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.tpot = Histogram(TPOT_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.gauges: dict[str, float] = {}

    def render(self) -> str:
        with self.lock:
            lines = [
                "# HELP dspark_requests_total Requests finished, by finish reason.",
                "# TYPE dspark_requests_total counter",
            ]
            for reason in ("stop", "length", "abort", "error"):
                lines.append(
                    f'dspark_requests_total{{finish_reason="{reason}"}} {self.finished[reason]}'
                )
            lines += [
                "# HELP dspark_requests_rejected_total Requests refused, by HTTP status.",
                "# TYPE dspark_requests_rejected_total counter",
            ]
            for status in ("400", "401", "404", "413", "429", "500", "503"):
                lines.append(
                    f'dspark_requests_rejected_total{{status="{status}"}} {self.rejected[status]}'
                )
            lines += [
                "# TYPE dspark_prompt_tokens_total counter",
                f"dspark_prompt_tokens_total {self.prompt_tokens}",
                "# TYPE dspark_generation_tokens_total counter",
                f"dspark_generation_tokens_total {self.generation_tokens}",
            ]
            lines += self.tpot.render(
                "dspark_time_per_output_token_seconds",
                "Time per output token of finished requests.",
            )
            lines += self.ttft.render(
                "dspark_time_to_first_token_seconds", "Time to first token of finished requests."
            )
            for name, value in sorted(self.gauges.items()):
                lines += [f"# TYPE dspark_{name} gauge", f"dspark_{name} {value}"]
        rss = resident_bytes()
        if rss is not None:  # the name Prometheus client libraries give it
            lines += ["# TYPE process_resident_memory_bytes gauge"]
            lines += [f"process_resident_memory_bytes {rss}"]
        return "\n".join(lines) + "\n"


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
