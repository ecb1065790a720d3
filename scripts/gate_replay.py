"""Replay a one-request decision log's cost-model decisions through ThroughputGate.

Reads the per-request strings of a summarised H200 decision log (``decision_log.py
--summarise``: D/v the cost model drafted, ./p it declined) and each request's chosen
drafted tokens per ms, then replays the cost model's decisions in a shuffled request
order through a fresh gate: drafted steps emit 1 + Poisson(mean - 1) tokens (at most 8)
in 6.09 ms (5% noise), undrafted ones 1 token in 3.77 ms (2% noise), the H200 figures of
that log. Prints the median tokens per ms and vetoes over 40 orders, for the gate as it
is, without a gate, and for each ``ALONE_SPEEDUP``.

    PYTHONPATH=src python scripts/gate_replay.py \\
        docs/results/bench/h200/traces/session12/decisions_c1_c97978d.txt
"""

import re
import sys

import numpy as np

import dspark.scheduling.gate as gate_module

DRAFTED_MS, UNDRAFTED_MS = 6.09, 3.77
UNKNOWN_RATE = 0.26  # requests the log never drafted by choice: about the undrafted rate


def read_requests(path: str) -> list[tuple[float, str]]:
    requests = []
    for line in open(path).read().splitlines():
        match = re.match(r"\s*(\d+) ([\d.]+) ([\d.]+) ([.Dvp]+)$", line)
        if match:
            rate = float(match.group(3))
            requests.append((rate if rate > 0 else UNKNOWN_RATE, match.group(4)))
    return requests


class NoGate:
    def should_draft(self, num_reqs, mixed=False):
        return True

    def should_probe(self, num_reqs, mixed=False):
        return False

    def record(self, *args):
        pass


def replay(requests, make_gate, seed: int) -> tuple[float, int]:
    rng = np.random.default_rng(seed)
    gate = make_gate()
    tokens = wall = 0.0
    vetoes = 0
    for index in np.random.default_rng(seed + 1000).permutation(len(requests)):
        rate, marks = requests[index]
        for mark in marks:
            chosen = mark in "Dv"
            drafted = gate.should_draft(1) if chosen else gate.should_probe(1)
            vetoes += chosen and not drafted
            if drafted:
                mean = rate * DRAFTED_MS if chosen else 0.27 * DRAFTED_MS
                step_tokens = 1 + min(7, rng.poisson(max(mean - 1, 0)))
                step_ms = DRAFTED_MS * rng.normal(1, 0.05)
            else:
                step_tokens, step_ms = 1, UNDRAFTED_MS * rng.normal(1, 0.02)
            gate.record(1, drafted, step_tokens, step_ms, False, drafted and not chosen)
            tokens += step_tokens
            wall += step_ms
    return tokens / wall, vetoes


def main() -> None:
    requests = read_requests(sys.argv[1])
    shipped = gate_module.ALONE_SPEEDUP

    def with_speedup(value):
        def make():
            gate_module.ALONE_SPEEDUP = value
            return gate_module.ThroughputGate()

        return make

    variants = [("no gate", NoGate), (f"as shipped ({shipped})", with_speedup(shipped))]
    variants += [(f"ALONE_SPEEDUP {v}", with_speedup(v)) for v in (1, 2, 4, 8, 16)]
    for name, make in variants:
        results = [replay(requests, make, seed) for seed in range(40)]
        rates, vetoes = np.array(results).T
        print(f"{name:24s} tokens/ms {np.median(rates):.4f}  vetoes {np.median(vetoes):.0f}")
    gate_module.ALONE_SPEEDUP = shipped


if __name__ == "__main__":
    main()
