"""How deep drafted steps may go, found by measured throughput rather than by the cost
model alone.

The cost model picks each step's drafting depth from the drafter's confidences and its
prices. Where the price of a depth is wrong, it keeps drafting that deep. SmolLM2 with
its shipped drafter on an H200, at 16 requests (session 39), is the case:
- Free to go 7 deep, adaptive drafted 5-7 deep in 369 of 530 steps and ran 0.923x
  K = 4.
- Held to 4 deep, it ran 1.028x K = 4.
- The deep steps cost about 0.45 ms a depth more than a K = 4 step. The learnt prices
  rose 0.077 ms a depth.

``DepthCeiling`` puts a ceiling on the chosen depth, one per batch-size bucket (the
buckets of ``ThroughputGate``: 1, 2-3, 4-7, ...), and searches for it by measurement.
- **Start.** The incumbent ceiling is the deepest depth, which leaves the cost model's
  choice alone.
- **Trials.** A trial ceiling is played every few decisions:
  - The decisions counted are those where the two ceilings would differ, i.e. the chosen
    depth is above the lower of them. Only those steps are measured.
  - Each arm keeps the tokens per ms of its last ``window`` such steps (a ratio of sums,
    as the gate keeps).
- **Choosing the trial.** The plausible range ``[lo, hi]`` starts as every depth. The
  trial is the midpoint between the incumbent and the far end of the wider side.
- **Judging a trial.** At every ``min_steps``-th step of the trial (16, 32, 48 and 64
  with the defaults), the trial's rate is compared with the incumbent's, ``confidence``
  standard errors of their difference apart. A comparison after every step would move on
  a true tie about one time in four; four looks move on one about one time in twenty.
  - A trial clearly ahead becomes the incumbent. The range keeps the side beyond it
    (throughput is taken to be unimodal in the ceiling).
  - A trial clearly behind, or not clearly ahead once its window is full, narrows the
    range to exclude it. A tie keeps the incumbent: the cost model's choice stands
    unless measurement beats it.
  - Either way both windows start afresh. The next pair differs on other steps, and
    steps kept from the last pair would make the windows unlike.
- **Settled.** When the range holds the incumbent alone, nothing is explored.
  - After ``reopen_after`` settled decisions, the range reopens to the incumbent's
    neighbours, so a workload that changes is followed.

Steps with a prompt chunk are neither capped nor measured: their walls follow the chunk.

The decisions read past steps' timings and token counts only, never the drafts of the
step they decide. The depth a step drafts is fixed before its drafter runs, so sampling
stays lossless (see ``AdaptiveVerifier``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import hypot

from dspark.scheduling.gate import ThroughputGate, _Window, check_measurement

INCUMBENT, TRIAL = 0, 1


@dataclass
class _Search:
    """One bucket's ceiling search."""

    ceiling: int  # the incumbent
    lo: int  # the range of ceilings still plausible, [lo, hi]
    hi: int
    window: int
    smallest: int  # the bucket's smallest batch size (the windows' pseudo-step)
    trial: int | None = None
    windows: list[_Window] = field(init=False)
    since_trial: int = 0  # informative decisions since the trial was last played
    settled_for: int = 0  # decisions since the range closed on the incumbent
    pair: int = 0  # counts the (incumbent, trial) pairs: a record for an old one is dropped

    def __post_init__(self) -> None:
        self.windows = [_Window(self.window), _Window(self.window)]
        self.trial = self._next_trial()

    def _next_trial(self) -> int | None:
        """The midpoint of the wider side of the range (shallower on a tie), or None
        when the range holds the incumbent alone."""
        below, above = self.ceiling - self.lo, self.hi - self.ceiling
        if below <= 0 and above <= 0:
            return None
        if below >= above:
            return (self.lo + self.ceiling) // 2
        return (self.ceiling + self.hi + 1) // 2

    def figures(self, arm: int) -> tuple[float, float]:
        return self.windows[arm].figures(True, self.smallest)


class DepthCeiling:
    """The deepest drafting depth per batch-size bucket, searched by measured tokens per
    millisecond (module doc)."""

    def __init__(
        self,
        max_depth: int,
        window: int = 64,
        min_steps: int = 16,
        explore_every: int = 3,
        confidence: float = 2.0,
        reopen_after: int = 2048,
    ) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, got {max_depth}")
        check_measurement(explore_every, window, min_steps, confidence)
        if reopen_after < 1:
            raise ValueError(f"reopen_after must be at least 1, got {reopen_after}")
        self.max_depth = max_depth
        self.window = window
        self.min_steps = min_steps
        self.explore_every = explore_every
        self.confidence = confidence
        self.reopen_after = reopen_after
        self._searches: dict[int, _Search] = {}
        self.moves = 0  # trials that became the incumbent, over every bucket

    def _get(self, num_reqs: int) -> _Search:
        key = ThroughputGate.bucket(num_reqs)
        search = self._searches.get(key)
        if search is None:
            top = self.max_depth
            search = _Search(top, 1, top, self.window, smallest=1 << (key - 1))
            self._searches[key] = search
        return search

    def ceilings(self) -> dict[int, int]:
        """Each bucket's incumbent ceiling, by the bucket's smallest batch size."""
        return {s.smallest: s.ceiling for s in self._searches.values()}

    def decide(self, num_reqs: int, depth: int) -> tuple[int, tuple[int, int, int] | None]:
        """The depth a decoding step of ``num_reqs`` requests drafts, given the cost
        model's ``depth``, and the arm to ``record`` its outcome under (None: the step
        does not tell the two ceilings apart, or nothing is being searched)."""
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        search = self._get(num_reqs)
        if search.trial is None:
            search.settled_for += 1
            if search.settled_for >= self.reopen_after:
                self._reopen(search)
            return min(depth, search.ceiling), None
        if depth <= min(search.ceiling, search.trial):
            return depth, None  # either ceiling lets this depth through
        search.since_trial += 1
        # The trial's first steps come every other decision, then one in explore_every.
        every = 2 if len(search.windows[TRIAL].steps) < self.min_steps else self.explore_every
        arm = INCUMBENT
        if search.since_trial >= every:
            search.since_trial = 0
            arm = TRIAL
        ceiling = search.ceiling if arm == INCUMBENT else search.trial
        return min(depth, ceiling), (ThroughputGate.bucket(num_reqs), search.pair, arm)

    def record(self, arm: tuple[int, int, int], tokens: int, wall_ms: float) -> None:
        """A step ``decide`` handed ``arm`` emitted ``tokens`` in ``wall_ms``."""
        if not 0.0 < wall_ms < float("inf") or tokens < 0:
            raise ValueError(
                f"need a positive, finite wall time and a token count >= 0, got {wall_ms} ms,"
                f" {tokens}"
            )
        key, pair, which = arm
        search = self._searches.get(key)
        if search is None or search.pair != pair:
            return  # the search moved on since the decision
        search.windows[which].add(tokens, wall_ms)
        if which == TRIAL:
            self._judge(search)

    def _judge(self, search: _Search) -> None:
        incumbent, trial = search.windows
        count = len(trial.steps)
        # Judged at every min_steps-th trial step only (four looks with the defaults): a
        # test repeated after every step would move on a tie one time in four.
        # A full window is judged at once (a trial not clearly ahead by then is dropped).
        early = count % self.min_steps and count < self.window
        if early or len(incumbent.steps) < self.min_steps:
            return
        rate_i, error_i = search.figures(INCUMBENT)
        rate_t, error_t = search.figures(TRIAL)
        margin = self.confidence * hypot(error_i, error_t)
        t = search.trial
        if rate_t - rate_i > margin:  # the trial is ahead: it becomes the incumbent
            if t < search.ceiling:
                search.hi = search.ceiling - 1
            else:
                search.lo = search.ceiling + 1
            search.ceiling = t
            self.moves += 1
        elif rate_i - rate_t > margin or len(trial.steps) == self.window:
            if t < search.ceiling:
                search.lo = t + 1
            else:
                search.hi = t - 1
        else:
            return
        # Both windows start afresh: the next pair is told apart on other steps (those
        # deeper than the lower of its two ceilings), and a window kept from the last
        # pair would hold steps the other arm's never can.
        search.windows = [_Window(self.window), _Window(self.window)]
        search.since_trial = 0
        search.trial = search._next_trial()
        search.settled_for = 0
        search.pair += 1

    def _reopen(self, search: _Search) -> None:
        """A settled bucket tests its incumbent's neighbours again."""
        search.lo = max(1, search.ceiling - 1)
        search.hi = min(self.max_depth, search.ceiling + 1)
        search.windows = [_Window(self.window), _Window(self.window)]
        search.settled_for = 0
        search.since_trial = 0
        search.trial = search._next_trial()
        search.pair += 1
