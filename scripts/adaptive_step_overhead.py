"""Host time an adaptive step spends beyond a fixed-K step at the same depth, on this CPU.

The tiny shape (random weights, replayed published chat acceptance) at CONCURRENCY,
fixed K = d against adaptive verification held at depth d (``drafting_pays`` answers d,
the gate off, the look-ahead on as on a GPU) for each DEPTH given (3 by default), three
interleaved runs of each; for full-
batch decode steps, the medians of the step's wall time and of its phases: the proposal
(``drafter``), the rest of the draft phase (``decide``: depth, budget, allocation), the
forward (on a CPU the look-ahead runs inside it, after the computation, so it shows
there; on a GPU it overlaps the device's work), apply, and the wall outside them
(``rest``).

    PYTHONPATH=src python scripts/adaptive_step_overhead.py [CONCURRENCY [DEPTH ...]]

Session 39 ran it at 16 with depths 4 and 7: what an adaptive step's host work grows by
with its depth, against a fixed-K step's.
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from host_path_time import Args  # the same tiny-shape engine settings
from step_trace import classify, traced

from dspark.bench.sweep import Replay, Setting, closed_loop, engine_for
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model

PHASES = ("wall", "drafter", "decide", "forward", "apply", "rest")


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    depths = [int(d) for d in sys.argv[2:]] or [3]
    torch.manual_seed(0)
    loaded = random_model(Args.shape, torch.float32, "cpu")
    replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve("published:chat"))
    rng = np.random.default_rng(0)
    vocab = loaded.config.vocab_size
    lengths = rng.integers(16, 200, 12 * concurrency)
    prompts = [rng.integers(3, vocab, int(n)).tolist() for n in lengths]
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    medians: dict[str, dict[str, list[float]]] = {}
    for _ in range(3):
        for setting, depth in [
            (s, d) for d in depths for s in (Setting("fixed", d), Setting("adaptive", 7))
        ]:
            engine = engine_for(loaded, setting, concurrency, Args, replay)
            adaptive = setting.spec == "adaptive"
            if adaptive:
                engine.gate = None
                engine.lookahead = True
                engine.verifier.drafting_pays = lambda *args, depth=depth, **kwargs: depth
            closed_loop(engine, prompts[:concurrency], params, concurrency)
            log: list[dict] = []
            traced(engine, log)
            closed_loop(engine, prompts[concurrency:], params, concurrency)
            steps = [
                e
                for e in log
                if e["num_reqs"] == concurrency
                and classify(e, adaptive).startswith("decode")
                and not e["undrafted"]
                and e["phase"] is not None
            ]
            label = setting.label if not adaptive else f"adaptive@{depth}"
            row = medians.setdefault(label, {name: [] for name in PHASES})
            values = {
                "wall": [e["wall"] for e in steps],
                "drafter": [e["drafter"] or 0.0 for e in steps],
                "decide": [e["phase"] - (e["drafter"] or 0.0) for e in steps],
                "forward": [e["forward"] for e in steps],
                "apply": [e["apply"] for e in steps],
                "rest": [e["wall"] - e["phase"] - e["forward"] - e["apply"] for e in steps],
            }
            for name in PHASES:
                row[name].append(float(np.median(values[name])))
    print(f"{concurrency} requests, ms (median per run, three runs each)")
    for label, row in medians.items():
        print(f"{label:>12} " + "  ".join(f"{n} {np.median(v):.3f}" for n, v in row.items()))


if __name__ == "__main__":
    main()
