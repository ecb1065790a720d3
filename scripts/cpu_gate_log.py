"""Adaptive at 4 on this CPU as the main job runs it (SmolLM2 + the shipped drafter, a
quarter-length warm-up, 8 requests of 48 tokens), beside no speculation, REPEATS times:
logs every throughput-gate record and the cost model's learnt state after the warm-up
and at the end of the run.

    .venv/bin/python scripts/cpu_gate_log.py [REPEATS]

Each gate record prints as (phase, requests, drafted, tokens, wall ms, with a prompt
chunk, declined by the cost model); steps of fewer than four requests are printed only
during the warm-up.
"""

import sys
from types import SimpleNamespace

import torch

from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for, learnt_state
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model

CONCURRENCY = 4
ARGS = SimpleNamespace(  # what dspark bench's CPU defaults give engine_for
    device="cpu",
    drafter="auto",
    max_prompt_tokens=256,
    max_tokens=48,
    prompts=None,
    dataset="sharegpt",
    graph_padding_budget=4.0,
    shape=None,
    model=None,
    out="/tmp/cpu-gate-log",
)


def logged(engine, log: list, phase: list) -> None:
    """Appends every gate record of ``engine`` to ``log``, tagged with ``phase[0]``."""
    record = engine.gate.record

    def wrapper(num_reqs, drafted, tokens, wall, mixed=False, declined=False):
        log.append((phase[0], num_reqs, drafted, tokens, round(wall, 1), mixed, declined))
        return record(num_reqs, drafted, tokens, wall, mixed, declined)

    engine.gate.record = wrapper


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.set_num_threads(2)
    loaded = load_model(None, torch.float32, "cpu")
    prompts = bench_prompts(loaded.tokenizer, ARGS, 2 * CONCURRENCY + CONCURRENCY)
    warm, measured = prompts[:CONCURRENCY], prompts[CONCURRENCY:]
    for repeat in range(repeats):
        for spec in ("none", "adaptive"):
            setting = Setting(spec, 0 if spec == "none" else 7)
            engine = engine_for(loaded, setting, CONCURRENCY, ARGS, None)
            log: list = []
            phase = ["warm"]
            if engine.gate is not None:
                logged(engine, log, phase)
            closed_loop(engine, warm, SamplingParams(max_tokens=12), CONCURRENCY)
            if spec == "adaptive":
                print("after warm-up:", learnt_state(engine, CONCURRENCY))
            phase[0] = "run"
            params = SamplingParams(max_tokens=ARGS.max_tokens)
            finished, seconds = closed_loop(engine, measured, params, CONCURRENCY)
            tokens = sum(len(r.output_ids) for r in finished)
            print(f"rep {repeat} {spec}: {tokens / seconds:.1f} tok/s")
            if spec == "adaptive":
                print("end:", learnt_state(engine, CONCURRENCY))
                for entry in log:
                    if entry[1] >= CONCURRENCY or entry[0] == "warm":
                        print("  ", entry)
            del engine


if __name__ == "__main__":
    main()
