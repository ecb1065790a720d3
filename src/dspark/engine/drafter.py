"""The DSpark drafter inside the engine: a paged context cache and one block pass per step.

The drafter keeps, per request, the keys and values of every draft layer for the context
vectors of the positions the target has computed (``observe``, fed by the engine after
each forward with the captured target layers of the tokens that were kept). Its cache
rows follow the same block tables as the target's: a rollback is a shorter length, and
the rows beyond it are simply written again. ``propose`` runs the block (anchor + K-1 mask
tokens at positions p ... p+K-1) over that cache without a causal mask inside the block,
then samples the Markov head left to right.

With a draft vocabulary (``DraftModel.draft_vocab``, from the drafter directory's
``draft_vocab.npy``) each position's logits cover only those N token ids: the LM head's N
rows are copied once, greedy requests take the argmax over them, and sampling requests
sample from their temperature/top-k/top-p applied to the N logits. The draft
probabilities handed to verification are that same distribution scattered into the whole
vocabulary (zero outside the subset), so rejection sampling stays lossless.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from dspark.engine.graphs import (
    CaptureLedger,
    PaddedStepRunner,
    capture_graph,
    round_up,
    row_padding_waste,
    token_sizes,
)
from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.engine.request import Request
from dspark.engine.sampling import (
    inverse_cdf_draw,
    nucleus,
    request_uniforms,
    same_distribution_groups,
    target_probs,
)
from dspark.engine.speculative import Proposal
from dspark.models.config import ModelConfig
from dspark.models.drafter import CONFIG_FILE, DraftModel, read_drafter_config
from dspark.models.llama import paged_attention

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "drafters"


class DSparkDrafter:
    """``Drafter`` protocol over a ``DraftModel`` (see ``dspark.engine.speculative``)."""

    def __init__(
        self,
        model: DraftModel,
        num_rows: int,
        block_size: int = 16,
        use_draft_vocab: bool = True,
        graphs: tuple[int, int] | None = None,
        head_graphs: bool = True,
        regions: int = 0,
    ) -> None:
        """``graphs``: ``(max_num_seqs, max_model_len)`` to run the block pass and the
        context updates as padded steps (``dspark.engine.graphs``; captured as CUDA
        graphs on a GPU), and with ``head_graphs`` the heads too (``DraftHeads``);
        None: eager. ``regions``: the context cache's regions, one per sequence slot
        (``dspark.engine.kv_cache``; 0: none)."""
        self.model = model
        self.num_positions = model.config.block_size
        self.capture_layers = model.config.capture_layers
        param = next(model.parameters())
        self.device = param.device
        # The model's draft vocabulary (None: the whole vocabulary) and its LM-head rows.
        self.vocab_ids: torch.Tensor | None = None  # [N] token ids
        self.head_weight: torch.Tensor | None = None  # [N, d]
        if use_draft_vocab and model.draft_vocab is not None:
            self.vocab_ids = model.draft_vocab.to(self.device)
            self.head_weight = model.lm_head_rows(self.vocab_ids)
        self.cache = PagedKVCache(
            model.config.layer_config(),
            -(-num_rows // block_size),
            block_size,
            param.dtype,
            param.device,
            regions=regions,
        )
        self.tables: dict[str, BlockTable] = {}
        self.lengths: dict[str, int] = {}  # context positions cached per request
        # Cut the block pass to the proposal's deepest draft and one mask position after
        # it (``EngineConfig.draft_block``); False: the whole block of K, as trained.
        self.block_cut = False
        self.graphs: PaddedStepRunner | None = None
        self.context_graphs: ContextWriter | None = None
        self.heads: DraftHeads | None = None
        self.calibration = model.calibration_tensors(self.device)
        if graphs is not None:
            max_num_seqs, max_model_len = graphs
            k = self.num_positions
            capture = self.device.type == "cuda"
            self.graphs = PaddedStepRunner(
                self._block_pass,
                self.cache,
                max_tokens=max_num_seqs * k,
                max_pieces=max_num_seqs,
                max_len=max_model_len + k,
                capture=capture,
            )
            self.context_graphs = ContextWriter(
                model,
                self.cache,
                scratch_row=self.graphs.scratch_block * self.cache.block_size,
                max_rows=max(CONTEXT_GRAPH_ROWS, max_num_seqs * (k + 1)),
                capture=capture,
            )
            if head_graphs:
                self.heads = DraftHeads(
                    model, self.head_weight, self.vocab_ids, max_num_seqs, capture
                )

    def linear_weights(self) -> list[torch.Tensor]:
        """The weights a draft multiplies (``DraftModel.linear_weights``), with the rows
        of the LM head it drafts from."""
        return self.model.linear_weights(self.head_weight)

    @property
    def has_confidence(self) -> bool:
        return self.model.config.confidence_head

    # ---- context -----------------------------------------------------------------------

    @torch.inference_mode()
    def observe(
        self,
        requests: Sequence[Request],
        starts: Sequence[int],
        counts: Sequence[int],
        features: torch.Tensor,  # [sum(counts), n_layers · d], packed in request order
    ) -> None:
        """The target computed (and kept) positions ``start ... start+count-1`` of each
        request; cache their context keys and values (cutting anything after them)."""
        rows, positions = [], []
        keep = []
        for request, start, count in zip(requests, starts, counts, strict=True):
            table = self._table(request)
            known = self.lengths.get(request.request_id, 0)
            # Room for the context and for the block that will follow it.
            if start > known or not self.cache.reserve(table, start + count + self.num_positions):
                # A gap (never expected) or a full pool: stop drafting for this request.
                self.lengths[request.request_id] = -1
                keep.append(np.zeros(count, dtype=bool))
                continue
            self.lengths[request.request_id] = start + count
            span = np.arange(start, start + count)
            rows.append(table.rows(span, self.cache.block_size))
            positions.append(span)
            keep.append(np.ones(count, dtype=bool))
        if not rows:
            return
        mask = np.concatenate(keep)
        if not mask.all():
            features = features[torch.from_numpy(mask).to(features.device)]
        write, position = np.concatenate(rows), np.concatenate(positions)
        writer = self.context_graphs
        if writer is not None and writer.fits(write.shape[0]):
            writer.run(features, position, write)
            return
        write_rows = torch.from_numpy(write).to(self.device)
        write_context(
            self.model, self.cache, features, torch.from_numpy(position).to(self.device), write_rows
        )

    # ---- drafting ----------------------------------------------------------------------

    # ``propose`` runs ``while_drafting`` after queueing its passes (``Drafter``).
    runs_host_work_while_drafting = True

    @torch.inference_mode()
    def propose(
        self,
        requests: Sequence[Request],
        max_drafts: np.ndarray,
        while_drafting: Callable[[], None] | None = None,
    ) -> Proposal:
        k = self.num_positions
        num = len(requests)
        tokens: list[list[int]] = [[] for _ in range(num)]
        probs: list[torch.Tensor | None] = [None] * num
        confidences = np.zeros((num, k), dtype=np.float32)
        # Requests whose context is complete up to their last token (the anchor).
        ready = [
            i
            for i, r in enumerate(requests)
            if max_drafts[i] > 0 and self.lengths.get(r.request_id, -1) == r.num_tokens - 1
        ]
        if not ready:
            if while_drafting is not None:
                while_drafting()
            return Proposal(tokens, probs, confidences if self.has_confidence else None)
        chosen = [requests[i] for i in ready]
        anchor_pos = np.array([r.num_tokens - 1 for r in chosen])
        anchor_ids = np.array([r.all_ids[-1] for r in chosen], dtype=np.int64)
        tables = [self.tables[r.request_id] for r in chosen]
        # The LM head runs once per position, sequentially (the Markov head), and reads the
        # whole (draft) vocabulary each time: stop at the deepest draft any request may verify.
        depth = int(max(max_drafts[i] for i in ready))
        # The block pass: the whole block, or cut past the deepest draft (``block_cut``).
        width = min(k, depth + 1) if self.block_cut else k
        queries = np.full(len(chosen), width)
        shape = None if self.graphs is None else self.graphs.shape_for(anchor_pos, queries)
        heads = self.heads
        if heads is not None and not heads.fits(len(chosen)):
            heads = None
        # The eager heads and block pass take the anchors as a tensor, copied before the
        # block pass is queued: a copy out of pageable memory waits for the device.
        anchors = None
        if heads is None or shape is None:
            anchors = torch.from_numpy(anchor_ids).to(self.device)
        if shape is not None:  # block ids: the anchor, then -1 for each mask token
            ids = np.full((len(chosen), width), -1, dtype=np.int64)
            ids[:, 0] = anchor_ids
            hidden = self.graphs.run(tables, anchor_pos, queries, ids.ravel(), False, shape)
        else:
            batch = self.cache.attention_batch(tables, anchor_pos, queries, causal=False)
            positions = (anchor_pos[:, None] + np.arange(width)).ravel()
            hidden = self._block_pass(
                None, torch.from_numpy(positions).to(self.device), batch, anchors
            )
        hidden = hidden.view(len(chosen), width, -1)
        sampled_probs: list[torch.Tensor | None] = [None] * len(chosen)
        if heads is not None:
            # computed: [ready, K]; row_probs: [ready, depth, V] when a request samples
            drafted, computed, row_probs = heads.run(hidden, anchor_ids, depth, chosen)
            if row_probs is not None:
                sampled_probs = [
                    None if r.params.is_greedy else row_probs[row] for row, r in enumerate(chosen)
                ]
        else:
            drafted, sampled_probs, conf_logits = self._sample(chosen, hidden, anchors, depth)
            computed = None
            if conf_logits is not None:
                computed = block_confidences(self.model, conf_logits, self.calibration)
        if while_drafting is not None:  # queued, not waited on: the device drafts meanwhile
            while_drafting()
        drafted_host = drafted.tolist()
        on_device = None
        if computed is not None:
            if len(ready) == num:
                on_device = computed
            else:
                on_device = torch.zeros(num, k, dtype=computed.dtype, device=computed.device)
                on_device[torch.tensor(ready, device=computed.device)] = computed
            confidences = on_device.cpu().numpy()  # the host copy, for the stale plan
        for row, i in enumerate(ready):
            tokens[i] = drafted_host[row]
            if sampled_probs[row] is not None:
                probs[i] = sampled_probs[row]
        if not self.has_confidence:
            return Proposal(tokens, probs, None)
        return Proposal(tokens, probs, confidences, on_device)

    def _block_pass(self, ids, positions, batch, anchors=None) -> torch.Tensor:
        """The draft layers over packed blocks: ``[n·w, d]`` after the final norm. The
        block inputs come from ``anchors`` ``[n]`` (eager), or from per-token ``ids``
        (padded steps: the anchor's id, -1 for a mask token)."""
        model = self.model
        if anchors is not None:  # [n·width, d]: the positions' count fixes the width
            width = positions.shape[0] // anchors.shape[0]
            hidden = model.block_input(anchors, width).flatten(0, 1)
        else:
            embedded = model.embed(ids.clamp(min=0))
            mask = model.mask_embedding.to(embedded.dtype)
            hidden = torch.where((ids >= 0)[:, None], embedded, mask)
        for layer, (k_cache, v_cache) in zip(model.layers, self.cache.layers, strict=True):
            q, k_new, v_new = model.block_queries(layer, hidden, positions)
            attended = paged_attention(q, k_new, v_new, batch, k_cache, v_cache)
            hidden = model.finish_layer(layer, hidden, attended)
        return model.norm(hidden)

    def _sample(self, requests: list[Request], hidden: torch.Tensor, anchors: torch.Tensor, k: int):
        """Left-to-right Markov sampling of the first ``k`` positions: greedy requests take
        the argmax, the others sample from their own temperature/top-k/top-p applied to
        the draft logits (over the draft vocabulary when there is one).

        The sampling rows are batched: per position one ``target_probs`` call for each
        distinct set of sampling parameters in the batch and one inverse-CDF draw for all
        of them, each row's uniforms drawn up front from its request's own generator (one
        call per request and step), instead of a few small kernels per request and
        position. The drafts still follow the probabilities returned for verification."""
        sampling = [i for i, r in enumerate(requests) if not r.params.is_greedy]
        draws = _SampledRows(requests, sampling, k, hidden.device) if sampling else None
        step_probs: list[torch.Tensor] = []  # per position, [sampling rows, V]
        previous = anchors  # real token ids: the Markov head embeds them
        drafted, conf_logits = [], []
        for position in range(k):
            # [n, N] over the draft vocabulary, or [n, V]
            logits, conf = self.model.heads(hidden[:, position], previous, self.head_weight)
            choice = logits.argmax(dim=-1)  # [n] indices into the logits' columns
            if draws is not None:
                probs = draws.probs(logits)
                choice[draws.rows] = draws.pick(probs, position)
                step_probs.append(self._full_vocab(probs))
            token = choice if self.vocab_ids is None else self.vocab_ids[choice]
            drafted.append(token)
            if conf is not None:
                conf_logits.append(conf)
            previous = token
        sampled: list[torch.Tensor | None] = [None] * len(requests)
        if draws is not None:
            by_row = torch.stack(step_probs, dim=1)  # [sampling rows, k, V]
            for row, i in enumerate(sampling):
                sampled[i] = by_row[row]
        return (
            torch.stack(drafted, dim=1),
            sampled,
            torch.stack(conf_logits, dim=1) if conf_logits else None,
        )

    def _full_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft probabilities ``[..., N]`` over the draft vocabulary as ``[..., V]`` (zeros
        outside)."""
        if self.vocab_ids is None:
            return probs
        full = probs.new_zeros((*probs.shape[:-1], self.model.config.vocab_size))
        return full.index_copy_(-1, self.vocab_ids, probs)

    def prepare_dummy(self, request: Request) -> None:
        """Make ``request`` look fully observed (its cache rows hold whatever is there),
        so that start-up profiling times a real block pass."""
        table = self._table(request)
        if not self.cache.reserve(table, request.num_tokens + self.num_positions):
            raise ValueError("the drafter's cache is too small to profile; lower max_num_seqs")
        self.lengths[request.request_id] = request.num_tokens - 1

    def _table(self, request: Request) -> BlockTable:
        """The request's block table, created in its slot's region (``regions``)."""
        table = self.tables.get(request.request_id)
        if table is None:
            table = self.tables[request.request_id] = BlockTable(region=request.slot)
        return table

    def on_verified(self, request: Request, num_accepted: int) -> None:
        pass  # the engine's observe() call carries the kept positions

    def on_finished(self, request: Request) -> None:
        table = self.tables.pop(request.request_id, None)
        if table is not None:
            self.cache.release(table)
        self.lengths.pop(request.request_id, None)


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


CONTEXT_GRAPH_ROWS = 2048
"""Context rows ``ContextWriter`` pads and replays at least (more with more requests x
K); a larger update (a long prompt chunk, held-back upkeep run in one batch) runs eagerly."""


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
    device, bound by launches on a GPU (about 0.7 ms a step for SmolLM2's drafter on an
    H200). Here the rows' positions and cache rows go to the device in one staged copy,
    the features into a fixed buffer, and one replay does the rest. Padding rows write to
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
    bound by launches on a GPU: about 0.13 ms a greedy position for SmolLM2's drafter at
    16 requests on an H200. Replayed, a position costs its kernels' device time. The rows
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


def find_drafter(target: ModelConfig, required: bool = False) -> Path | None:
    """The shipped drafter built for a target of this shape, or None (an error with
    ``required``)."""
    for directory in sorted(SHIPPED_DIR.glob("*")):
        if (directory / CONFIG_FILE).is_file() and read_drafter_config(directory)[0].matches(
            target
        ):
            return directory
    if required:
        raise ValueError(
            "no shipped DSpark drafter matches this model; train one with "
            "dspark train-drafter and pass its directory, or use --drafter ngram"
        )
    return None


class _SampledRows:
    """The sampling (non-greedy) rows of one proposal: their sampling parameters grouped
    (requests sharing temperature, top-k and top-p share one ``target_probs`` call), and
    ``k`` uniforms per row from the row's request generator, drawn once per proposal."""

    def __init__(
        self, requests: Sequence[Request], sampling: list[int], k: int, device: torch.device
    ) -> None:
        self.rows = torch.tensor(sampling, device=device)
        params = [requests[i].params for i in sampling]
        self.groups = [
            (params[rows[0]], torch.tensor(rows, device=device))
            for rows in same_distribution_groups(params)
        ]
        self.uniforms = torch.stack(  # [rows, k]
            [request_uniforms(requests[i].generator, k, device) for i in sampling]
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[rows, N]`` sampling distributions of the rows' logits."""
        logits = logits[self.rows]
        if len(self.groups) == 1:
            return target_probs(logits, self.groups[0][0])
        probs = torch.empty_like(logits)
        for params, rows in self.groups:
            probs[rows] = target_probs(logits[rows], params)
        return probs

    def pick(self, probs: torch.Tensor, position: int) -> torch.Tensor:
        """One index per row, drawn from its distribution with the row's uniform for
        ``position``."""
        return inverse_cdf_draw(probs, self.uniforms[:, position])
