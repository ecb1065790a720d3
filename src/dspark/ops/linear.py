"""Dense products of a few rows on the CPU: which kernel runs them, over how many rows.

A decode or verify step multiplies a few dozen rows (K + 1 per request) by every weight
of the model, and on a CPU how long that takes depends far more on the kernel than on the
arithmetic: ``F.linear``, ``weight @ x.T`` and oneDNN over weights packed once into its
blocked layout can differ severalfold at the same row count. Which is fastest differs by
machine and by row count, so ``tune_small_rows`` times the three on the model's own
weights at start-up and ``linear`` follows its plan.

Every path gives each output row from its own input row alone, so rows may be padded with
zeros to a count that runs faster and dropped after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

FLAT, TRANSPOSED, PACKED = "linear", "transposed", "packed"
PATHS = (FLAT, TRANSPOSED, PACKED)
"""How ``linear`` may run a product: ``F.linear``; ``weight @ x.T`` (one weight read for
the few rows, where ``F.linear`` may read it once per row); oneDNN's product over a copy
of the weight packed once (``packed_weight``)."""

SKINNY_ROWS = 16
"""Until ``tune_small_rows`` has measured this machine, products with 2 ... SKINNY_ROWS
rows run as ``weight @ x.T``, which reads each weight once for the few rows."""

TUNED_ROWS = (*range(1, 17), 20, 24, 28, 32, 36, 40, 44, 48, 56, 64)
"""The row counts ``tune_small_rows`` times (every count a verify step of up to 16 tokens
can have, then every fourth up to 48, the verify steps of 16 requests drafting 1-2 deep);
a count between two takes the choice of the next one timed, and more than the last runs
as the last does, over its own rows (a prompt chunk). Counts above 32 are timed every
fourth rather than at 48 alone: the fastest path can change between 33 and 48 rows, and
a count that takes a far larger count's choice may pay for it on every step."""

PAD_GAIN = 0.9
PAD_MULTIPLE = 4
"""``tune_small_rows`` pads a row count's products to a larger count timed, a multiple of
``PAD_MULTIPLE``, where that one measured at most ``PAD_GAIN`` of the count's own best
time: a BLAS can run some counts slower than larger ones. The targets are SIMD-friendly
widths and the gain asked is wide because a count is timed over two sweeps on a machine
whose speed wanders: with any target and a narrow gain, a lucky sweep of a larger count
can pad a count to one that then runs slower than the count unpadded."""

ROW_MAJOR_MAX_ROWS = 8
"""Up to this many rows the transposed product's ``[rows, out]`` result is copied
row-major: left transposed, every elementwise step after it (bias, activation, norm,
residual, the sampler's reductions) runs along its few rows, which costs more than the
copy; by 16 rows the copy costs what it saves."""

COLUMN_MAJOR_COST = 1.1
"""``tune_small_rows`` weighs the transposed product's sweeps above ``ROW_MAJOR_MAX_ROWS``
by this: there its ``[rows, out]`` result is left column-major, and what follows it in
the layer pays for that, which the product's own timing does not see: a transposed
product a few percent ahead in its own sweeps can still lose over the whole forward."""

PACK_ROWS = 16
"""The row count oneDNN is told to expect when it packs a weight (the layout it picks;
one packing serves every count, as packing per count times no faster)."""

_ROW_PLAN: dict[tuple[int, int], tuple[tuple[str, int], ...]] = {}
"""Per weight shape, by row count ``r``, how ``linear`` runs ``r`` rows: ``(path, m)``,
the product of ``PATHS`` over the rows padded with zeros to ``m`` (``m == r``: not
padded). Entry 0 is unused."""

_TUNED: dict[tuple, tuple[tuple[str, int], ...]] = {}  # the plans measured, per weight set


def packing_available() -> bool:
    """Whether this torch has oneDNN's packed products on the CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


_PACKED: dict[int, tuple[tuple[int, int], torch.Tensor | None]] = {}
"""Per weight (by ``id``, dropped when the weight is freed): the (data pointer, version)
it was packed at and its packed copy (None: oneDNN could not pack it)."""


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` in oneDNN's blocked layout, packed on first use and kept while the weight
    lives; packed again when its storage or version counter changed (moved, loaded, or
    changed in place by an op autograd counts: ``w.data.copy_`` is not seen). None where
    oneDNN cannot pack it (its dtype on this CPU)."""
    stamp = (weight.data_ptr(), _version(weight))
    kept = _PACKED.get(id(weight))
    if kept is None or kept[0] != stamp:
        if kept is None:
            weakref.finalize(weight, _PACKED.pop, id(weight), None)
        try:
            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
        except RuntimeError:
            packed = None
        kept = _PACKED[id(weight)] = (stamp, packed)
    return kept[1]


def packed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for a contiguous 2-D ``x``, by oneDNN over the packed
    copy of ``weight`` (``F.linear`` itself where it has none)."""
    packed = packed_weight(weight)
    if packed is None:
        return F.linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def is_packed(weight: torch.Tensor) -> bool:
    """Whether a packed copy of ``weight`` is kept."""
    kept = _PACKED.get(id(weight))
    return kept is not None and kept[1] is not None


def drop_packed(weights: Sequence[torch.Tensor]) -> None:
    """Free the packed copies of ``weights`` (a plan that never takes them)."""
    for w in weights:
        if id(w) in _PACKED:
            _PACKED[id(w)] = ((-1, -1), None)  # packed again if a plan asks


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return -1


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear``, except for a few dozen rows on the CPU: there the product and row
    count ``tune_small_rows`` measured fastest for this weight's shape (the rows padded
    with zeros where that count ran faster), or, for a shape not measured, ``weight @
    x.T`` for 2 ... SKINNY_ROWS rows. One row the plan sends through ``weight @ x.T`` or
    the packed product runs as two (a matrix-vector product tends to be the slower
    kernel, and oneDNN's rows then match those of every larger count bit for bit). Where
    autograd records, the packed product (which it cannot differentiate) gives way to
    ``F.linear``."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if x.device.type != "cpu" or rows == 0:
        return F.linear(x, weight, bias)
    plan = _ROW_PLAN.get(weight.shape)  # a torch.Size hashes and compares as a tuple
    if plan is None:
        path, size = (TRANSPOSED, rows) if 2 <= rows <= SKINNY_ROWS else (FLAT, rows)
    elif rows < len(plan):
        path, size = plan[rows]
    else:
        path, size = plan[-1][0], rows
    if path == PACKED and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        path, size = FLAT, rows
    if path == FLAT and size == rows:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, -1)
    if size > rows:
        flat = torch.cat((flat, flat.new_zeros(size - rows, flat.shape[1])))
    if path == FLAT:
        out = F.linear(flat, weight)[:rows]
    elif path == PACKED:
        out = packed_product(flat.contiguous(), weight)[:rows]
    else:
        out = torch.mm(weight, flat.t())[:, :rows].t()
        if rows <= ROW_MAJOR_MAX_ROWS:
            out = out.contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def tune_small_rows(
    weights: Sequence[torch.Tensor],
    repeats: int = 2,
    clock=time.perf_counter,
    keep_shapes: frozenset = frozenset(),
    store: Path | None = None,
) -> frozenset[int]:
    """Measure, for each row count of ``TUNED_ROWS``, how fast each product of ``PATHS``
    (the packed one where ``packing_available``) runs over ``weights`` on this CPU, and
    have ``linear`` take for these weights' shapes, at each count, the fastest over that
    many rows or, where a larger count timed ran at most ``PAD_GAIN`` of that, the fastest
    over the rows padded to it; returns the counts timed that were left to ``F.linear``
    over their own rows.

    ``weights`` are a model's, in the order a forward reads them: a sweep over all of
    them reads each from memory as a step does (a few repeated products would time them
    in cache). Each row count times every product ``repeats`` times, in turn, and keeps
    each one's fastest sweep (seconds, once at start-up). Plans are kept per weight set
    (shapes, dtype and thread count), so a second engine on the same model does not
    measure again. CUDA weights, or none, leave everything as it is.

    ``keep_shapes``: shapes whose plan is left as it is (a drafter tuned after its
    target leaves the shapes they share to the target's timing). Packed copies a weight's
    plan never takes are freed.

    ``store``: a folder where plans are kept across processes, one file per weight set
    and machine (CPU, torch, thread count), so that a server or worker started again on
    the same machine does not measure again; delete it to measure afresh."""
    weights = [w for w in weights if w.dim() == 2 and w.device.type == "cpu"]
    if not weights:
        return frozenset()
    key = (tuple(tuple(w.shape) for w in weights), weights[0].dtype, torch.get_num_threads())
    if key not in _TUNED:
        stored = _stored_plan(store, key) if store else None
        if stored is not None and _packs(stored) and not _packable(weights):
            stored = None  # packed on the machine that measured it, not here
        _TUNED[key] = stored or _measured_plan(weights, repeats, clock)
        if store and stored is None:
            _store_plan(store, key, _TUNED[key])
    elif store and not _store_file(store, key).is_file():  # measured before, not kept
        _store_plan(store, key, _TUNED[key])
    plan = _TUNED[key]
    for w in weights:
        if tuple(w.shape) not in keep_shapes:
            _ROW_PLAN[tuple(w.shape)] = plan
    follows = [_ROW_PLAN.get(tuple(w.shape)) for w in weights]
    drop_packed([w for w, p in zip(weights, follows, strict=True) if p is None or not _packs(p)])
    return frozenset(rows for rows in TUNED_ROWS if plan[rows] == (FLAT, rows))


STORE_FORMAT = 1
"""Bumped whenever how a plan is chosen from its times changes: stored plans made the
old way are measured again."""


def _store_file(store: Path, key: tuple) -> Path:
    shapes, dtype, threads = key
    machine = (cpu_name(), torch.__version__, str(dtype), threads, packing_available())
    rules = (STORE_FORMAT, TUNED_ROWS, PAD_GAIN, PAD_MULTIPLE, ROW_MAJOR_MAX_ROWS)
    text = json.dumps([machine, shapes, rules, COLUMN_MAJOR_COST])
    return Path(store) / f"rows-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"


def cpu_name() -> str:
    """The CPU's model name (what a stored plan was measured on)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _stored_plan(store: Path, key: tuple) -> tuple | None:
    try:
        entries = json.loads(_store_file(store, key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entries, list) or len(entries) != TUNED_ROWS[-1] + 1:
        return None
    plan: list[tuple[str, int] | None] = [None]
    for rows, entry in enumerate(entries[1:], start=1):
        if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in PATHS):
            return None
        path, size = entry
        if not (isinstance(size, int) and rows <= size <= TUNED_ROWS[-1]):
            return None
        plan.append((path, size))
    return tuple(plan)


def _store_plan(store: Path, key: tuple, plan: tuple) -> None:
    path = _store_file(store, key)
    # Written aside and renamed: ranks of one model may store at the same moment.
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps([list(p) if p else None for p in plan]))
        partial.replace(path)
    except OSError:  # a read-only cache only costs the next start its measurement
        with contextlib.suppress(OSError):
            partial.unlink()


def _packs(plan: tuple) -> bool:
    return any(path == PACKED for path, _ in plan[1:])


def _packable(weights: list[torch.Tensor]) -> bool:
    if not packing_available():
        return False
    if all(packed_weight(w) is not None for w in weights):
        return True
    drop_packed(weights)  # a dtype oneDNN does not pack on this CPU
    return False


def _measured_plan(weights: list[torch.Tensor], repeats: int, clock) -> tuple:
    generator = torch.Generator().manual_seed(0)
    inputs = {
        n: torch.randn(TUNED_ROWS[-1], n, generator=generator).to(weights[0].dtype)
        for n in {w.shape[1] for w in weights}
    }
    paths = PATHS if _packable(weights) else PATHS[:2]
    # rows -> fastest sweep per path; every count and path once per round, so that a slow
    # or fast spell of the machine does not fall on one count's sweeps alone.
    best = {rows: [float("inf")] * len(PATHS) for rows in TUNED_ROWS}
    with torch.inference_mode():
        for _ in range(repeats):
            for rows in TUNED_ROWS:
                for index, path in enumerate(paths):
                    start = clock()
                    for w in weights:
                        x = inputs[w.shape[1]][: max(rows, 2) if path != FLAT else rows]
                        if path == FLAT:
                            F.linear(x, w)
                        elif path == PACKED:  # as ``linear`` runs it: one row as two
                            packed_product(x, w)
                        elif rows <= ROW_MAJOR_MAX_ROWS:  # as ``linear`` runs it
                            torch.mm(w, x.t()).t().contiguous()
                        else:
                            torch.mm(w, x.t())
                    best[rows][index] = min(best[rows][index], clock() - start)
    return plan_from_times(best)


def plan_from_times(best: dict[int, list[float]]) -> tuple:
    """The plan (``_ROW_PLAN``'s entries, by row count 0 ... the last of ``TUNED_ROWS``)
    from each timed count's fastest sweep per path (in the order of ``PATHS``; a path not
    timed is missing or infinite): at each count the fastest path over its own rows,
    unless a larger count timed, a multiple of ``PAD_MULTIPLE``, ran at most ``PAD_GAIN``
    of that (then the fastest such count and its fastest path, padded to); a count not
    timed follows the next one timed (padded as it is, or over its own rows). One row
    through ``weight @ x.T`` or the packed product runs as two (timed so). For a count
    above ``ROW_MAJOR_MAX_ROWS`` rows ``weight @ x.T``'s sweeps count ``COLUMN_MAJOR_COST``
    times their time (whatever count they were timed at: a count of 8 or fewer padded
    to 16 is still copied row-major)."""
    counts = sorted(best)

    def fastest(timed: int, rows: int) -> tuple[float, str]:
        """The fastest path over ``timed`` rows for a count of ``rows`` (``linear`` leaves
        the transposed result column-major by the count's own rows, padded or not)."""
        column_major = COLUMN_MAJOR_COST if rows > ROW_MAJOR_MAX_ROWS else 1.0
        return min(
            (t * column_major if path == TRANSPOSED else t, path)
            for t, path in zip(best[timed], PATHS, strict=False)
        )

    chosen: dict[int, tuple[str, int]] = {}
    for i, rows in enumerate(counts):
        own, path = fastest(rows, rows)
        target = (path, rows)
        larger = [(fastest(m, rows), m) for m in counts[i + 1 :] if m % PAD_MULTIPLE == 0]
        if larger:
            (time_m, path_m), m = min(larger)
            if time_m <= PAD_GAIN * own:
                target = (path_m, m)
        chosen[rows] = target
    plan: list[tuple[str, int] | None] = [None] * (counts[-1] + 1)
    below = 0
    for rows in counts:
        path, size = chosen[rows]
        for n in range(below + 1, rows + 1):
            plan[n] = (path, size if size > rows else n)
        below = rows
    path, size = plan[1]
    if path != FLAT and size == 1:
        plan[1] = (path, 2)
    return tuple(plan)


def row_plan(shape: tuple[int, int]) -> tuple | None:
    """The small-row plan ``linear`` follows for weights of ``shape`` (None: not tuned)."""
    return _ROW_PLAN.get(tuple(shape))


def forget_small_rows(weights: Sequence[torch.Tensor]) -> None:
    """``linear`` runs 2 ... SKINNY_ROWS rows as ``weight @ x.T`` for these weights'
    shapes again, whatever ``tune_small_rows`` measured, and their packed copies go."""
    for w in weights:
        _ROW_PLAN.pop(tuple(w.shape), None)
    drop_packed(weights)
