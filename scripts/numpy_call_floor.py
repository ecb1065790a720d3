"""What one NumPy call costs on this machine at the scheduling core's sizes: the floor
under ``choose_draft_budget``'s time, which is a few dozen such calls.

    .venv/bin/python scripts/numpy_call_floor.py

Prints the fastest of five timings (microseconds a call) of the calls the budget's
binned search is made of, on the arrays it meets at 256 requests x K = 7 (1,792 slots,
65 bins), and of an empty Python call for scale. Session 35, this 2-core VM: 0.3-2.3 µs
a call (``docs/bench/scheduler.md``).
"""

from __future__ import annotations

import timeit

import numpy as np


def per_call_us(call, number: int = 20000) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    slots = rng.random(1792)
    out = np.empty_like(slots)
    row = rng.random(256)
    row_out = np.empty_like(row)
    keys = (slots * 64).astype(np.int64)
    bins = slots[:65]
    calls = {
        "np.add, 256 floats, out=": lambda: np.add(row, 1.0, out=row_out),
        "np.add, 1,792 floats, out=": lambda: np.add(slots, 1.0, out=out),
        "np.maximum.reduce, 1,792": lambda: np.maximum.reduce(slots),
        "np.bincount, 1,792 keys": lambda: np.bincount(keys, None, 65),
        "np.bincount, 1,792 keys, weights": lambda: np.bincount(keys, slots, 65),
        "np.add.accumulate, 65": lambda: np.add.accumulate(bins),
        "argmax, 65": lambda: bins.argmax(),
        "np.sort, 1,792 floats": lambda: np.sort(slots),
        "an empty Python call": lambda: None,
    }
    for name, call in calls.items():
        number = 2000 if "sort" in name else 20000
        print(f"{name:36s} {per_call_us(call, number):7.3f} µs")


if __name__ == "__main__":
    main()
