"""Does a benchmark engine free its device memory once dropped? (8B shape, on a GPU.)

Builds engines one after another as ``dspark bench`` does (warm-up, measured run with
the heap frozen or not, ``del``, ``gc.collect``, ``empty_cache``) and prints, after each,
the device memory still allocated and whether the engine object is still alive; for a
live one, the types of what refers to it.

    PYTHONPATH=src python3 scripts/gpu/engine_leak.py [CONCURRENCY]
"""

import gc
import sys
import weakref

import numpy as np
import torch

from dspark.bench.sweep import Replay, Setting, engine_for, measure
from dspark.engine.replay import AcceptanceTrace, random_draft_model
from dspark.engine.sampling import SamplingParams
from dspark.models.shapes import random_model


class Args:
    out = "/tmp/engine-leak"
    device = "cuda"
    drafter = "auto"
    max_prompt_tokens = 256
    max_tokens = 32
    shape = "llama3-8b"
    graph_padding_budget = 4.0


def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    loaded = random_model(Args.shape, torch.bfloat16, "cuda")
    replay = Replay(random_draft_model(loaded), AcceptanceTrace.resolve("published:chat"))
    rng = np.random.default_rng(0)
    vocab = loaded.config.vocab_size
    prompts = [rng.integers(3, vocab, 64).tolist() for _ in range(4 * concurrency)]
    params = SamplingParams(temperature=0.0, max_tokens=Args.max_tokens)
    gib = 2.0**30
    print(f"weights: {torch.cuda.memory_allocated() / gib:.2f} GiB allocated")
    for freeze, unfreeze in ((False, False), (True, False), (True, True)):
        for setting in (Setting("none", 0), Setting("fixed", 3), Setting("adaptive", 7)):
            before = gc.get_freeze_count()
            engine = engine_for(loaded, setting, concurrency, Args, replay)
            alive = weakref.ref(engine)
            held = torch.cuda.memory_allocated() / gib
            half = 2 * concurrency
            measure(
                engine, setting, prompts[half:], params, concurrency, prompts[:half], False, freeze
            )
            after = gc.get_freeze_count()
            if unfreeze:  # whatever froze the heap, thaw it before dropping the engine
                gc.unfreeze()
            del engine
            gc.collect()
            torch.cuda.empty_cache()
            left = torch.cuda.memory_allocated() / gib
            print(
                f"freeze {freeze!s:5} unfreeze {unfreeze!s:5} frozen objects {before} -> {after}, "
                f"{setting.label:12} engine built at {held:6.2f} GiB, "
                f"after drop {left:6.2f} GiB, engine alive: {alive() is not None}"
            )
            if alive() is not None:
                for referrer in gc.get_referrers(alive()):
                    name = type(referrer).__name__
                    detail = ""
                    if isinstance(referrer, dict):
                        owners = [type(o).__name__ for o in gc.get_referrers(referrer)][:6]
                        detail = f" (a dict held by {owners})"
                    elif hasattr(referrer, "__qualname__"):
                        detail = f" ({referrer.__qualname__})"
                    print(f"    referred to by {name}{detail}")


if __name__ == "__main__":
    main()
