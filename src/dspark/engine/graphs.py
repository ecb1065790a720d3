"""CUDA graphs for packed, variable-length steps: every step padded to a captured shape.

An eager step on a GPU is bound by kernel launches, well above its weight-read time. A
CUDA graph replays the whole forward with one launch, but only for fixed shapes and
fixed buffers, while a verify step has per-request query lengths that change every step.

The layout that makes every step one of few shapes:

- **Pieces.** Each request's tokens of the step are cut into pieces of at most
  ``piece_len`` consecutive tokens (a decode with its admitted drafts is one piece; a
  prompt chunk of 300 tokens is 19 pieces of 16). A piece attends over its request's
  cached rows up to its own positions; the step's keys and values are written before
  any piece attends, so a chunk cut into pieces attends exactly as it would whole.
- **Padding.** The packed tokens pad to a captured token count ``T`` (a step function:
  the seed's cost tables price exactly this), the pieces to a captured piece count ``R``,
  and every piece's key span to a length bucket ``L``. Padding tokens write their keys to
  a scratch block of the cache that no request owns, and their outputs are dropped.
- **One staging copy.** Token ids, positions, cache rows to write, where each token's
  query row sits, and per piece its query length, the last key its first query sees,
  whether it is causal, and its block table, are packed on the host into one int64
  array and copied to the device in one transfer; the masks and gather indices are
  built from them inside the graph.

The same layout runs without capture (``capture=False``; the CPU, and tests comparing it
with the unpadded path), so what the graph computes is checked where graphs do not exist.
Graphs are captured lazily into one memory pool. A capture stalls every request for
several steps, and a step of an adaptive engine meets many shapes (its token count moves
with the budget), so a shape not captured yet replays a captured one that holds it when
one pads it modestly
(``padding_waste``), and is captured itself only once that padding has added up to what
a capture costs (``CaptureLedger``); a shape that no captured graph holds is captured at
once.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.models.llama import AttentionBatch, AttentionGroup

PIECE_LEN = 16
"""Longest piece: a decode with up to 15 drafts fits one."""

MAX_KEY_ROWS = 1 << 21
"""Most key rows a padded step gathers per layer (pieces x key span); larger steps run
eagerly. 256 decodes over 8,192 keys fit."""


def token_sizes(limit: int) -> list[int]:
    """Captured token counts up to ``limit`` (finer where steps are common)."""
    sizes = [1, 2, 4, 8, *range(16, 256, 16), *range(256, 512, 32)]
    sizes += [*range(512, 1024, 64), *range(1024, 4096, 128), *range(4096, 16385, 512)]
    sizes = [s for s in sizes if s < limit]
    return [*sizes, limit]


def piece_sizes(limit: int) -> list[int]:
    """Captured piece counts up to ``limit`` (padding pieces cost attention only)."""
    sizes = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512]
    sizes += list(range(640, limit, 128))
    sizes = [s for s in sizes if s < limit]
    return [*sizes, limit]


def round_up(sizes: Sequence[int], value: int) -> int | None:
    index = bisect.bisect_left(sizes, value)
    return sizes[index] if index < len(sizes) else None


SMALL_TOKENS = 16
"""Token counts up to this pad freely: such steps are bound by weight reads and launches,
whatever their exact count."""

SMALL_KEY_ROWS = 2048
"""Key rows (pieces x key span) up to this pad freely, for the same reason."""

CAPTURE_AFTER_WASTE = 4.0
"""A shape is captured once replaying larger ones for it has padded, in all, this many
steps' worth of tokens or key rows (``padding_waste`` summed): a capture stalls every
request for one to ten steps, while padded tokens cost little below the compute-bound
sizes and at most their share of a step above them."""


def padding_waste(shape: StepShape, cover: StepShape) -> float | None:
    """What replaying ``cover`` for a step of ``shape`` pads on top, as a share of the
    step: the larger of the extra tokens over the step's tokens and the extra key rows
    over its key rows (at least ``SMALL_TOKENS`` and ``SMALL_KEY_ROWS``). None when
    ``cover`` does not hold ``shape``, or pads tokens more than twice over or key rows
    more than four times over (attention only: padding pieces and keys are masked)."""
    if (
        cover.num_tokens < shape.num_tokens
        or cover.num_pieces < shape.num_pieces
        or cover.max_len < shape.max_len
    ):
        return None
    tokens = max(shape.num_tokens, SMALL_TOKENS)
    key_rows = max(shape.num_pieces * shape.max_len, SMALL_KEY_ROWS)
    extra_tokens = (cover.num_tokens - shape.num_tokens) / tokens
    extra_keys = (cover.num_pieces * cover.max_len - shape.num_pieces * shape.max_len) / key_rows
    if extra_tokens > 1.0 or extra_keys > 3.0:
        return None
    return max(extra_tokens, extra_keys)


def row_padding_waste(size: int, cover: int) -> float | None:
    """``padding_waste`` for row counts alone (the drafter's context update)."""
    if cover < size:
        return None
    extra = (cover - size) / max(size, SMALL_TOKENS)
    return extra if extra <= 1.0 else None


@contextmanager
def exact_shapes(runners: Sequence) -> Iterator[None]:
    """Inside, every runner (``PaddedStepRunner``, ``ContextWriter``) runs and captures
    each step's own shape, never a cover."""
    previous = [runner.exact_shapes for runner in runners]
    for runner in runners:
        runner.exact_shapes = True
    try:
        yield
    finally:
        for runner, was in zip(runners, previous, strict=True):
            runner.exact_shapes = was


class CaptureLedger:
    """Which captured shape a step replays while its own shape is not captured, and when
    to capture that shape: the least padded cover (``waste(shape, cover)``, None where it
    does not hold the shape), until the waste of covering it adds up to ``budget``; no
    cover, or the budget spent, and the shape is captured now. A shape's cover is looked
    up once per captured set (the runner calls ``forget_covers`` when it captures): a
    search over every graph costs tens of microseconds on the step's critical path."""

    def __init__(self, waste: Callable, budget: float = CAPTURE_AFTER_WASTE) -> None:
        self.waste = waste
        self.budget = budget
        self.spent: dict = {}  # shape -> waste spent covering it so far
        self._covers: dict = {}  # shape -> (cover, waste), for the current captured set

    def choose(self, shape, captured) -> object:
        """The shape to run: ``shape`` itself (captured, or to capture now) or a cover."""
        cover = self.peek(shape, captured)
        if cover == shape:
            self.spent.pop(shape, None)  # captured now, or no cover holds it
        else:
            self.charge(shape, captured)
        return cover

    def peek(self, shape, captured) -> object:
        """What ``choose`` would return now, spending nothing (the cover found is cached)."""
        if shape in captured:
            return shape
        cover, waste = self._cover_of(shape, captured)
        if waste is None or self.spent.get(shape, 0.0) + waste >= self.budget:
            return shape
        return cover

    def charge(self, shape, captured) -> None:
        """Spend what covering ``shape`` wastes, as ``choose`` does when it returns the
        cover ``peek`` found: for a step that fills that cover's padding with work of its
        own, so that ``shape`` is still captured after as many such steps as it would be
        covered for (and runs its own, smaller graph from then on)."""
        _, waste = self._cover_of(shape, captured)
        self.spent[shape] = self.spent.get(shape, 0.0) + waste

    def _cover_of(self, shape, captured) -> tuple[object, float | None]:
        """The least padded cover of ``shape`` and its waste, looked up once per captured
        set."""
        found = self._covers.get(shape)
        if found is None:
            found = self._covers[shape] = self._best_cover(shape, captured)
        return found

    def forget_covers(self) -> None:
        """The captured set changed: look covers up again."""
        self._covers.clear()

    def _best_cover(self, shape, captured) -> tuple[object, float | None]:
        best, best_waste = shape, None
        for cover in captured:
            waste = self.waste(shape, cover)
            if waste is not None and (best_waste is None or waste < best_waste):
                best, best_waste = cover, waste
        return best, best_waste


def capture_graph(
    body: Callable[[], object], pool, warm_up: bool
) -> tuple[torch.cuda.CUDAGraph, object]:
    """``body()`` captured as a CUDA graph in memory ``pool`` (None: a new one); returns
    the graph and the body's outputs (the graph's own buffers). ``warm_up`` first runs
    the body once on a side stream, as a runner's first capture must (cuBLAS handles and
    workspaces are created lazily, which capturing cannot do).

    The cycle collector is off while capturing: a collection that lands inside the
    capture and frees the CUDA memory or graphs of objects no longer used (an engine
    dropped earlier, whose scheduler and engine refer to each other) would make calls
    that a stream capture does not allow ("operation failed due to a previous error
    during capture"). ``torch.cuda.graph`` collects before it begins."""
    if warm_up:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            body()
        torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            outputs = body()
    finally:
        if collecting:
            gc.enable()
    return graph, outputs


@dataclass(frozen=True)
class StepShape:
    num_tokens: int  # T, padded
    num_pieces: int  # R, padded
    max_len: int  # L, padded key span (a multiple of the cache's block size)

    def offsets(self, block_size: int) -> dict[str, tuple[int, int]]:
        """Where each field sits in the staging array: name -> (start, length)."""
        t, r = self.num_tokens, self.num_pieces
        fields = [("ids", t), ("positions", t), ("write", t), ("rows", t)]
        fields += [("query_len", r), ("last_seen", r), ("causal", r)]
        fields += [("blocks", r * (self.max_len // block_size))]
        out, start = {}, 0
        for name, length in fields:
            out[name] = (start, length)
            start += length
        return out


class PaddedStepRunner:
    """Runs ``body`` over packed steps padded to a ``StepShape``; captures one CUDA graph
    per shape when ``capture`` (the first time each shape is met).

    ``body(ids, positions, batch)`` is the forward: it returns a tensor or a list of
    tensors whose first dimension is the (padded) token count; ``run`` returns them cut
    to the real tokens. They are the graph's own buffers: use them (or copy them) before
    the next ``run``.
    """

    def __init__(
        self,
        body: Callable[[torch.Tensor, torch.Tensor, AttentionBatch], object],
        cache: PagedKVCache,
        max_tokens: int,
        max_pieces: int,
        max_len: int,
        capture: bool,
        piece_len: int = PIECE_LEN,
        max_graphs: int = 256,
        max_key_rows: int = MAX_KEY_ROWS,
    ) -> None:
        self.body = body
        self.cache = cache
        self.block_size = cache.block_size
        self.piece_len = piece_len
        self.capture = capture
        self.device = cache.device
        self.token_sizes = token_sizes(max_tokens)
        self.piece_sizes = piece_sizes(max_pieces)
        bs = self.block_size
        top = -(-max_len // bs) * bs  # key spans: powers of two, then the longest
        spans = [1 << b for b in range(7, 31) if (1 << b) < top] + [top]
        self.len_sizes = sorted({-(-s // bs) * bs for s in spans})
        self.scratch_block = cache.reserve_scratch()
        self.max_graphs = max_graphs
        self.max_key_rows = max_key_rows
        self._copied: torch.cuda.Event | None = None  # the last staging copy
        self.graphs: OrderedDict[StepShape, tuple] = OrderedDict()
        self.ledger = CaptureLedger(padding_waste)
        # Exact shapes only (start-up profiling times each shape as itself).
        self.exact_shapes = False
        self.pool = None
        self.num_captures = 0
        # Host seconds spent capturing (the device idle, waiting): start-up work in an
        # engine that captures ahead, met mid-run here because capture is lazy.
        self.capture_seconds = 0.0
        self.num_runs = 0  # padded steps run (replayed or eager)
        # Steps that replayed a larger captured shape than their own (``CaptureLedger``),
        # and the padding tokens that added: such a step costs what its cover costs.
        self.num_covered = 0
        self.covered_tokens = 0
        # Key rows the latest step's attention gathered: its shape's pieces times its
        # padded key span (what a step's attention costs grows with, ``ObservedDraftCost``).
        self.key_rows = 0
        # The staging layout of the largest shape, whose block tables are capped by the
        # most key rows a padded step may gather (larger steps run eagerly).
        t, r = self.token_sizes[-1], self.piece_sizes[-1]
        size = 4 * t + 3 * r + min(r * self.len_sizes[-1], max_key_rows) // bs
        self.staging = torch.zeros(size, dtype=torch.int64, pin_memory=capture)
        self.buffer = torch.zeros(size, dtype=torch.int64, device=self.device)

    # ---- host side --------------------------------------------------------------------

    def shape_for(self, num_cached: np.ndarray, num_query: np.ndarray) -> StepShape | None:
        """The padded shape of a step, or None when it is larger than any captured one."""
        pieces = int((-(-num_query // self.piece_len)).sum())
        return self.padded_shape(int(num_query.sum()), pieces, int((num_cached + num_query).max()))

    def padded_shape(self, num_tokens: int, num_pieces: int, longest: int) -> StepShape | None:
        """``shape_for`` from a step's token count, piece count and longest key span."""
        t = round_up(self.token_sizes, num_tokens)
        r = round_up(self.piece_sizes, num_pieces)
        length = round_up(self.len_sizes, longest)
        if t is None or r is None or length is None:
            return None
        if r * length > self.max_key_rows:
            # Every piece gathers its request's keys: a long prompt chunk cut into many
            # pieces over a long context would gather them many times over. Eager
            # attention reads such a chunk once.
            return None
        return StepShape(t, r, length)

    def fill_shape(self, shape: StepShape) -> StepShape:
        """The graph a step of ``shape`` may fill up to: ``shape`` itself, or the larger
        captured shape the ledger covers it with now. In the second case the ledger is
        charged as if the step had been covered (``CaptureLedger.charge``): the step is
        then made to fill the cover, but ``shape`` still gets captured when its covers
        add up, as it would unfilled."""
        if not self.capture or self.exact_shapes:
            return shape
        cover = self.ledger.peek(shape, self.graphs)
        if cover != shape:
            self.ledger.charge(shape, self.graphs)
        return cover

    def stage(
        self,
        shape: StepShape,
        tables: Sequence[BlockTable],
        num_cached: np.ndarray,
        num_query: np.ndarray,
        ids: np.ndarray,
        causal: bool,
    ) -> int:
        """Fill the staging array for one step; returns how many entries it used."""
        if self._copied is not None:  # the previous copy out of it must have finished
            self._copied.synchronize()
        bs, plen = self.block_size, self.piece_len
        num_tokens = int(num_query.sum())
        per_request = -(-num_query // plen)
        owner = np.repeat(np.arange(len(num_query)), per_request)  # piece -> request
        first_piece = np.cumsum(per_request) - per_request
        index = np.arange(owner.shape[0]) - first_piece[owner]  # piece within its request
        piece_cached = num_cached[owner] + index * plen
        piece_query = np.minimum(plen, num_query[owner] - index * plen)
        token_piece = np.repeat(np.arange(owner.shape[0]), piece_query)
        piece_start = np.cumsum(piece_query) - piece_query
        offset = np.arange(num_tokens) - piece_start[token_piece]
        positions = piece_cached[token_piece] + offset
        num_blocks = shape.max_len // bs
        blocks = np.full((len(tables), num_blocks), self.scratch_block, dtype=np.int64)
        lengths = np.array([min(len(t.blocks), num_blocks) for t in tables])
        if lengths.sum():
            flat = np.fromiter(
                (b for t, n in zip(tables, lengths, strict=True) for b in t.blocks[:n]),
                np.int64,
                int(lengths.sum()),
            )
            rows_of = np.repeat(np.arange(len(tables)), lengths)
            cols_of = np.arange(flat.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            blocks[rows_of, cols_of] = flat
        token_owner = owner[token_piece]
        scratch_row = self.scratch_block * bs
        view = self.staging.numpy()
        fields = shape.offsets(bs)

        def put(name: str, values: np.ndarray, pad: int = 0) -> None:
            start, length = fields[name]
            view[start : start + values.shape[0]] = values
            view[start + values.shape[0] : start + length] = pad

        put("ids", ids)
        put("positions", positions)
        put("write", blocks[token_owner, positions // bs] * bs + positions % bs, scratch_row)
        put("rows", token_piece * plen + offset)
        put("query_len", piece_query)
        if causal:
            put("last_seen", piece_cached)
        else:
            put("last_seen", (num_cached + num_query - 1)[owner])
        put("causal", np.full(owner.shape[0], int(causal)))
        start, length = fields["blocks"]
        piece_blocks = blocks[owner].ravel()
        view[start : start + piece_blocks.shape[0]] = piece_blocks
        view[start + piece_blocks.shape[0] : start + length] = self.scratch_block
        return start + length

    # ---- device side ------------------------------------------------------------------

    def _inputs(self, shape: StepShape) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """Views of the device buffer and the attention batch built from them (fresh
        tensors every call: the rotary and mask caches key on tensor identity)."""
        fields = shape.offsets(self.block_size)

        def get(name: str) -> torch.Tensor:
            start, length = fields[name]
            return self.buffer[start : start + length]

        bs, plen, device = self.block_size, self.piece_len, self.device
        num_pieces, max_len = shape.num_pieces, shape.max_len
        keys = torch.arange(max_len, device=device)
        blocks = get("blocks").view(num_pieces, max_len // bs)
        read = blocks[:, keys // bs] * bs + keys % bs  # [R, L] cache rows
        offsets = torch.arange(plen, device=device)
        query_valid = offsets[None, :] < get("query_len")[:, None]  # [R, P]
        last = get("last_seen")[:, None] + get("causal")[:, None] * offsets[None, :]
        mask = (keys[None, None, :] <= last[:, :, None]) & query_valid[:, :, None]
        mask[:, :, 0] = True  # padded queries attend somewhere (their output is dropped)
        rows = get("rows")
        group = AttentionGroup(
            read_index=read,
            mask=mask[:, None],
            query_index=self._query_index(shape, rows),
            valid_rows=rows,
            out_index=rows,
        )
        batch = AttentionBatch(write_index=get("write"), groups=[group])
        return get("ids"), get("positions"), batch

    def _query_index(self, shape: StepShape, rows: torch.Tensor) -> torch.Tensor:
        """``[R, P]`` packed token per query slot (0 for empty slots): the inverse of
        ``rows``."""
        num_slots = shape.num_pieces * self.piece_len
        slots = torch.zeros(num_slots, dtype=torch.int64, device=rows.device)
        tokens = torch.arange(rows.shape[0], device=rows.device)
        # Padding tokens' rows are 0, and among duplicate indices index_put_ keeps an
        # arbitrary writer: every token aimed at slot 0 writes 0 (token 0 is the only real
        # one that can sit there), so the winner does not matter.
        slots.index_put_((rows,), tokens * (rows != 0))
        return slots.view(shape.num_pieces, self.piece_len)

    def run(
        self,
        tables: Sequence[BlockTable],
        num_cached: np.ndarray,
        num_query: np.ndarray,
        ids: np.ndarray,
        causal: bool = True,
        shape: StepShape | None = None,
    ):
        """The body's outputs for this step, cut to its real tokens."""
        shape = shape or self.shape_for(num_cached, num_query)
        if shape is None:
            raise ValueError("this step is larger than the largest captured shape")
        if self.capture and not self.exact_shapes:
            own, shape = shape, self.ledger.choose(shape, self.graphs)
            if shape != own:
                self.num_covered += 1
                self.covered_tokens += shape.num_tokens - own.num_tokens
        used = self.stage(shape, tables, num_cached, num_query, ids, causal)
        self.num_runs += 1
        self.key_rows = shape.num_pieces * shape.max_len
        self.buffer[:used].copy_(self.staging[:used], non_blocking=self.capture)
        if self.capture:
            self._copied = torch.cuda.Event()
            self._copied.record()
        if self.capture:
            outputs = self._graph(shape)
        else:
            outputs = self.body(*self._inputs(shape))
        num_tokens = int(num_query.sum())
        if isinstance(outputs, torch.Tensor):
            return outputs[:num_tokens]
        return [out[:num_tokens] for out in outputs]

    def _graph(self, shape: StepShape):
        entry = self.graphs.get(shape)
        if entry is not None:
            self.graphs.move_to_end(shape)
            entry[0].replay()
            return entry[1]
        if len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)
        self.ledger.forget_covers()
        torch.cuda.synchronize()  # the clock starts once the steps before are done
        started = time.perf_counter()
        # Capture the shape with this step's staged inputs (capturing records kernels and
        # runs nothing), then replay it for this step's answer.
        graph, outputs = capture_graph(
            lambda: self.body(*self._inputs(shape)), self.pool, warm_up=self.num_captures == 0
        )
        if self.pool is None:
            self.pool = graph.pool()
        self.num_captures += 1
        self.capture_seconds += time.perf_counter() - started
        self.graphs[shape] = (graph, outputs)
        graph.replay()
        return outputs
