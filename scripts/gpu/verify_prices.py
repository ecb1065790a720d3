"""What the start-up profile prices a verify step at, against what the step costs.

SmolLM2 (``MODEL``, a GGUF path; ``default``: the embedded one) with its shipped drafter,
the engine ``dspark bench`` builds for adaptive verification (K = 7) at each
concurrency given. Per concurrency: the profile's per-size samples and medians, the
verify price of a full batch of decodes with b drafts under the seed's running maximum
and under the isotonic fit (``EngineConfig.profile_fit``), and then the same dummy steps
re-timed ``ROUNDS`` times (default 21) at every token count a full batch of decodes
verifies (n requests x 1 ... 8 tokens), interleaved, as the truth the prices should
follow. Writes the profiles under ``$OUT`` (or /tmp) for later reading.

    PYTHONPATH=src MODEL=... python3 scripts/gpu/verify_prices.py 16 64
"""

import os
import sys
from pathlib import Path

import numpy as np
import torch

from dspark.bench.sweep import Setting, engine_for
from dspark.engine.graphs import exact_shapes
from dspark.engine.profiling import EngineProfile, _dummy_step
from dspark.models.loader import load_model
from dspark.scheduling import cost_curves


class Args:
    out = os.environ.get("OUT", "/tmp") + "/verify-prices"
    device = os.environ.get("DEVICE", "cuda")  # DEVICE=cpu: a smoke test
    drafter = "dspark"
    max_prompt_tokens = 256
    max_tokens = 128
    shape = None
    graph_padding_budget = 4.0  # as dspark bench (CAPTURE_AFTER_WASTE)


def main() -> None:
    levels = [int(a) for a in sys.argv[1:]] or [16, 64]
    rounds = int(os.environ.get("ROUNDS", "21"))
    path = None if os.environ.get("MODEL", "default") == "default" else os.environ["MODEL"]
    dtype = torch.bfloat16 if Args.device == "cuda" else torch.float32
    loaded = load_model(path, dtype, Args.device)
    rng = np.random.default_rng(1)
    for n in levels:
        engine = engine_for(loaded, Setting("adaptive", 7), n, Args)
        profile_path = Path(engine.config.profile_path)
        profile = EngineProfile.load(profile_path)
        _, verify = cost_curves(profile.samples)
        by_size: dict[int, list[float]] = {}
        for s in profile.samples:
            by_size.setdefault(s.num_target_tokens, []).append(s.forward_ms)
        print(f"\n=== {n} requests: profile per size (median; samples), ms")
        for size, median in verify:
            if size <= 8 * n or size <= 16:
                samples = " ".join(f"{x:.2f}" for x in by_size[size])
                print(f"  {size:5d}: {median:6.3f}  ({samples})")
        tables = {fit: profile.cost_tables(fit) for fit in ("max", "isotonic")}
        print(f"  verify price of {n} decodes + b drafts (ms), b = 0, n, 2n, ... 7n:")
        for fit, table in tables.items():
            prices = [float(table.verify_ms[n + b]) for b in range(0, 7 * n + 1, n)]
            print(f"    {fit:9s}", " ".join(f"{p:6.3f}" for p in prices))
        depth_rows = {fit: profile.depth_costs(fit) for fit in ("max", "isotonic")}
        for fit, rows in depth_rows.items():
            if rows is not None:
                print(f"    drafter by depth ({fit}):", np.round(rows[:, n], 3).tolist())

        # The truth: every full-batch verify size, re-timed round by round.
        sizes = [n * q for q in range(1, 9)]
        times: dict[int, list[float]] = {size: [] for size in sizes}
        with exact_shapes(engine.padded_runners()):
            for size in sizes:  # capture and warm each shape first
                _dummy_step(engine, np.full(n, size // n), 128, rng, [])
            for _ in range(rounds):
                for index in rng.permutation(len(sizes)):
                    size = sizes[index]
                    ms, _ = _dummy_step(engine, np.full(n, size // n), 128, rng, [])
                    times[size].append(ms)
        print(f"  re-timed, {rounds} rounds: tokens, median, p20, p80 (ms)")
        for size in sizes:
            t = np.asarray(times[size])
            print(
                f"    {size:5d}: {np.median(t):6.3f} {np.percentile(t, 20):6.3f} "
                f"{np.percentile(t, 80):6.3f}"
            )
        del engine
        if Args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
