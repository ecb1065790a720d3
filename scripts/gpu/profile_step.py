"""Where an engine step's time goes on the GPU: the 8B shape (random weights, replayed
acceptance), steady-state decode at a given concurrency, per spec mode.

    PYTHONPATH=src python3 scripts/gpu/profile_step.py 16 256

Prints, per level and mode: wall ms per step (median of 12 steps), the engine's own
forward/drafter timers, host syncs per step (``torch.cuda.set_sync_debug_mode``) and the
top operators by self CPU time from ``torch.profiler``.
"""

import cProfile
import os
import pstats
import sys
import time
import warnings

import numpy as np
import torch

from dspark.bench.sweep import Replay, Setting, engine_for
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model
from dspark.train.data import load_prompts


class Args:
    out = "/tmp/profile-step"
    device = "cuda"
    drafter = "auto"
    max_prompt_tokens = 256
    max_tokens = 160  # sizes the KV cache: the profile runs ~25 steps past the prompts
    shape = "llama3-8b"
    graph_padding_budget = 4.0  # as dspark bench (CAPTURE_AFTER_WASTE)


def main() -> None:
    levels = [int(a) for a in sys.argv[1:]] or [16, 256]
    loaded = random_model("llama3-8b", torch.bfloat16, "cuda")
    replay = Replay(random_draft_model(loaded), AcceptanceTrace.load())
    prompts = [p for p in load_prompts(".gpu/prompts.npz")["eval"] if len(p) <= 256]
    params = SamplingParams(temperature=0.0, max_tokens=4096, ignore_eos=True)
    for level in levels:
        for setting in (Setting("none", 0), Setting("fixed", 7), Setting("adaptive", 7)):
            engine = engine_for(loaded, setting, level, Args(), replay)
            for prompt in prompts[:level]:
                engine.add_request(prompt, params)
            while (
                any(r.is_prefilling for r in engine.scheduler.running) or engine.scheduler.waiting
            ):
                engine.step()
            for _ in range(3):
                engine.step()
            engine.stats.__init__()
            walls = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                for _ in range(12):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    engine.step()
                    torch.cuda.synchronize()
                    walls.append((time.perf_counter() - start) * 1e3)
                torch.cuda.set_sync_debug_mode(0)
            syncs = sum("synchroniz" in str(w.message) for w in caught) / 12
            stats = engine.stats
            print(
                f"\n=== conc {level} {setting.label}: wall {np.median(walls):.1f} ms/step, "
                f"forward {np.median(stats.forward_ms):.1f} ms, drafter "
                f"{np.median(stats.drafter_ms) if stats.drafter_ms else 0:.1f} ms, "
                f"schedule {np.median(stats.schedule_ms) if stats.schedule_ms else 0:.2f} ms, "
                f"syncs/step {syncs:.1f}"
            )

            def med(values):
                return np.median(values) if values else 0.0

            print(
                f"    host phases: draft {med(stats.draft_phase_ms):.1f} ms (apply incl. "
                f"observe) {med(stats.apply_ms):.1f} ms, observe {med(stats.observe_ms):.1f} ms"
            )
            if os.environ.get("PYPROF"):  # where the host time goes, by Python function
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(6):
                    engine.step()
                torch.cuda.synchronize()
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
                continue
            if setting.spec != "adaptive":
                with torch.profiler.profile(
                    activities=[
                        torch.profiler.ProfilerActivity.CPU,
                        torch.profiler.ProfilerActivity.CUDA,
                    ]
                ) as prof:
                    for _ in range(4):
                        engine.step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8))
            del engine
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
