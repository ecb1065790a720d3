"""Tensor parallelism on this machine: TP=2 against TP=1 tokens/s, and what TP costs.

Each repeat runs TP=1 and TP=2 (order alternating between repeats), each in a fresh
process of its own (the thread count is process-wide: TP=1 takes every core, each TP=2
rank its share), at every concurrency, for no speculation and adaptive verification:
``concurrency`` chat prompts generate ``--max-tokens`` tokens each (greedy, EOS ignored)
after a warm-up generation; tok/s = generated tokens over wall time. The TP=2 runs also
record rank 0's host cost of every plan message (encode, digest, write) and its size.
Two micro-measurements on one core per process back the layout choices: the LM head's
product over the whole vocabulary against half of it plus the gloo all-gather a
vocabulary-parallel head would need, and the per-layer all-reduce.

    python scripts/bench_tp.py --out docs/results/tp/cpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

PROMPTS = [
    "Explain why the sky is blue in a few sentences.",
    "Write a short Python function that reverses a string, then explain it.",
    "List three tips for writing clear technical documentation.",
    "What is the difference between a process and a thread?",
]


def run_engines(args) -> dict:
    """One process's runs: every spec and concurrency at this TP size."""
    from dspark.engine.config import EngineConfig
    from dspark.engine.llm import LLM
    from dspark.engine.sampling import SamplingParams
    from dspark.models.loader import cache_dir

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    results = []
    for spec in args.specs:
        config = EngineConfig(
            spec=spec,
            num_drafts=4,
            max_num_seqs=max(args.concurrency),
            max_num_batched_tokens=512,
            kv_cache_tokens=16384,
            profile_path=str(cache_dir() / f"profile-bench-tp{args.tp}.json"),
            tensor_parallel_size=args.tp,
        )
        with LLM(None, config=config) as llm:
            prompts = [llm.chat_prompt(p) for p in PROMPTS]
            llm.generate(prompts[:2], params)  # warm-up
            runner = llm.engine.runner
            for concurrency in args.concurrency:
                stats = llm.engine.stats
                steps_before = len(stats.step_log)
                drafter_before = len(stats.drafter_ms)
                plans_before = len(getattr(runner, "plan_ms", []))
                start = time.perf_counter()
                outputs = llm.generate(prompts[:concurrency], params)
                seconds = time.perf_counter() - start
                tokens = sum(len(o.token_ids) for o in outputs)
                row = {
                    "tp": args.tp,
                    "spec": spec,
                    "concurrency": concurrency,
                    "tok_s": tokens / seconds,
                    "step_ms": statistics.median(
                        s.wall_ms for s in list(stats.step_log)[steps_before:]
                    ),
                    "output_digest": hash(tuple(tuple(o.token_ids) for o in outputs)),
                }
                if list(stats.drafter_ms)[drafter_before:]:
                    row["drafter_ms"] = statistics.median(list(stats.drafter_ms)[drafter_before:])
                if hasattr(runner, "plan_ms"):
                    row["plan_ms"] = runner.plan_ms[plans_before:]
                    row["plan_bytes"] = runner.plan_bytes[plans_before:]
                results.append(row)
    return {"runs": results}


def layout_costs(rank: int, port: int, rows_list: list[int]) -> dict:
    """LM head whole vs half, and gloo collectives, one thread per process (2 ranks)."""
    import torch.distributed as dist

    from dspark.engine.distributed import open_group
    from dspark.models.loader import load_model

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    group = open_group(store, rank, 2, 60.0, torch.device("cpu"))
    out = {}
    head = None
    if rank == 0:
        head = load_model().model.lm_head.weight.detach()
    vocab, hidden = 49152, 576

    def timed(fn, repeats=30) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    from dspark.ops.linear import linear

    with torch.inference_mode():
        for rows in rows_list:
            x = torch.randn(rows, hidden)
            if rank == 0:
                out[f"head_whole_ms@{rows}"] = timed(lambda x=x: linear(x, head))
                half = head[: vocab // 2].contiguous()
                out[f"head_half_ms@{rows}"] = timed(lambda x=x, h=half: linear(x, h))
            part = torch.randn(rows, vocab // 2)
            parts = [torch.empty_like(part) for _ in range(2)]
            gather_ms = timed(lambda p=part, ps=parts: group.allgather([ps], [p]).wait())
            reduce_ms = timed(lambda x=x: group.allreduce([x]).wait())
            out[f"gather_half_logits_ms@{rows}"] = gather_ms
            out[f"allreduce_hidden_ms@{rows}"] = reduce_ms
    return out


def child(args) -> None:
    result = (
        run_engines(args)
        if args.role == "engines"
        else layout_costs(args.rank, args.port, args.concurrency_rows)
    )
    Path(args.result).write_text(json.dumps(result))


def spawn(extra: list[str], result: Path) -> subprocess.Popen:
    command = [sys.executable, __file__, "--child", "--result", str(result), *extra]
    return subprocess.Popen(command, env={**os.environ, "PYTHONPATH": "src"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/tp/cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--specs", nargs="+", default=["none", "adaptive"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="engines", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.concurrency_rows = [1, 4, 20]
    if args.child:
        child(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "scratch"
    scratch.mkdir(exist_ok=True)
    common = ["--max-tokens", str(args.max_tokens), "--concurrency"]
    common += [str(c) for c in args.concurrency] + ["--specs", *args.specs]
    runs = []
    for repeat in range(args.repeats):
        for tp in (1, 2) if repeat % 2 == 0 else (2, 1):
            result = scratch / f"r{repeat}-tp{tp}.json"
            spawn([*common, "--tp", str(tp)], result).wait()
            for row in json.loads(result.read_text())["runs"]:
                runs.append({**row, "repeat": repeat})
            print(f"[bench_tp] repeat {repeat} tp {tp} done", flush=True)
    port = 29517
    peers = [
        spawn(
            ["--role", "layout", "--rank", str(r), "--port", str(port)], scratch / f"layout{r}.json"
        )
        for r in (0, 1)
    ]
    for peer in peers:
        peer.wait()
    layout = json.loads((scratch / "layout0.json").read_text())
    for path in scratch.iterdir():
        path.unlink()
    scratch.rmdir()
    summary = summarise(runs)
    record = {
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "summary": summary,
        "layout": layout,
    }
    (out / "tp_cpu.json").write_text(json.dumps(record, indent=1))
    plot(summary, out / "tp_cpu.png")
    print(json.dumps({"summary": summary, "layout": layout}, indent=1))


def summarise(runs: list[dict]) -> list[dict]:
    """Per (spec, concurrency): median tok/s of each TP, the TP=2/TP=1 ratio within each
    repeat, and the plan message's cost."""
    rows = []
    keys = sorted({(r["spec"], r["concurrency"]) for r in runs})
    for spec, concurrency in keys:
        mine = [r for r in runs if r["spec"] == spec and r["concurrency"] == concurrency]
        by_tp = {tp: [r for r in mine if r["tp"] == tp] for tp in (1, 2)}
        ratios = [
            two["tok_s"] / one["tok_s"]
            for one in by_tp[1]
            for two in by_tp[2]
            if one["repeat"] == two["repeat"]
        ]
        plans = [ms for r in by_tp[2] for ms in r.get("plan_ms", [])]
        sizes = [b for r in by_tp[2] for b in r.get("plan_bytes", [])]
        row = {
            "spec": spec,
            "concurrency": concurrency,
            "tp1_tok_s": statistics.median(r["tok_s"] for r in by_tp[1]),
            "tp2_tok_s": statistics.median(r["tok_s"] for r in by_tp[2]),
            "tp2_over_tp1": statistics.median(ratios),
            "tp2_over_tp1_runs": ratios,
            "tp1_step_ms": statistics.median(r["step_ms"] for r in by_tp[1]),
            "tp2_step_ms": statistics.median(r["step_ms"] for r in by_tp[2]),
            "plan_ms_median": statistics.median(plans),
            "plan_ms_p90": float(np.percentile(plans, 90)),
            "plan_bytes_median": statistics.median(sizes),
            "same_tokens": len({r["output_digest"] for r in mine}) == 1,
        }
        drafter = [r["drafter_ms"] for r in by_tp[2] if "drafter_ms" in r]
        if drafter:
            row["tp2_drafter_ms"] = statistics.median(drafter)
        rows.append(row)
    return rows


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['spec']}\n{r['concurrency']} req" for r in summary]
    x = np.arange(len(summary))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x - 0.2, [r["tp1_tok_s"] for r in summary], 0.4, label="TP=1")
    ax.bar(x + 0.2, [r["tp2_tok_s"] for r in summary], 0.4, label="TP=2 (gloo)")
    for i, r in enumerate(summary):
        ax.text(i + 0.2, r["tp2_tok_s"], f"{r['tp2_over_tp1']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(x, labels)
    ax.set_ylabel("tokens/s (median of repeats)")
    ax.set_title("SmolLM2-135M, fp32, 2-core CPU: TP=2 vs TP=1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
