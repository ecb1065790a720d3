"""What adaptive verification decides, step by step, on the CPU default (SmolLM2 + the
shipped drafter, held-out ShareGPT prompts, greedy, 32 new tokens): the cost model's
drafting depth (``model``), the throughput gate's answer (``gate``), and each timed step
(``step drafted tokens wall_ms``), then the gate's measured rates and the overheads the
cost model learnt beyond its profiled prices (``ObservedDraftCost.overhead_ms``).

    python scripts/gate_trace.py [concurrency]
"""

import argparse
import sys

import torch

from dspark.bench import sweep
from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    parser = argparse.ArgumentParser()
    sweep.add_cli_args(parser)
    args = parser.parse_args(
        ["--concurrency", str(concurrency), "--max-tokens", "32", "--out", "/tmp/gate-trace"]
    )
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    prompts = bench_prompts(loaded.tokenizer, args, max(4, concurrency) + 1)
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, args)
    gate, verifier = engine.gate, engine.verifier
    should_draft, record, drafting_pays = gate.should_draft, gate.record, verifier.drafting_pays

    def traced_pays(*a, **k):
        depth = drafting_pays(*a, **k)
        print("model", depth)
        return depth

    def traced_draft(num_reqs, mixed=False):
        answer = should_draft(num_reqs, mixed)
        print("gate", "mixed" if mixed else "decode", answer)
        return answer

    def traced_record(num_reqs, drafted, tokens, wall_ms, mixed=False, *rest):
        print(f"step {'mixed' if mixed else 'decode'} {drafted} {tokens} {wall_ms:.1f}")
        record(num_reqs, drafted, tokens, wall_ms, mixed, *rest)

    verifier.drafting_pays = traced_pays
    gate.should_draft, gate.record = traced_draft, traced_record
    closed_loop(engine, prompts[1:], SamplingParams(temperature=0.0, max_tokens=32), concurrency)
    print("rates (drafted, undrafted) tokens/ms:", gate.rates(concurrency))
    print("with a prompt chunk:", gate.rates(concurrency, mixed=True))
    cost = verifier.cost_model
    print(
        f"learnt overhead at {concurrency} requests beyond the profiled price, ms: "
        f"undrafted {cost.overhead_ms(concurrency, 0):.1f}, drafted 1 deep "
        f"{cost.overhead_ms(concurrency, 1):.1f}, {cost.num_positions} deep "
        f"{cost.overhead_ms(concurrency, None):.1f}"
    )


if __name__ == "__main__":
    main()
