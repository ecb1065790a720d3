"""What choosing a step's graph costs on the host when its shape is not captured yet.

    python scripts/cover_lookup.py

``CaptureLedger.choose`` for a covered shape among 32 captured graphs (two key spans,
two piece counts, eight token counts): with the cover looked up once per captured set
(as the runners use it), against searching every graph on each call. Medians of 7 runs
of 20,000 calls, µs per call.
"""

import statistics
import timeit
from collections import OrderedDict

from dspark.engine.graphs import CaptureLedger, StepShape, padding_waste


def main() -> None:
    tokens = (16, 32, 48, 64, 96, 128, 160, 192)
    captured = OrderedDict(
        (StepShape(t, r, length), None) for t in tokens for r in (16, 32) for length in (256, 512)
    )
    shape = StepShape(80, 16, 256)
    ledger = CaptureLedger(padding_waste, budget=float("inf"))  # never captures: covers only

    def uncached() -> object:
        ledger.forget_covers()
        return ledger.choose(shape, captured)

    for name, call in (("cached", lambda: ledger.choose(shape, captured)), ("search", uncached)):
        runs = timeit.repeat(call, number=20_000, repeat=7)
        print(f"{name}: {statistics.median(runs) / 20_000 * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
