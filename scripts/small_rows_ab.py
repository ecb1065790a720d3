"""The engine at one request on this CPU with the small-row products tuned at start-up
(``EngineConfig.small_rows="tune"``) against always ``weight @ x.T`` ("transposed", the
choice before session 10): no speculation, fixed K = 2 and K = 3, SmolLM2 and its shipped
drafter, 64 new tokens on 4 held-out ShareGPT prompts, two repeats alternating the order,
tok/s per run and the medians.

    python scripts/small_rows_ab.py
"""

import numpy as np

from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.graphs import CAPTURE_AFTER_WASTE
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model
from dspark.ops.linear import forget_small_rows, tune_small_rows


class Args:
    out = "/tmp/small-rows-ab"
    device = "cpu"
    drafter = "auto"
    max_prompt_tokens = 256
    max_tokens = 64
    shape = None
    prompts = None
    dataset = "sharegpt"
    graph_padding_budget = CAPTURE_AFTER_WASTE


def main() -> None:
    loaded = load_model(None)
    weights = loaded.model.linear_weights()
    prompts = bench_prompts(loaded.tokenizer, Args, 5)
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    warm = SamplingParams(temperature=0.0, max_tokens=16)
    runs: dict[tuple[str, str], list[float]] = {}
    for repeat in range(2):
        modes = ("tune", "transposed") if repeat == 0 else ("transposed", "tune")
        for mode in modes:
            for setting in (Setting("none", 0), Setting("fixed", 2), Setting("fixed", 3)):
                engine = engine_for(loaded, setting, 1, Args)  # tunes at start-up
                if mode == "transposed":
                    forget_small_rows(weights)
                else:
                    tune_small_rows(weights)  # the answer measured once per process
                closed_loop(engine, prompts[:1], warm, 1)
                finished, seconds = closed_loop(engine, prompts[1:], params, 1)
                rate = sum(len(r.output_ids) for r in finished) / seconds
                runs.setdefault((mode, setting.label), []).append(rate)
                line = f"repeat {repeat} {mode:>10} {setting.label:>8} {rate:6.2f} tok/s"
                print(line, flush=True)
    for (mode, label), rates in sorted(runs.items()):
        print(f"{mode:>10} {label:>8}: {np.median(rates):6.2f} tok/s ({rates})")


if __name__ == "__main__":
    main()
