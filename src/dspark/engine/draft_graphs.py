"""The drafter's replayed row runners: its context update (``ContextWriter``) and its
Markov heads (``DraftHeads``) as padded steps over a fixed number of rows, each captured
as one CUDA graph per padded shape on a GPU and replayed (the same padded body run
eagerly without capture), with the bookkeeping they share (``_RowGraphs``). Here too
the two bodies they replay that the drafter's eager path runs as well:
``write_context`` and ``block_confidences``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from dspark.engine.graphs import (
    CaptureLedger,
    capture_graph,
    round_up,
    row_padding_waste,
    token_sizes,
)
from dspark.engine.kv_cache import PagedKVCache
from dspark.engine.request import Request
from dspark.engine.sampling import inverse_cdf_draw, nucleus, request_uniforms
from dspark.models.drafter import DraftModel


def block_confidences(
    model: DraftModel, conf_logits: torch.Tensor, calibration: tuple
) -> torch.Tensor:
    """Calibrated confidences ``[n, K]`` from the first ``depth`` positions' confidence
    logits ``[n, depth]``: positions not computed keep the deepest one, so that the next
    step's (stale) plan can still reach them."""
    computed = model.calibrated(conf_logits, calibration)
    rest = computed[:, -1:].expand(-1, model.config.block_size - computed.shape[1])
    return torch.cat([computed, rest], dim=1)


def write_context(
    model: DraftModel,
    cache: PagedKVCache,
    features: torch.Tensor,
    positions: torch.Tensor,
    write: torch.Tensor,
) -> None:
    """Context keys and values of target ``features`` ``[n, n_layers · d]`` at
    ``positions``, written to cache rows ``write`` of every draft layer."""
    context = model.context(features)
    for layer, (k_cache, v_cache) in zip(model.layers, cache.layers, strict=True):
        k, v = model.context_kv(layer, context, positions)
        k_cache.index_copy_(0, write, k.to(k_cache.dtype))
        v_cache.index_copy_(0, write, v.to(v_cache.dtype))


class _RowGraphs:
    """What the drafter's padded row-count runners share (``ContextWriter``,
    ``DraftHeads``): the padded sizes, the capture bookkeeping the engine reads
    (``ledger``, ``exact_shapes``, ``num_captures``, ``capture_seconds``) and capturing."""

    def __init__(self, max_rows: int, capture: bool, waste: Callable) -> None:
        self.capture = capture
        self.sizes = token_sizes(max_rows)
        self._copied: torch.cuda.Event | None = None  # the last staging copy
        self.ledger = CaptureLedger(waste)
        self.exact_shapes = False  # see PaddedStepRunner
        self.pool = None
        self.num_captures = 0
        self.capture_seconds = 0.0
        self.num_runs = 0

    def fits(self, num_rows: int) -> bool:
        return 0 < num_rows <= self.sizes[-1]

    def _chosen(self, shape):
        """The shape a step runs: its own, or a captured one covering it (``ledger``)."""
        self.num_runs += 1
        if self.capture and not self.exact_shapes:
            return self.ledger.choose(shape, self.graphs)
        return shape

    def _staging_view(self) -> np.ndarray:
        """The host staging array, once the previous copy out of it has finished."""
        if self._copied is not None:
            self._copied.synchronize()
        return self.staging.numpy()

    def _send(self, target: torch.Tensor, count: int) -> None:
        """The first ``count`` staged values into the device buffer ``target`` (from pinned
        memory with capture: the host does not wait for the device)."""
        target[:count].copy_(self.staging[:count], non_blocking=self.capture)
        if self.capture:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def _captured(self, body: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
        """``body()`` captured into this runner's pool once the device is idle (the host
        time counted as capture time), then replayed for the step at hand."""
        self.ledger.forget_covers()
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph, outputs = capture_graph(body, self.pool, warm_up=self.num_captures == 0)
        if self.pool is None:
            self.pool = graph.pool()
        self.num_captures += 1
        self.capture_seconds += time.perf_counter() - started
        graph.replay()
        return graph, outputs


class ContextWriter(_RowGraphs):
    """The drafter's context update as padded, replayable steps (one CUDA graph per padded
    row count, captured the first time it is met, when ``capture``).

    Eagerly the update is a dozen small kernels per call and two index copies to the
    device, bound by launches on a GPU. Here the rows' positions and cache rows go to the
    device in one staged copy, the features into a fixed buffer, and one replay does the
    rest. Padding rows write to
    the scratch row of the padded block passes (``PaddedStepRunner``), which no request
    reads. Without ``capture`` (CPU, tests) the same padded body runs eagerly.
    """

    def __init__(
        self, model: DraftModel, cache: PagedKVCache, scratch_row: int, max_rows: int, capture: bool
    ) -> None:
        super().__init__(max_rows, capture, row_padding_waste)
        self.model, self.cache = model, cache
        self.scratch_row = scratch_row
        weight = model.fc.weight
        self.features = torch.zeros(
            max_rows, weight.shape[1], dtype=weight.dtype, device=weight.device
        )
        self.staging = torch.zeros(2 * max_rows, dtype=torch.int64, pin_memory=capture)
        self.index = torch.zeros(2 * max_rows, dtype=torch.int64, device=weight.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def run(self, features: torch.Tensor, positions: np.ndarray, write: np.ndarray) -> None:
        """``write_context`` of ``features`` at ``positions`` into cache rows ``write``."""
        num_rows = write.shape[0]
        size = self._chosen(round_up(self.sizes, num_rows))
        view = self._staging_view()
        view[:num_rows] = positions
        view[num_rows:size] = 0
        view[size : size + num_rows] = write
        view[size + num_rows : 2 * size] = self.scratch_row
        self._send(self.index, 2 * size)
        self.features[:num_rows].copy_(features)
        if not self.capture:
            self._body(size)
        elif size in self.graphs:
            self.graphs[size].replay()
        else:
            self.graphs[size], _ = self._captured(lambda: self._body(size))

    def _body(self, size: int) -> None:
        write_context(
            self.model,
            self.cache,
            self.features[:size],
            self.index[:size],
            self.index[size : 2 * size],
        )


GREEDY, SAMPLED, FILTERED = "greedy", "sampled", "filtered"
"""``DraftHeads`` passes: every row greedy; some rows sampling with temperature alone;
some with a top-k or top-p cut too (two sorts a position, which the others skip)."""


class DraftHeads(_RowGraphs):
    """The Markov head's pass over a proposal's block outputs (each position's draft and
    confidence, then the calibration) as padded, replayable steps: one CUDA graph per
    (padded row count, depth, pass) when ``capture``, captured as the padded steps'
    shapes are (``CaptureLedger``: a larger row count of the same depth and pass covers a
    new one until covering it has cost what a capture does).

    Eagerly each position is a dozen small kernels (the Markov memory, the LM head, the
    confidence head, the argmax; a sampling batch adds its distributions and draws),
    bound by launches on a GPU. Replayed, a position costs its kernels' device time. The rows
    pad to ``token_sizes``; padding rows hold whatever earlier proposals left there, and
    every operation is per row, so they change no real row. Without ``capture`` (CPU,
    tests) the same padded body runs eagerly.

    Sampling rows carry their temperature, top-k and top-p as per-row values and their
    uniforms, drawn from each request's generator before the replay as the eager heads
    draw them, so one graph serves any mix of sampling parameters. A sampling row's
    distribution is ``target_probs``' (temperature, then top-k, then top-p) and its draft
    the inverse-CDF draw from it; the distributions come back for verification, which
    makes the drafts lossless whatever rounding separates them from the eager heads'.
    """

    def __init__(
        self,
        model: DraftModel,
        head_weight: torch.Tensor | None,
        vocab_ids: torch.Tensor | None,
        max_rows: int,
        capture: bool,
    ) -> None:
        # Covers: a larger row count of the same depth and pass (a deeper pass would
        # change the confidences it fills in past the depth).
        super().__init__(
            max_rows,
            capture,
            lambda shape, cover: (
                row_padding_waste(shape[0], cover[0]) if shape[1:] == cover[1:] else None
            ),
        )
        self.model, self.head_weight, self.vocab_ids = model, head_weight, vocab_ids
        self.num_positions = k = model.config.block_size
        param = next(model.parameters())
        device = param.device
        self.hidden = torch.zeros(
            max_rows, k, model.config.hidden_size, dtype=param.dtype, device=device
        )
        # Per row: the anchor token, then for sampling passes the temperature and top-p
        # (float64 bits), top-k (columns kept) and whether the row is greedy.
        self.staging = torch.zeros(5 * max_rows, dtype=torch.int64, pin_memory=capture)
        self.rows = torch.zeros(5 * max_rows, dtype=torch.int64, device=device)
        self.anchors, temperature, top_p, self.top_k, greedy = self.rows.view(5, max_rows)
        self.temperature = temperature.view(torch.float64)
        self.top_p = top_p.view(torch.float64)
        self.is_greedy = greedy
        self.uniforms = torch.zeros(max_rows, k, dtype=torch.float64, device=device)
        self.no_uniforms = torch.zeros(k, dtype=torch.float64, device=device)
        self.probs: torch.Tensor | None = None  # [max_rows, K, V], made at the first sample
        # Padding rows sample too (their drafts are dropped): with valid parameters.
        self.columns = model.config.vocab_size if vocab_ids is None else len(vocab_ids)
        blocks = self.staging.numpy().reshape(5, max_rows)
        blocks[1].view(np.float64)[:] = 1.0
        blocks[2].view(np.float64)[:] = 1.0
        blocks[3], blocks[4] = self.columns, 1
        self.rows.copy_(self.staging)
        self.calibration = model.calibration_tensors(device)
        self.graphs: dict[tuple[int, int, str], tuple] = {}  # shape -> (graph, outputs)

    def run(
        self,
        hidden: torch.Tensor,
        anchor_ids: np.ndarray,
        depth: int,
        requests: Sequence[Request],
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Drafts ``[n, depth]`` (token ids) for block outputs ``hidden`` ``[n, w, d]``
        (the first w >= depth positions of the block) of ``requests`` after the anchors
        ``anchor_ids`` ``[n]``; the calibrated confidences ``[n, K]``, positions past
        ``depth`` holding the deepest one computed (None without a confidence head); and,
        when a request samples, every row's draft distributions ``[n, depth, V]`` (a
        greedy row's unused). Views of this runner's buffers: read them before the next
        ``run``."""
        num_rows = hidden.shape[0]
        sampling = [r.params for r in requests if not r.params.is_greedy]
        kind = GREEDY
        if sampling:
            filtered = any(p.top_k or p.top_p < 1.0 for p in sampling)
            kind = FILTERED if filtered else SAMPLED
        shape = self._chosen((round_up(self.sizes, num_rows), depth, kind))
        view = self._staging_view()
        view[:num_rows] = anchor_ids
        count = num_rows
        if kind != GREEDY:
            self._stage_sampling(view, requests, depth)
            count = view.shape[0]
        self._send(self.rows, count)
        self.hidden[:num_rows, : hidden.shape[1]].copy_(hidden)
        if not self.capture:
            drafted, confidences = self._body(*shape)
        elif shape in self.graphs:
            graph, (drafted, confidences) = self.graphs[shape]
            graph.replay()
        else:
            graph, (drafted, confidences) = self._captured(lambda: self._body(*shape))
            self.graphs[shape] = (graph, (drafted, confidences))
        if confidences is not None:
            confidences = confidences[:num_rows]
        probs = None if kind == GREEDY else self.probs[:num_rows, :depth]
        return drafted[:num_rows], confidences, probs

    def _stage_sampling(self, view: np.ndarray, requests: Sequence[Request], depth: int) -> None:
        """Each row's sampling parameters into the staging array, and its uniforms (one
        call per sampling request, as ``_SampledRows`` draws them) into ``uniforms``."""
        max_rows, num_rows, columns = self.hidden.shape[0], len(requests), self.columns
        params = [r.params for r in requests]
        rows = view.reshape(5, max_rows)[:, :num_rows]
        rows[1].view(np.float64)[:] = [p.temperature if not p.is_greedy else 1.0 for p in params]
        rows[2].view(np.float64)[:] = [p.top_p for p in params]
        rows[3] = [p.top_k if 0 < p.top_k < columns else columns for p in params]
        rows[4] = [p.is_greedy for p in params]
        device = self.uniforms.device
        draws = [
            self.no_uniforms[:depth]
            if r.params.is_greedy
            else request_uniforms(r.generator, depth, device)
            for r in requests
        ]
        self.uniforms[:num_rows, :depth].copy_(torch.stack(draws))
        if self.probs is None:
            full = self.model.config.vocab_size
            self.probs = torch.zeros(
                max_rows, self.num_positions, full, dtype=torch.float32, device=device
            )

    def _body(self, size: int, depth: int, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        model, hidden = self.model, self.hidden[:size]
        previous = self.anchors[:size]  # real token ids: the Markov head embeds them
        drafted, conf_logits = [], []
        for position in range(depth):
            logits, conf = model.heads(hidden[:, position], previous, self.head_weight)
            choice = logits.argmax(dim=-1)
            if kind != GREEDY:
                probs = self._row_probs(logits, size, kind == FILTERED)
                self._keep_probs(probs, size, position)
                draws = inverse_cdf_draw(probs, self.uniforms[:size, position])
                choice = torch.where(self.is_greedy[:size] != 0, choice, draws)
            previous = choice if self.vocab_ids is None else self.vocab_ids[choice]
            drafted.append(previous)
            if conf is not None:
                conf_logits.append(conf)
        confidences = None
        if conf_logits:
            confidences = block_confidences(
                model, torch.stack(conf_logits, dim=1), self.calibration
            )
        return torch.stack(drafted, dim=1), confidences

    def _row_probs(self, logits: torch.Tensor, size: int, filtered: bool) -> torch.Tensor:
        """``target_probs`` with each row's own temperature, top-k and top-p."""
        logits = logits / self.temperature[:size, None].float()
        if filtered:
            ranked = torch.sort(logits, dim=-1, descending=True).values
            kth = ranked.gather(-1, self.top_k[:size, None] - 1)  # top_k: columns kept
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if not filtered:
            return probs
        top_p = self.top_p[:size, None].float()
        return torch.where(top_p < 1.0, nucleus(probs, top_p), probs)

    def _keep_probs(self, probs: torch.Tensor, size: int, position: int) -> None:
        """Position ``position``'s draft distributions into ``probs``, over the whole
        vocabulary (zeros outside a draft vocabulary, never written)."""
        out = self.probs[:size, position]
        if self.vocab_ids is None:
            out.copy_(probs)
        else:
            out.index_copy_(-1, self.vocab_ids, probs)
