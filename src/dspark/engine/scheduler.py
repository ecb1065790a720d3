"""Continuous batching: who runs this step and how many tokens each computes.

Running requests go first: decodes (one token plus room for ``draft_room`` drafts each,
oldest first), then the chunks of requests still prefilling. Waiting requests are
admitted (first come, first served) while there is a free sequence slot, token budget and
cache. When the cache cannot hold a running request's next tokens, the newest running
request is preempted: its blocks are freed and it waits at the front of the queue to be
recomputed. Nothing is ever dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dspark.engine.kv_cache import PagedKVCache
from dspark.engine.request import Request


@dataclass
class ScheduledChunk:
    request: Request
    num_tokens: int  # non-draft tokens computed this step (1 for a decode)
    draft_room: int = 0  # drafts this decode may add (token budget and cache reserved)

    @property
    def is_decode(self) -> bool:
        return self.request.num_tokens - self.request.num_computed == 1

    @property
    def samples(self) -> bool:
        """Whether this step produces a token for the request (its chunk ends the prompt)."""
        return self.request.num_computed + self.num_tokens == self.request.num_tokens


class Scheduler:
    def __init__(
        self,
        cache: PagedKVCache,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        on_admit: Callable[[Request], None] = lambda request: None,
        on_release: Callable[[Request], None] = lambda request: None,
    ) -> None:
        self.cache = cache
        self.on_admit, self.on_release = on_admit, on_release
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots = list(range(max_num_seqs - 1, -1, -1))

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def has_prompt_work(self) -> bool:
        """Whether a prompt can take tokens this step: a running request still prefilling,
        or a waiting one and a free slot to admit it."""
        if self.waiting and self.free_slots:
            return True
        return any(r.num_tokens - r.num_computed > 1 for r in self.running)

    def schedule(self, draft_room: int) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        # Decodes first (oldest first), then prompt chunks: a long prompt never starves them.
        decoding = [r for r in self.running if r.num_tokens - r.num_computed == 1]
        prefilling = [r for r in self.running if r.num_tokens - r.num_computed > 1]
        scheduled: set[int] = set()  # ids of the requests already in this step's batch
        for request in decoding + prefilling:
            if budget <= 0:
                break
            if request not in self.running:
                continue  # preempted to make room for an older request
            todo = request.num_tokens - request.num_computed
            num_tokens = 1 if todo == 1 else min(todo, budget)
            room = min(draft_room, budget - 1) if todo == 1 else 0
            if not self._reserve(request, request.num_computed + num_tokens + room, scheduled):
                continue  # the request itself was preempted
            chunks.append(ScheduledChunk(request, num_tokens, room))
            scheduled.add(id(request))
            budget -= num_tokens + room
        while self.waiting and budget > 0 and self.free_slots:
            request = self.waiting[0]
            num_tokens = min(request.num_tokens - request.num_computed, budget)
            request.table.region = self.free_slots[-1]  # its blocks come from its slot's run
            if not self.cache.reserve(request.table, request.num_computed + num_tokens):
                break
            self.waiting.popleft()
            request.slot = self.free_slots.pop()
            self.running.append(request)
            self.on_admit(request)
            chunks.append(ScheduledChunk(request, num_tokens))
            budget -= num_tokens
        return chunks

    def _reserve(self, request: Request, num_tokens: int, scheduled: set[int]) -> bool:
        """Cache room for ``num_tokens``, preempting newer requests not yet scheduled this
        step (newest first); False if ``request`` itself had to go."""
        while not self.cache.reserve(request.table, num_tokens):
            position = self.running.index(request)
            newer = [r for r in self.running[position + 1 :] if id(r) not in scheduled]
            victim = newer[-1] if newer else request
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.cache.release(request.table)
        request.num_computed = 0
        request.num_preemptions += 1
        self._free_slot(request)
        self.waiting.appendleft(request)

    def finish(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.cache.release(request.table)
        self._free_slot(request)

    def _free_slot(self, request: Request) -> None:
        if request.slot is not None:
            self.on_release(request)
            self.free_slots.append(request.slot)
            request.slot = None
