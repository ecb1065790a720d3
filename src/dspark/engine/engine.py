"""The reference engine: continuous batching, chunked prefill, speculative decoding.

One ``step()``: the scheduler picks the batch; the drafter proposes drafts for decoding
requests, as deep and as many verified as the adaptive policy plans (or a fixed K);
one packed forward computes every scheduled token; verification accepts drafts and
emits tokens; rejected positions roll back in O(1).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

from dspark.engine.config import EngineConfig, SpecMode
from dspark.engine.plan import ProposalRun, StepPlan
from dspark.engine.policy import AdaptivePolicy
from dspark.engine.profiling import EngineProfile, profile_engine
from dspark.engine.request import FinishReason, PromptTooLongError, Request
from dspark.engine.runner import ModelRunner
from dspark.engine.sampling import SamplingParams
from dspark.engine.scheduler import ScheduledChunk, Scheduler
from dspark.engine.speculative import (
    Drafter,
    NgramDrafter,
    OnlineAcceptance,
    SampledRound,
    verify,
    verify_sampled,
)
from dspark.engine.stats import EngineStats, StepRecord
from dspark.engine.upkeep import DeferredUpkeep
from dspark.models.loader import LoadedModel, row_plan_store
from dspark.ops.linear import tune_small_rows
from dspark.scheduling import AdaptiveVerifier, ObservedDraftCost, StepCostModel


class LLMEngine:
    """``add_request`` / ``step`` over a loaded model."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig | None = None,
        drafter: Drafter | None = None,
        cost_model: StepCostModel | None = None,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.config = config = config or EngineConfig()
        positions = loaded.config.max_position
        self.max_model_len = config.max_model_len or min(positions, config.kv_cache_tokens)
        if self.max_model_len > positions:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's {positions} positions"
            )
        runner_class = ModelRunner
        if config.tensor_parallel_size > 1:
            from dspark.engine.tp_runner import ParallelModelRunner as runner_class
        self.runner = runner_class(loaded, config, self.max_model_len)
        try:
            self._set_up(drafter, cost_model)
        except BaseException:
            self.runner.close()  # tensor-parallel workers must not outlive a failed start
            raise

    def _set_up(self, drafter: Drafter | None, cost_model: StepCostModel | None) -> None:
        config, runner = self.config, self.runner
        self.device, self.dtype = runner.device, runner.dtype
        self.cache, self.graphs = runner.cache, runner.graphs
        self.scheduler = Scheduler(
            self.cache,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            on_admit=self._on_admit,
            on_release=self._on_release,
        )
        self.stats = EngineStats()
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        # Requests without a seed of their own take the next of these: a count, since a
        # server releases finished requests and every lone request would share one seed.
        self._seeds = itertools.count()
        self.drafter: Drafter | None = None
        self.acceptance: OnlineAcceptance | None = None
        if config.spec is not SpecMode.NONE:
            self.drafter = drafter or self._build_drafter(config.drafter)
            self._check_drafter_block()
            self.acceptance = OnlineAcceptance(config.num_drafts)
            runner.capture_layers = tuple(getattr(self.drafter, "capture_layers", ()))
            proposer = getattr(self.drafter, "inner", self.drafter)  # a replay's own drafter
            if hasattr(proposer, "block_cut"):
                proposer.block_cut = True  # a shallow step pays a shallow block pass
            drafter_weights = getattr(proposer, "linear_weights", None)
            weights_of = getattr(self.model, "linear_weights", None)
            if self.device.type == "cpu" and drafter_weights is not None:
                # Shapes it shares with the target keep the target's plan.
                shared = {tuple(w.shape) for w in weights_of()} if weights_of else set()
                tune_small_rows(
                    drafter_weights(), keep_shapes=frozenset(shared), store=row_plan_store()
                )
        # Every padded-step runner (target, drafter, a replayed drafter's inner one): a
        # step that captured a graph in any of them is not timed.
        inner = getattr(self.drafter, "inner", None)
        runners = [self.graphs]
        for owner in (self.drafter, inner):
            runners += [
                getattr(owner, name, None) for name in ("graphs", "context_graphs", "heads")
            ]
        self._runners = [r for r in runners if r is not None]
        for graph_runner in self._runners:
            graph_runner.ledger.budget = config.graph_padding_budget
        self.stop_ids = self.loaded.stop_token_ids
        self.policy: AdaptivePolicy | None = None
        self.upkeep: DeferredUpkeep | None = None
        if config.spec is SpecMode.ADAPTIVE:
            self.policy = self._build_policy(cost_model)
            if config.adaptive.defer_upkeep:
                self.upkeep = DeferredUpkeep(self.drafter, self.device)
        self._step_index = 0
        self._step_start_ms = 0.0
        self._before_ms = self._sync_ms = self._propose_ms = 0.0
        self.idle_s = 0.0  # seconds the owner held this engine idle between steps
        # Per decode round, (confidences, admitted, accepted), when a caller sets a list.
        self.round_log: list[tuple[np.ndarray | None, int, int]] | None = None
        self._round_confidences: dict[int, np.ndarray] = {}

    def _build_drafter(self, name: str) -> Drafter:
        from dspark.engine.drafter import DSparkDrafter
        from dspark.engine.shipped import find_drafter
        from dspark.models.drafter import load_drafter

        if name == "ngram":
            return NgramDrafter(self.config.num_drafts)
        path = find_drafter(self.loaded.config, required=name == "dspark")
        path = path if name in ("auto", "dspark") else name
        if path is None:
            return NgramDrafter(self.config.num_drafts)
        model = load_drafter(path, self.model)
        config = self.config
        reduced = config.draft_vocab == "on" or (
            config.draft_vocab == "auto" and self.device.type == "cpu"
        )
        return DSparkDrafter(
            model,
            config.drafter_rows(model.config.block_size),
            config.block_size,
            use_draft_vocab=reduced,
            graphs=(config.max_num_seqs, self.max_model_len) if self.runner.padded_steps else None,
            regions=self.runner.kv_regions,
        )

    def _check_drafter_block(self) -> None:
        config, block = self.config, self.drafter.num_positions
        if block >= config.num_drafts:
            return
        off = (
            "turn adaptive verification off with --spec fixed (or none)"
            if config.spec is SpecMode.ADAPTIVE
            else "turn speculation off with --spec none"
        )
        raise ValueError(
            f"K={config.num_drafts} (--k, EngineConfig.num_drafts) exceeds the drafter's "
            f"block of {block}, so the drafter cannot propose that many per request: lower "
            f"--k to at most {block}, or {off}"
        )

    def profile(self, path: str | None = None) -> EngineProfile:
        """The start-up cost profile of this engine's target and drafter (read from
        ``path`` if it holds a matching one, else measured and written there)."""
        num_drafts = self.config.num_drafts
        return profile_engine(self.runner, self.drafter, num_drafts, self._runners, path=path)

    def _build_policy(self, cost_model: StepCostModel | None) -> AdaptivePolicy:
        config = self.config
        if cost_model is None:
            profile = self.profile(config.profile_path)
            cost_model = ObservedDraftCost(
                profile.tables,
                depth_ms=profile.depth_costs(),
                num_positions=config.num_drafts,
            )
        verifier = AdaptiveVerifier(
            config.max_num_seqs,
            config.num_drafts,
            cost_model,
            max_total_logits=config.max_num_seqs * (config.num_drafts + 1),
        )
        return AdaptivePolicy(
            config,
            verifier,
            self.stats,
            self.acceptance,
            on_cuda=self.device.type == "cuda",
            graphs=self.graphs,
            overlaps_drafting=getattr(self.drafter, "runs_host_work_while_drafting", False),
        )

    # ---- requests -------------------------------------------------------------------

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """Queue a request. Raises ``PromptTooLongError`` (a ``ValueError``) if the prompt
        cannot fit the context, ``ValueError`` for a duplicate id or an empty prompt."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; the context holds {self.max_model_len} "
                "(prompt plus at least one generated token)"
            )
        generator = None
        if not params.is_greedy:
            generator = torch.Generator(device=self.device)
            seed = params.seed
            if seed is None:
                seed = self.config.seed * 1_000_003 + next(self._seeds)
            generator.manual_seed(seed)
        request = Request(request_id, ids, params, self.request_clock(), generator=generator)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str, error: str | None = None) -> None:
        """End a request now and free its cache and slot (``error``: it failed)."""
        request = self.requests.get(request_id)
        if request is not None and not request.is_finished:
            reason = FinishReason.ERROR if error else FinishReason.ABORT
            self._finish(request, reason, error)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def _on_admit(self, request: Request) -> None:
        if self.policy is not None:
            self.policy.admit(request.slot)

    def _on_release(self, request: Request) -> None:
        if self.policy is not None:
            self.policy.release(request.slot)
        if self.drafter is not None:
            self.drafter.on_finished(request)

    # ---- one step -------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one engine step; returns the requests that got tokens or finished."""
        room = self.config.num_drafts if self.drafter is not None else 0
        chunks = self.scheduler.schedule(room)
        if not chunks:
            return []
        self._step_index += 1
        step_start = time.perf_counter()
        self._step_start_ms = step_start * 1e3
        self._before_ms = self._sync_ms = self._propose_ms = 0.0
        generated, captures = self.stats.num_generated, self.num_captures()
        covered = self.graphs.num_covered if self.graphs is not None else 0
        policy = self.policy
        if policy is not None:
            policy.begin_step(self._step_index)
        drafts, draft_probs, plan = self._draft(chunks)
        draft_ms = (time.perf_counter() - step_start) * 1e3
        self.stats.draft_phase_ms.append(draft_ms)
        tokens, num_cached, num_query = [], [], []
        for chunk, extra in zip(chunks, drafts, strict=True):
            request = chunk.request
            start = request.num_computed
            tokens += request.all_ids[start : start + chunk.num_tokens] + extra
            num_cached.append(start)
            num_query.append(chunk.num_tokens + len(extra))
        num_query_np = np.array(num_query)
        ends = np.cumsum(num_query_np)
        rows, owners = [], []
        for i, (chunk, extra) in enumerate(zip(chunks, drafts, strict=True)):
            if chunk.samples:
                count = len(extra) + 1
                rows.extend(range(ends[i] - count, ends[i]))
                owners.append((i, count))
        # Rows only increase, so as many rows as tokens are every row (decodes alone): the
        # logits then read the hidden states as they are, with no index and no gather. An
        # index goes to the device before the forward is queued, from pinned memory.
        every_row = len(rows) == int(ends[-1])
        row_index = self.runner.to_device(rows) if rows and not every_row else None
        start_time = self.runner.clock()
        padded = self.graphs.covered_tokens if self.graphs is not None else 0
        hidden, captured = self.runner.forward(
            [c.request.table for c in chunks],
            np.array(num_cached),
            num_query_np,
            np.array(tokens, dtype=np.int64),
            np.array([len(extra) for extra in drafts]),
        )
        # The logits are queued before the look-ahead, so the device never waits on it.
        logits = None
        if rows:
            logits = self.model.logits(hidden if every_row else hidden[row_index])
        if policy is not None:
            policy.look_ahead(chunks)  # the host's turn while the device computes
        self.stats.forward_ms.append(self.runner.clock() - start_time)
        if self.graphs is not None:  # tokens the forward ran on a larger graph than its own
            padded = self.graphs.covered_tokens - padded
        features = torch.cat(captured, dim=-1) if captured else None
        phase = time.perf_counter()
        touched, held_back = self._apply(
            chunks, drafts, draft_probs, logits, owners, ends - num_query_np, features, plan
        )
        end = time.perf_counter()
        apply_ms = (end - phase) * 1e3
        self.stats.apply_ms.append(apply_ms)
        if not self.scheduler.running:
            if self.upkeep is not None:
                self.upkeep.clear()  # held-back updates of requests that all finished
            if policy is not None:
                policy.idle()
        # Held-back upkeep is the undrafted steps' debt, paid by whichever step flushes
        # it: it leaves that step's time, and every undrafted step that held its upkeep
        # back is priced with what catching one up costs on average.
        flush_ms = self.upkeep.take_cost() if self.upkeep is not None else 0.0
        captured = self.num_captures() != captures
        num_drafts = sum(len(extra) for extra in drafts)  # verified this step
        emitted = self.stats.num_generated - generated
        if policy is not None:
            wall_ms = max((end - step_start) * 1e3 - flush_ms, 1e-3)
            if held_back and self.upkeep.ms_per_step is not None:
                wall_ms += self.upkeep.ms_per_step
            policy.finish_step(wall_ms, emitted, num_drafts, captured, padded)
        self.stats.capture_steps += captured
        self.stats.step_log.append(
            StepRecord(
                (time.perf_counter() - step_start) * 1e3,
                flush_ms,
                draft_ms,
                self.stats.forward_ms[-1],
                apply_ms,
                plan.schedule_ms,
                self._before_ms,
                plan.shape_ms,
                plan.decide_ms,
                plan.plan_ms,
                self._sync_ms,
                self._propose_ms,
                len(chunks),
                int(ends[-1]) - num_drafts - len(chunks),
                int(ends[-1]),
                plan.depth,
                num_drafts,
                emitted,
                self.runner.graph_tokens,
                int(self.graphs is not None and self.graphs.num_covered != covered),
                int(captured),
                int(plan.settled),
            )
        )
        return touched

    def _draft(self, chunks: list[ScheduledChunk]) -> tuple[list[list[int]], list, StepPlan]:
        """Drafts per chunk, their draft probabilities, and the step's plan."""
        drafts: list[list[int]] = [[] for _ in chunks]
        probs: list[torch.Tensor | None] = [None] * len(chunks)
        plan = StepPlan() if self.policy is None else self.policy.plan
        self._round_confidences = {}
        if self.drafter is None:
            return drafts, probs, plan
        decode_index = [i for i, c in enumerate(chunks) if c.is_decode]
        if not decode_index:
            return drafts, probs, plan
        limits = np.array([self._draft_limit(chunks[i]) for i in decode_index])
        requests = [chunks[i].request for i in decode_index]

        def propose(limits: np.ndarray, while_drafting=None) -> ProposalRun:
            return self._propose(requests, limits, while_drafting)

        if self.policy is None:  # fixed K: every draft verified
            plan.proposal = propose(limits).proposal
            plan.depth = int(limits.max())
            plan.admitted = [len(t[:n]) for t, n in zip(plan.proposal.tokens, limits, strict=True)]
        else:
            plan = self.policy.plan_step(chunks, decode_index, limits, propose)
            if plan.proposal is None:
                self._before_ms = time.perf_counter() * 1e3 - self._step_start_ms
                return drafts, probs, plan
        proposal = plan.proposal
        for row, (i, count) in enumerate(zip(decode_index, plan.admitted, strict=True)):
            drafts[i] = list(proposal.tokens[row][:count])
            probs[i] = proposal.draft_probs[row]
            if self.round_log is not None and proposal.confidences is not None:
                self._round_confidences[i] = np.array(proposal.confidences[row])
        return drafts, probs, plan

    def _propose(self, requests: list[Request], limits: np.ndarray, while_drafting) -> ProposalRun:
        """The drafter's proposal, timed (device-synchronised); its context complete first."""
        if self.upkeep is not None:
            self.upkeep.flush_timed()
        captures = self.num_captures()
        flushed = time.perf_counter() * 1e3
        start = self.runner.clock()
        self._before_ms, self._sync_ms = start - self._step_start_ms, start - flushed
        if while_drafting is None:
            proposal = self.drafter.propose(requests, limits)
        else:
            proposal = self.drafter.propose(requests, limits, while_drafting=while_drafting)
        self._propose_ms = ms = self.runner.clock() - start
        self.stats.drafter_ms.append(ms)
        return ProposalRun(proposal, ms, self.num_captures() != captures)

    def _draft_limit(self, chunk: ScheduledChunk) -> int:
        request = chunk.request
        left = min(
            request.params.max_tokens - len(request.output_ids),
            self.max_model_len - request.num_tokens,
        )
        return max(0, min(self.config.num_drafts, chunk.draft_room, left - 1))

    # ---- verification and emission -------------------------------------------------

    def _apply(
        self,
        chunks: list[ScheduledChunk],
        drafts: list[list[int]],
        draft_probs: list[torch.Tensor | None],
        logits: torch.Tensor | None,
        owners: list[tuple[int, int]],
        row_starts: np.ndarray,
        features: torch.Tensor | None,
        plan: StepPlan,
    ) -> tuple[list[Request], bool]:
        """Verify each request's drafts, emit its tokens and hand the drafter the kept
        positions. Returns the requests touched, and whether the drafter's update was held
        back (``DeferredUpkeep``)."""
        self.stats.num_steps += 1
        touched = []
        offset = 0
        sampled: dict[int, tuple[torch.Tensor, list[int] | None]] = {}
        replay = getattr(self.drafter, "replayed_acceptance", None)
        # Greedy rows need only the argmax: one reduction and one transfer for the batch.
        needs_argmax = replay is not None or any(
            chunks[i].request.params.is_greedy for i, _ in owners
        )
        argmax = logits.argmax(dim=-1).tolist() if needs_argmax else []
        for i, count in owners:
            sampled[i] = (logits[offset : offset + count], argmax[offset : offset + count] or None)
            offset += count
        # Sampling requests are verified together: one target_probs per set of sampling
        # parameters and two transfers for the batch (``verify_sampled``).
        batched = [
            i
            for i in sampled
            if not chunks[i].request.params.is_greedy
            and not (replay is not None and chunks[i].is_decode)
        ]
        rounds = []
        for i in batched:
            request, extra, probs = chunks[i].request, drafts[i], draft_probs[i]
            probs = None if probs is None else probs[: len(extra)]
            rounds.append(
                SampledRound(sampled[i][0], extra, probs, request.params, request.generator)
            )
        verdicts = dict(zip(batched, verify_sampled(rounds), strict=True))
        admitted, accepted = [], []
        kept: list[tuple[Request, int, int, int]] = []  # request, position, row, count
        for i, (chunk, extra) in enumerate(zip(chunks, drafts, strict=True)):
            request = chunk.request
            if i not in sampled:
                kept.append((request, request.num_computed, row_starts[i], chunk.num_tokens))
                request.num_computed += chunk.num_tokens
                continue
            is_decode = chunk.is_decode
            rows, best = sampled[i]
            if replay is not None and is_decode:  # acceptance from a trace (replay.py)
                num_accepted = replay(request, len(extra))
                new_tokens = [*extra[:num_accepted], best[num_accepted]]
            elif i in verdicts:
                num_accepted, new_tokens = verdicts[i]
            else:
                probs = draft_probs[i]
                num_accepted, new_tokens = verify(
                    rows,
                    extra,
                    None if probs is None else probs[: len(extra)],
                    request.params,
                    request.generator,
                    best,
                )
            count = chunk.num_tokens + num_accepted
            kept.append((request, request.num_computed, row_starts[i], count))
            request.num_computed += count
            if is_decode and self.drafter is not None:
                request.num_rounds += 1
                request.num_drafts_verified += len(extra)
                request.num_drafts_accepted += num_accepted
                self.stats.num_decode_rounds += 1
                self.stats.num_verified += len(extra) + 1
                self.stats.num_accepted += num_accepted + 1
                admitted.append(len(extra))
                accepted.append(num_accepted)
                self.drafter.on_verified(request, num_accepted)
                if self.round_log is not None:
                    self.round_log.append(
                        (self._round_confidences.get(i), len(extra), num_accepted)
                    )
            self._emit(request, new_tokens)
            touched.append(request)
        if any(admitted):  # an undrafted step tried no position: nothing to learn
            self.acceptance.update(np.array(admitted), np.array(accepted))
        held_back = False
        if features is not None:
            phase = time.perf_counter()
            held_back = self._observe(kept, features, plan)
            self.stats.observe_ms.append((time.perf_counter() - phase) * 1e3)
        return touched, held_back

    def _observe(
        self, kept: list[tuple[Request, int, int, int]], features: torch.Tensor, plan: StepPlan
    ) -> bool:
        """Hand the drafter the target features of the positions each request kept; a step
        the policy left undrafted holds them back instead. True when held back."""
        kept = [item for item in kept if not item[0].is_finished and item[3] > 0]
        if not kept:
            return False
        if all(count == 1 for *_, count in kept):  # decodes that kept one position each
            rows = np.fromiter((row for _, _, row, _ in kept), np.int64, len(kept))
        else:
            rows = np.concatenate([np.arange(row, row + count) for _, _, row, count in kept])
        if rows[-1] == rows.shape[0] - 1:
            # Rows only increase, so these are rows 0..n-1: a view, no index, no gather.
            selected = features[: rows.shape[0]]
        else:
            selected = features[torch.from_numpy(rows).to(features.device)]
        if self.upkeep is not None and plan.is_undrafted_decision:
            self.upkeep.hold(kept, selected)
            return True
        if self.upkeep is not None:
            self.upkeep.flush()  # anything held back goes first, in order
        self.drafter.observe(
            [item[0] for item in kept],
            [item[1] for item in kept],
            [item[3] for item in kept],
            selected,
        )
        return False

    def _emit(self, request: Request, new_tokens: list[int]) -> None:
        """Append tokens one by one, stopping at EOS, a stop string or a length limit."""
        if request.first_token_time is None:
            request.first_token_time = self.request_clock()
        params = request.params
        reason = None
        for token in new_tokens:
            if token in self.stop_ids and not params.ignore_eos:
                request.stop_token, reason = token, FinishReason.STOP
                break
            request.output_ids.append(token)
            self.stats.num_generated += 1
            if params.stop:
                text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
                cut = min((text.find(s) for s in params.stop if s in text), default=-1)
                if cut >= 0:
                    request.stop_at = cut
                    reason = FinishReason.STOP
                    break
            if (
                len(request.output_ids) >= params.max_tokens
                or request.num_tokens >= self.max_model_len
            ):
                reason = FinishReason.LENGTH
                break
        if reason is not None:
            self._finish(request, reason)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        request.finish_reason, request.error = reason, error
        request.finish_time = self.request_clock()
        request.text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        if request.stop_at is not None:
            request.text = request.text[: request.stop_at]
        self.scheduler.finish(request)

    # ---- tensor parallelism and lifetime ---------------------------------------------

    def plan_digests(self) -> dict[int, list[int]]:
        """Per tensor-parallel rank, the digest of the plan message it ran at every
        forward so far, in order (rank 0: those it sent; empty for one process)."""
        return self.runner.plan_digests()

    def check_workers(self) -> None:
        """Raise ``TensorParallelError`` (naming the rank) if a tensor-parallel worker has
        exited since the last step; a no-op for one process. An idle engine learns of a
        dead worker only this way."""
        self.runner.check_workers()

    def close(self) -> None:
        """Stop the engine's worker processes (tensor parallelism); idempotent."""
        self.runner.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    # ---- graphs and clocks ----------------------------------------------------------

    def padded_runners(self) -> list:
        """Every padded-step runner of this engine (target, drafter, context updates)."""
        return list(self._runners)

    def num_captures(self) -> int:
        """CUDA graphs captured so far by every padded-step runner (target and drafter)."""
        return sum(runner.num_captures for runner in self._runners)

    def capture_seconds(self) -> float:
        """Host seconds spent capturing those graphs (the device waiting on the host)."""
        return sum(runner.capture_seconds for runner in self._runners)

    @property
    def verifier(self) -> AdaptiveVerifier | None:
        return None if self.policy is None else self.policy.verifier

    @property
    def settled_depth(self) -> int:
        """The depth drafting steps draft undecided now; 0 while every step decides."""
        return 0 if self.policy is None else self.policy.settled_depth

    def request_clock(self) -> float:
        """Seconds for requests' timestamps: the host's clock less ``idle_s``, the time the
        engine's owner held it idle (a time-sliced benchmark stepping other engines), so
        that TPOT counts this engine's own time only."""
        return time.perf_counter() - self.idle_s
