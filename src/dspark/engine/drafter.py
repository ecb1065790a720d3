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

from collections.abc import Callable, Sequence

import numpy as np
import torch

from dspark.engine.draft_graphs import ContextWriter, DraftHeads, block_confidences, write_context
from dspark.engine.graphs import PaddedStepRunner
from dspark.engine.kv_cache import BlockTable, PagedKVCache
from dspark.engine.request import Request
from dspark.engine.sampling import (
    inverse_cdf_draw,
    request_uniforms,
    same_distribution_groups,
    target_probs,
)
from dspark.engine.speculative import Proposal
from dspark.models.drafter import DraftModel
from dspark.models.llama import paged_attention

CONTEXT_GRAPH_ROWS = 2048
"""Context rows ``ContextWriter`` pads and replays at least (more with more requests x
K); a larger update (a long prompt chunk, held-back upkeep run in one batch) runs eagerly."""


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
        # it (the engine cuts it: a shallow step pays a shallow pass); False: the whole
        # block of K, as trained.
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
        if computed is not None:
            rows = computed
            if len(ready) < num:  # requests not ready to draft get zero rows
                rows = torch.zeros(num, k, dtype=computed.dtype, device=computed.device)
                rows[torch.tensor(ready, device=computed.device)] = computed
            confidences = rows.cpu().numpy()
        for row, i in enumerate(ready):
            tokens[i] = drafted_host[row]
            if sampled_probs[row] is not None:
                probs[i] = sampled_probs[row]
        if not self.has_confidence:
            return Proposal(tokens, probs, None)
        return Proposal(tokens, probs, confidences)

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
