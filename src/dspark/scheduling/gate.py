"""Whether drafting pays, from measured throughput rather than from the cost model alone.

The budget prices a step from profiled costs and the drafter's confidences. Both can be
off in ways the budget cannot see: the profile times the drafter's block pass but not the
host work around it (context updates, per-request verification), it is taken at one
context length, and confidences can be optimistic. When they are off, adaptive
verification keeps drafting where no drafting at all would be faster.

``ThroughputGate`` settles that one question, draft this step or not, by measurement. Per
batch-size bucket (powers of two) it keeps the last ``window`` drafted and the last
``window`` undrafted steps, and each arm's throughput as a ratio of sums (tokens over wall
time: a drafted step emits a skewed, discrete number of tokens, mostly 1, sometimes many,
so a median of per-step ratios would be biased). It takes the arm whose upper confidence
bound (``confidence`` standard errors of that ratio) leads, and the other arm now and then
(about every ``explore_every`` decisions: ``UNDRAFTED_BACKOFF``, ``ALONE_SPEEDUP``) so that
its figure stays current. The bound is optimistic about the
less certain arm: a drafted window can dip well below its mean by luck alone, and drafted
steps that were unrepresentative at first (warm-up, few tokens) keep a wide bound, so
drafting is measured again soon, while an arm clearly behind is left alone. Steps that
carry a prompt chunk (``mixed``) are bucketed apart, since the chunk's compute is in their
wall time whichever arm they play; a bucket not yet measured on both arms follows its
nearest measured neighbour.

Where the cost model declines drafting, ``should_probe`` decides instead: it drafts where
drafted steps without a prompt chunk measure clearly faster (measurement overrules the
cost model either way), and otherwise now and then, so that a price learnt from a few bad
steps is measured again. Those declined steps, drafted, are measured in an arm of their
own (``record``). The decisions read past steps' timings and token counts only, never the
drafts of the step they decide, so sampling stays lossless (see ``AdaptiveVerifier``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from math import inf

DRAFTED, UNDRAFTED, DECLINED = 0, 1, 2
"""The arms a bucket measures: drafted steps the cost model chose, undrafted steps, and
drafted steps the cost model declined (probes and overrules, ``ThroughputGate.record``)."""

EXPLORE_SHARE = 0.0025
UNDRAFTED_BACKOFF = 4
"""Where drafting leads, the undrafted arm is explored less often the further behind it
is: one exploring step gives up ``1 - 1/lead`` of a step's tokens (upper bounds' ratio),
so it comes once every ``(1 - 1/lead) / EXPLORE_SHARE`` decisions (a quarter of a percent
of throughput), never more often than every ``explore_every`` nor less often than every
``UNDRAFTED_BACKOFF`` times that. The undrafted arm's throughput is the target's step
time alone, which changes slowly within a bucket (the context grows), while a fall of the
drafted arm (acceptance drops) is measured on the very steps it is played; exploring the
undrafted arm at the full rate would cost a steady share of throughput for a figure that
hardly moves. The other way round, a drafted arm behind is explored at the full rate: its
figure moves with acceptance, which can recover."""


ALONE_SPEEDUP = 4
"""A batch of one whose drafted arm is behind explores it ``ALONE_SPEEDUP`` times more
often. Its drafted steps earn what one request's drafts earn, so the figure is mostly
about the request that drafted last, and requests differ widely: after a poor request,
exploring at the common rate would veto the next one's chosen steps for a whole
exploration period or more, even where drafting pays on average. Larger batches average
over their requests, and their drafted figure moves slowly."""


ALONE_WINDOW = 128
"""A batch of one keeps this many steps per arm (at least the gate's ``window``). One
request's drafted steps are correlated (its rounds predict each other: the verifier's
``predictiveness``), and a request runs for dozens of steps, so a window of 16 holds the
last request alone: after a poor one it would veto the next request's drafting, and the
figure would say nothing about the workload. A window of 128 spans a few requests; which
requests to draft for is the cost model's call (their own recorded rounds), whether
drafting pays at all here the gate's."""


ALONE_CONFIDENCE = 1.0
"""Standard errors wide the veto's bounds are at one request (at least the gate's
``confidence``; ``ThroughputGate(alone_confidence=...)``). Wider bounds would veto less
after a poor request, as ``ALONE_WINDOW`` does, but a veto that waits for a clear loss
keeps drafting where the drafter is overconfident and drafting loses; the longer window
gets the first without the second."""


OUTLIER_WALL = 2.0
OUTLIER_MIN_STEPS = 3
"""A step's wall time counts as at most ``OUTLIER_WALL`` times the median wall of its
arm's window, and more in proportion to its tokens where it emitted more than the
window's median (once the window holds ``OUTLIER_MIN_STEPS`` steps). A window is a ratio
of sums, so one step that stalled (a first call of a shape, the allocator growing, the
host descheduled) drags its arm's rate down for as long as it stays in the window; and
an arm that loses is measured again only once in ``explore_every`` decisions, so a stall
among the drafted arm's first steps would keep drafting off for ``window`` explorations,
hundreds of steps. Steps of one arm at one batch size rarely differ by 2x, and a step
that takes longer because it verified more, and so emitted more, keeps its time in
proportion. Steps with a prompt chunk are not capped: their walls follow the chunk, which
their tokens do not show. The price: an arm that really slows down more than 2x is
believed once the slow steps are half its window (acceptance collapsing 5x at 4 requests:
drafting ends at the eighth slow step, not the sixth)."""


class _Window:
    """One arm's last ``size`` steps, and what its figures need kept up to date as steps
    come and go: the steps in order of wall time and their token counts in order (the
    medians the outlier cap reads), and running sums of tokens and walls, their squares
    and their products. The figures then cost a few operations a step plus a few per
    capped step, where summing the window would cost a pass over it on every step (a
    batch of one keeps 128 steps).

    The sums are of each step's distance from a reference step (``shift``: the window's
    means when the sums were last taken afresh), so the squares that the error is made of
    are never a small difference of large totals; they are taken afresh from the steps
    every ``size`` additions, so rounding never builds up."""

    __slots__ = ("by_wall", "shift", "since_fresh", "steps", "sums", "tokens")

    def __init__(self, size: int) -> None:
        self.steps: deque[tuple[int, float]] = deque(maxlen=size)
        self.by_wall: list[tuple[float, int]] = []  # (wall, tokens), ascending
        self.tokens: list[int] = []  # ascending
        self.shift = (0.0, 0.0)  # the (tokens, wall) the sums are measured from
        # Σ a, Σ b, Σ a², Σ a·b, Σ b² for a = tokens - shift tokens, b = wall - shift wall
        self.sums = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.since_fresh = 0

    def add(self, tokens: int, wall: float) -> None:
        if not self.steps:
            self.shift = (float(tokens), float(wall))
        if len(self.steps) == self.steps.maxlen:
            old_tokens, old_wall = self.steps[0]  # drops out with this append
            del self.by_wall[bisect_left(self.by_wall, (old_wall, old_tokens))]
            del self.tokens[bisect_left(self.tokens, old_tokens)]
            self._accumulate(old_tokens, old_wall, -1.0)
        self.steps.append((tokens, wall))
        insort(self.by_wall, (wall, tokens))
        insort(self.tokens, tokens)
        self.since_fresh += 1
        if self.since_fresh < self.steps.maxlen:
            self._accumulate(tokens, wall, 1.0)
            return
        # Afresh, from the window's means.
        self.since_fresh = 0
        count = len(self.steps)
        self.shift = (
            sum(step_tokens for step_tokens, _ in self.steps) / count,
            sum(step_wall for _, step_wall in self.steps) / count,
        )
        self.sums = [0.0, 0.0, 0.0, 0.0, 0.0]
        for step_tokens, step_wall in self.steps:
            self._accumulate(step_tokens, step_wall, 1.0)

    def _accumulate(self, tokens: int, wall: float, sign: float) -> None:
        """Adds one step to the sums (``sign`` 1) or takes it out (-1)."""
        a, b = tokens - self.shift[0], wall - self.shift[1]
        sums = self.sums
        sums[0] += sign * a
        sums[1] += sign * b
        sums[2] += sign * (a * a)
        sums[3] += sign * (a * b)
        sums[4] += sign * (b * b)

    def figures(self, capped: bool, smallest: int) -> tuple[float, float]:
        """(rate, standard error) as ``_Bucket.rate_and_error`` defines them, walls capped
        as ``_Bucket.steps`` caps them when ``capped``; ``smallest``: the pseudo-step's
        batch size (0: none)."""
        count = len(self.steps)
        shift_tokens, shift_wall = self.shift
        sum_a, sum_b, sum_aa, sum_ab, sum_bb = self.sums
        if capped and count >= OUTLIER_MIN_STEPS:
            middle = count // 2
            wall_cap = OUTLIER_WALL * self.by_wall[middle][0]
            typical_tokens = max(self.tokens[middle], 1)
            # Only walls above the cap itself can be capped (the cap grows with tokens).
            above = bisect_right(self.by_wall, (wall_cap, inf))
            for wall, tokens in islice(self.by_wall, above, None):
                limit = wall_cap * max(1.0, tokens / typical_tokens)
                if wall > limit:
                    a, b, b_capped = tokens - shift_tokens, wall - shift_wall, limit - shift_wall
                    sum_b += b_capped - b
                    sum_ab += a * (b_capped - b)
                    sum_bb += b_capped * b_capped - b * b
        total_wall = count * shift_wall + sum_b
        rate = (count * shift_tokens + sum_a) / total_wall
        # Σ (tokens - rate · wall)² = Σ (a - rate · b + c)² with c = shift tokens - rate ·
        # shift wall; rounding can leave it a hair below zero.
        c = shift_tokens - rate * shift_wall
        squares = (
            sum_aa
            - 2.0 * rate * sum_ab
            + rate * rate * sum_bb
            + 2.0 * c * (sum_a - rate * sum_b)
            + count * c * c
        )
        squares = max(squares, 0.0)
        if smallest:
            squares += (rate * total_wall / count) ** 2 / smallest
        return rate, squares**0.5 / total_wall


@dataclass
class _Bucket:
    window: int
    smallest: int = 1  # the smallest batch size of the bucket (a power of two)
    mixed: bool = False  # steps with a prompt chunk (their walls follow the chunk's size)
    windows: tuple[_Window, _Window, _Window] = field(init=False)  # one per arm
    samples: tuple[deque, deque, deque] = field(init=False)  # (tokens, wall ms) per arm
    # Each arm's (rate, standard error), kept until its window changes (``add``): a step
    # adds to one arm, and the decisions read both arms' figures every step.
    figures: list = field(init=False)
    since_explored: int = 0  # decisions since the other arm was last taken
    declined: int = 0  # steps the cost model left undrafted since the last probe
    overruled: int = 0  # steps the cost model left undrafted that the gate drafted
    probes_in_a_row: int = 0  # probes since the cost model last drafted on its own

    def __post_init__(self) -> None:
        self.windows = tuple(_Window(self.window) for _ in (DRAFTED, UNDRAFTED, DECLINED))
        self.samples = tuple(window.steps for window in self.windows)
        self.figures = [None, None, None]

    def add(self, arm: int, tokens: int, wall_ms: float) -> None:
        """One step measured on ``arm`` (its window's oldest step drops out when full)."""
        self.windows[arm].add(tokens, wall_ms)
        self.figures[arm] = None

    def steps(self, arm: int) -> list[tuple[int, float]]:
        """The arm's window, each wall time capped (``OUTLIER_WALL``) once the window holds
        ``OUTLIER_MIN_STEPS`` steps; a bucket of steps with a prompt chunk as measured
        (their walls follow the chunk's size, which their tokens do not show)."""
        steps = list(self.samples[arm])
        if len(steps) < OUTLIER_MIN_STEPS or self.mixed:
            return steps
        walls = [wall for _, wall in steps]
        if max(walls) <= OUTLIER_WALL * min(walls):
            return steps  # no wall above twice the shortest, so none above its cap
        middle = len(steps) // 2
        wall_cap = OUTLIER_WALL * sorted(walls)[middle]
        typical_tokens = max(sorted(tokens for tokens, _ in steps)[middle], 1)
        return [
            (tokens, min(wall, wall_cap * max(1.0, tokens / typical_tokens)))
            for tokens, wall in steps
        ]

    def rate(self, arm: int) -> float | None:
        steps = self.steps(arm)
        if not steps:
            return None
        return sum(tokens for tokens, _ in steps) / sum(wall for _, wall in steps)

    def upper_bound(self, arm: int, confidence: float) -> float:
        """The arm's rate plus ``confidence`` standard errors of it (``rate_and_error``)."""
        rate, error = self.rate_and_error(arm)
        return rate + confidence * error

    def lower_bound(self, arm: int, confidence: float) -> float:
        """The arm's rate minus ``confidence`` standard errors of it."""
        rate, error = self.rate_and_error(arm)
        return rate - confidence * error

    def rate_and_error(self, arm: int) -> tuple[float, float]:
        """The arm's rate and its standard error: the ratio of sums' delta-method error,
        ``sqrt(Σ (tokens - rate · wall)²) / Σ wall`` over the window's steps (the
        drafted arms with one pseudo-step more). Computed once per change of the
        window (``add``)."""
        figure = self.figures[arm]
        if figure is None:
            figure = self.figures[arm] = self._rate_and_error(arm)
        return figure

    def _rate_and_error(self, arm: int) -> tuple[float, float]:
        # Drafted steps' token counts vary by design: a few that happen to agree do not
        # make the figure certain. One pseudo-step stands for the spread not seen yet: as
        # far from the rate as the rate itself for one request, and for n requests
        # sqrt(n) times less in proportion (a step's tokens are a sum over its requests'
        # rounds; the bucket's smallest n). A spread that does not shrink with the batch
        # would keep the drafted arm's bound a fixed share above its rate (1/16 with a
        # window of 16) at every batch size, so drafting that measured up to that much
        # slower would still be taken.
        smallest = 0 if arm == UNDRAFTED else self.smallest
        return self.windows[arm].figures(not self.mixed, smallest)


def check_measurement(explore_every: int, window: int, min_steps: int, confidence: float) -> None:
    """The settings a measured choice between two arms shares (``ThroughputGate``,
    ``DepthCeiling``): how often the other arm is taken, the steps each arm keeps, how
    many it needs before it is judged and how many standard errors wide its bounds are."""
    if explore_every < 2:
        raise ValueError(f"explore_every must be at least 2, got {explore_every}")
    if not 1 <= min_steps <= window:
        raise ValueError(f"need 1 <= min_steps <= window, got {min_steps} and {window}")
    if not confidence >= 0:
        raise ValueError(f"confidence must be >= 0, got {confidence}")


class ThroughputGate:
    """Draft or not, per batch-size bucket, by the measured tokens per millisecond."""

    def __init__(
        self,
        explore_every: int = 32,
        window: int = 16,
        min_steps: int = 3,
        confidence: float = 1.0,
        alone_confidence: float = ALONE_CONFIDENCE,
        alone_window: int = ALONE_WINDOW,
    ) -> None:
        check_measurement(explore_every, window, min_steps, confidence)
        if not alone_confidence >= 0:
            raise ValueError(f"alone_confidence must be >= 0, got {alone_confidence}")
        if alone_window < 1:
            raise ValueError(f"alone_window must be at least 1, got {alone_window}")
        self.explore_every = explore_every
        self.window = window
        self.min_steps = min_steps
        self.confidence = confidence
        self.alone_confidence = alone_confidence  # the veto's bounds at one request
        self.alone_window = alone_window  # steps kept per arm at one request
        self._buckets: dict[int, _Bucket] = {}

    @staticmethod
    def bucket(num_reqs: int) -> int:
        """Batch sizes share a bucket within a power of two: 1, 2-3, 4-7, ..."""
        return max(int(num_reqs), 1).bit_length()

    @classmethod
    def _key(cls, num_reqs: int, mixed: bool) -> tuple[bool, int]:
        return bool(mixed), cls.bucket(num_reqs)

    def _get(self, num_reqs: int, mixed: bool) -> _Bucket:
        key = self._key(num_reqs, mixed)
        if key not in self._buckets:
            # A batch of one keeps a longer window (``ALONE_WINDOW``).
            window = max(self.window, self.alone_window) if key[1] == 1 else self.window
            self._buckets[key] = _Bucket(window, smallest=1 << (key[1] - 1), mixed=key[0])
        return self._buckets[key]

    def should_draft(self, num_reqs: int, mixed: bool = False) -> bool:
        """Draft this step? (Called once per step that the cost model would draft;
        ``mixed``: the step carries a prompt chunk besides its decodes.)"""
        state = self._get(num_reqs, mixed)
        state.since_explored += 1
        state.probes_in_a_row = 0  # the cost model drafts here again: probe soon if not
        # A bucket not yet measured on both arms follows its nearest measured neighbour
        # (a batch that shrank or grew into it); with none, both arms are measured first,
        # drafting first.
        judged = self._judged(state, num_reqs, mixed)
        if judged is None:
            for arm in (DRAFTED, UNDRAFTED):
                if len(state.samples[arm]) < self.min_steps:
                    return arm == DRAFTED
        best, every = self._leader(state, judged)
        # Counted from the last exploration, not by the decision's number: ``every``
        # moves with the bounds, and a moving modulus would explore at random intervals.
        if state.since_explored >= every:
            state.since_explored = 0
            best = 1 - best  # keep the other arm's figure current
        return best == DRAFTED

    def _leader(self, state: _Bucket, judged: _Bucket) -> tuple[int, int]:
        """The arm whose upper bound leads in ``judged``'s figures, and every how many
        decisions ``state`` explores the other."""
        confidence = self._confidence(state)
        bound = [judged.upper_bound(arm, confidence) for arm in (DRAFTED, UNDRAFTED)]
        best = DRAFTED if bound[DRAFTED] >= bound[UNDRAFTED] else UNDRAFTED
        every = self.explore_every
        if best == DRAFTED and bound[DRAFTED] > bound[UNDRAFTED]:
            # A stable figure behind: re-measured as rarely as its exploring steps cost.
            give_up = 1.0 - bound[UNDRAFTED] / bound[DRAFTED]
            every = int(min(max(every, give_up / EXPLORE_SHARE), every * UNDRAFTED_BACKOFF))
        elif best == UNDRAFTED and state.smallest == 1:
            every = max(2, every // ALONE_SPEEDUP)  # one request's drafts: re-measured sooner
        return best, every

    def _confidence(self, state: _Bucket) -> float:
        """Standard errors of the bounds a bucket's veto decisions use (``ALONE_CONFIDENCE``)."""
        if state.smallest == 1:
            return max(self.confidence, self.alone_confidence)
        return self.confidence

    def _judged(self, state: _Bucket, num_reqs: int, mixed: bool) -> _Bucket | None:
        """The bucket whose figures decide for ``state``: itself once measured on both
        arms, else its nearest measured neighbour (None: nothing measured anywhere)."""
        return state if self._is_measured(state) else self._nearest_measured(num_reqs, mixed)

    def _is_measured(self, state: _Bucket) -> bool:
        return all(len(state.samples[arm]) >= self.min_steps for arm in (DRAFTED, UNDRAFTED))

    def _nearest_measured(self, num_reqs: int, mixed: bool) -> _Bucket | None:
        size = self.bucket(num_reqs)
        measured = [k for k, state in self._buckets.items() if self._is_measured(state)]
        if not measured:
            return None
        # The same kind first, then the nearest size (the smaller on a tie).
        nearest = min(measured, key=lambda k: (k[0] != bool(mixed), abs(k[1] - size), k[1]))
        return self._buckets[nearest]

    def should_probe(self, num_reqs: int, mixed: bool = False) -> bool:
        """Draft anyway this step, which the cost model would not? (Called once per step
        that the cost model would leave undrafted.)

        Measurement overrules the cost model both ways: where the bucket's (or its
        nearest measured neighbour's) drafted steps emit clearly more tokens per ms than
        its undrafted ones (drafted rate less ``confidence`` standard errors above the
        undrafted rate plus as many), the step is drafted, except one in
        ``explore_every`` (the undrafted figure stays current). The lead that starts it
        comes from steps the cost model picked (drafted when their confidences looked
        good); the declined steps so drafted are measured apart (``record``), and once
        ``min_steps`` of them are, their own lower bound decides, so the overruling stops
        within a few steps if drafting the declined ones does not pay. Steps with a
        prompt chunk are never overruled: their rates mix in the chunk's cost, which
        varies from step to step, so a lead there says more about the chunks than about
        drafting; the cost model prices their drafts at the margin (``AdaptiveVerifier``)
        and stands.

        Otherwise, probes: a price learnt from a few bad drafted steps is otherwise never
        measured again, and drafting, once priced out, would stay out for good. The
        first probe of a bucket comes after ``explore_every`` declined steps; each probe
        doubles the wait for the next (up to 4x), and a step the cost model drafts on
        its own resets it."""
        state = self._get(num_reqs, mixed)
        judged = None
        if not mixed:
            own = state.samples
            if min(len(own[DECLINED]), len(own[UNDRAFTED])) >= self.min_steps:
                judged = state  # declined steps drafted and undrafted ones: enough to judge
            else:  # a cost model that declines every step never fills the chosen arm
                judged = self._judged(state, num_reqs, mixed)
        if judged is not None:
            # Until a few declined steps were drafted, the chosen ones stand in for them.
            arm = DECLINED if len(judged.samples[DECLINED]) >= self.min_steps else DRAFTED
            lead = judged.lower_bound(arm, self.confidence)
            if lead > judged.upper_bound(UNDRAFTED, self.confidence):
                state.overruled += 1
                return state.overruled % self.explore_every != 0
        state.declined += 1
        wait = self.explore_every << state.probes_in_a_row
        if state.declined < wait:
            return False
        state.declined = 0
        state.probes_in_a_row = min(state.probes_in_a_row + 1, 2)
        return True

    def record(
        self,
        num_reqs: int,
        drafted: bool,
        tokens: int,
        wall_ms: float,
        mixed: bool = False,
        declined: bool = False,
    ) -> None:
        """A step of ``num_reqs`` requests (``mixed``: one or more of them a prompt chunk)
        emitted ``tokens`` in ``wall_ms``; ``declined``: a drafted step that the cost
        model had declined (``should_probe`` drafted it), measured apart from those it
        chose. The two differ by selection: the cost model drafts where confidences look
        good and declines where they look poor, so a window that mixed them would judge
        the next chosen step by probes of poor ones, and could veto chosen steps that
        pay."""
        if not 0.0 < wall_ms < inf or tokens < 0:  # the windows' sums would turn to NaN
            raise ValueError(
                f"need a positive, finite wall time and a token count >= 0, got {wall_ms} ms,"
                f" {tokens}"
            )
        if declined and not drafted:
            raise ValueError("an undrafted step cannot be a declined step drafted anyway")
        arm = (DECLINED if declined else DRAFTED) if drafted else UNDRAFTED
        self._get(num_reqs, mixed).add(arm, tokens, wall_ms)

    def rates(self, num_reqs: int, mixed: bool = False) -> tuple[float | None, float | None]:
        """(drafted, undrafted) tokens per ms measured for this batch size's bucket."""
        state = self._buckets.get(self._key(num_reqs, mixed))
        return (None, None) if state is None else (state.rate(DRAFTED), state.rate(UNDRAFTED))
