"""Start-up profiling: what the drafter's price by depth is made of."""

import numpy as np

from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.engine.speculative import Proposal


class VirtualClock:
    """Milliseconds that pass only when the fakes below say so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.after_forward = False


class SlowFirstDrafter:
    """A drafter whose proposal costs ``BASE + PER_POSITION · depth`` ms, plus ``PREMIUM``
    when it is the first proposal after a target forward (what an H200 shows)."""

    BASE, PER_POSITION, PREMIUM = 2.0, 0.5, 3.0
    num_positions = 4

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def propose(self, requests, max_drafts) -> Proposal:
        depth = int(np.max(max_drafts))
        self.clock.now += self.BASE + self.PER_POSITION * depth
        if self.clock.after_forward:
            self.clock.now += self.PREMIUM
            self.clock.after_forward = False
        n = len(requests)
        return Proposal([[1] * depth for _ in range(n)], [None] * n, np.full((n, 4), 0.5))

    def on_verified(self, request, num_accepted) -> None:
        pass

    def on_finished(self, request) -> None:
        pass


def test_no_drafting_depth_pays_for_being_timed_first_after_the_forward(tiny):
    clock = VirtualClock()
    config = EngineConfig(
        spec="fixed",
        num_drafts=4,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        kv_cache_tokens=2048,
    )
    engine = LLMEngine(tiny, config, drafter=SlowFirstDrafter(clock))
    forward = engine.runner.forward

    def timed_forward(*args, **kwargs):
        clock.now += 7.0
        clock.after_forward = True
        return forward(*args, **kwargs)

    engine.runner.forward = timed_forward
    engine.runner.clock = lambda: clock.now
    profile = engine.profile()
    # Depths 1 and 2 (half the block) are timed besides K = 4; the table interpolates.
    assert sorted({d for _, d, _ in profile.draft_depth_samples}) == [1, 2]
    table = profile.depth_costs()
    expected = SlowFirstDrafter.BASE + SlowFirstDrafter.PER_POSITION * np.arange(5)
    expected[0] = 0.0
    for num_reqs in (1, 2, 4):
        np.testing.assert_allclose(table[:, num_reqs], expected)
    # The forward is timed alone: no proposal's time leaks into it.
    assert {s.forward_ms for s in profile.samples} == {7.0}


def test_a_slow_phase_of_the_machine_does_not_land_on_one_size(tiny):
    # Every forward costs 7 ms, except for a run of consecutive forwards as long as one
    # size's replays, which cost 20 (the VM slowed down for a while). Timed size by size,
    # some size would take all of them and be priced at 20; round by round, each size
    # takes at most a couple, and the medians stay 7.
    from dspark.scheduling import PROFILE_REPLAYS

    clock = VirtualClock()
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, kv_cache_tokens=2048)
    engine = LLMEngine(tiny, config)
    forward, calls = engine.runner.forward, [0]

    def timed_forward(*args, **kwargs):
        calls[0] += 1
        slow = 20 <= calls[0] < 20 + PROFILE_REPLAYS
        clock.now += 20.0 if slow else 7.0
        return forward(*args, **kwargs)

    engine.runner.forward = timed_forward
    engine.runner.clock = lambda: clock.now
    profile = engine.profile()
    by_size: dict[int, list[float]] = {}
    for sample in profile.samples:
        by_size.setdefault(sample.num_target_tokens, []).append(sample.forward_ms)
    assert len(by_size) >= 5 and calls[0] >= 20 + PROFILE_REPLAYS
    assert all(len(times) == PROFILE_REPLAYS for times in by_size.values())
    assert {float(np.median(times)) for times in by_size.values()} == {7.0}
    assert max(sum(t == 20.0 for t in times) for times in by_size.values()) <= 2
