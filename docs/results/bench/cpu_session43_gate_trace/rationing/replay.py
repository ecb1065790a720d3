"""The gate alone, with and without rationing its upper bound (``uncertain_every`` 4 and
1), on synthetic steps of 4 requests: undrafted 4 tokens in 49 ms (lognormal spread 5%),
drafted 4 + Binomial(16, p) tokens in 128 ms (spread 10%); 20 seeds of 600 decisions
each. Needs ``uncertain_every.patch`` (beside this file) applied to
``src/dspark/scheduling/gate.py``; the change was not kept.

    git apply docs/results/bench/cpu_session43_gate_trace/rationing/uncertain_every.patch
    .venv/bin/python docs/results/bench/cpu_session43_gate_trace/rationing/replay.py
    git checkout src/dspark/scheduling/gate.py

Prints, per p and setting: the median and the largest count of drafted steps, and the
median tokens per ms.
"""

import numpy as np

from dspark.scheduling.gate import ThroughputGate


def run(uncertain_every: int, seed: int, p: float, steps: int = 600) -> tuple[int, float]:
    rng = np.random.default_rng(seed)
    gate = ThroughputGate(uncertain_every=uncertain_every)
    drafted = tokens = wall = 0
    for _ in range(steps):
        draft = gate.should_draft(4)
        if draft:
            step_tokens, step_wall = 4 + rng.binomial(16, p), 128 * rng.lognormal(0, 0.1)
        else:
            step_tokens, step_wall = 4, 49 * rng.lognormal(0, 0.05)
        gate.record(4, draft, int(step_tokens), step_wall)
        drafted += draft
        tokens += step_tokens
        wall += step_wall
    return drafted, tokens / wall


for p in (0.3, 0.35, 0.45, 0.6):
    for every in (1, 4):
        runs = [run(every, seed, p) for seed in range(20)]
        counts = [count for count, _ in runs]
        rate = np.median([r for _, r in runs])
        print(f"p {p} uncertain_every {every}: drafted median {np.median(counts)},"
              f" most {max(counts)}; {rate:.4f} tokens/ms")
