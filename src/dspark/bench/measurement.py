"""What ``dspark bench`` records of a run, and the rows it makes of them.

``Measurement``: one run's (or one time-sliced window's) tok/s, TPOT, acceptance, host
phases and step counts; ``learnt_state``: what adaptive verification's cost model and
verifier believed at the end of it; ``summarise``: a row of medians over the repeats.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from dspark.engine.engine import LLMEngine


@dataclass
class Measurement:
    label: str
    spec: str
    k: int
    concurrency: int
    requests: int
    tokens: int
    seconds: float  # wall time of the level
    tok_s: float  # generated tokens over the wall time less graph captures (steady state)
    per_user_tok_s: float  # median over requests
    tpot_p50_ms: float
    tpot_p99_ms: float
    acceptance_length: float
    verified_per_round: float
    schedule_share: float  # adaptive: scheduling time (all steps) / steady wall time
    step_ms: float = 0.0  # wall time per engine step (less captures)
    schedule_us_per_step: float = 0.0  # adaptive: budget + allocation per step
    graph_captures: int = 0  # CUDA graphs captured while measuring (after the warm-up)
    capture_s: float = 0.0  # host seconds those captures took
    capture_steps: int = 0  # steps that captured a graph while measuring
    # Target steps that replayed a larger captured shape than their own while measuring
    # (``dspark.engine.graphs.CaptureLedger``): they cost what that shape costs.
    covered_steps: int = 0
    covered_tokens: int = 0  # the padding tokens those covers added (a cover's size less its own)
    # Adaptive: steps whose budget rose into the padding of the graph they replayed, and
    # the drafts that added (``EngineConfig.fill_padding``).
    filled_steps: int = 0
    settled_steps: int = 0  # adaptive: drafting steps run at a settled depth (EngineConfig.settle)
    filled_drafts: int = 0
    tok_s_wall: float = 0.0  # generated tokens over the whole wall time, captures included
    undrafted_steps: int = 0  # adaptive: steps with decodes where it chose not to draft
    gate_vetoes: int = 0  # adaptive: of those, the throughput gate's (the model drafted)
    probes: int = 0  # adaptive: drafted steps the cost model declined (the gate's probes)
    depth_steps: list[int] = field(default_factory=list)  # adaptive: steps by depth 0..K
    lookahead_hits: int = 0  # adaptive: drafting decisions taken during the previous forward
    lookahead_us_per_step: float = 0.0  # look-ahead host time, used or not (during forwards)
    lookahead_plans: int = 0  # adaptive: of the hits, budgets planned ahead too
    drafting_plans: int = 0  # adaptive: budgets planned while the drafter ran
    share_plans: int = 0  # adaptive: budgets summed from shares planned ahead (changed batch)
    recut_plans: int = 0  # adaptive: budgets of a prompt-chunk step recut from the ranking ahead
    lookahead_reused: int = 0  # adaptive: depths decided ahead for a batch that changed
    heap_frozen: bool = False  # the start-up heap frozen for the run (``--freeze-gc``)
    gc_full: int = 0  # full (oldest-generation) collections while measuring
    gc_full_s: float = 0.0  # their seconds (inside the wall time)
    gc_s: float = 0.0  # seconds of every collection while measuring
    # The host's speed around the run: ``host_probe_ms`` before and after it (a fixed
    # piece of Python and NumPy work, the fastest of a few tries), and the medians of the
    # run's host phases (``EngineStats``: the drafter's proposal, verification and
    # emission, the forward from queueing to outputs on the host). A machine whose host
    # runs some runs slower than others shows it in both; a slow run whose probe is not
    # slow was slowed by something else than the host's speed.
    probe_ms: tuple[float, float] = (0.0, 0.0)
    phase_ms: dict[str, float] = field(default_factory=dict)
    # Adaptive: what its cost model and verifier believed at the end of the run
    # (``learnt_state``), so that runs that chose differently can be told apart.
    learnt: dict = field(default_factory=dict)
    # A window of a time-sliced run (``--slice-ms``): its requests, tokens and seconds
    # are that window's own, and a row sums them over the windows (``summarise``).
    window: bool = False


def learnt_state(engine: LLMEngine, num_reqs: int) -> dict:
    """Adaptive: the drafter's price by depth for ``num_reqs`` requests (index 0: what an
    undrafted step adds), the measured overhead lines (``ObservedDraftCost``), the
    population's survival by position and how well a request's rounds predict its next
    (empty for fixed K and no speculation)."""
    verifier = getattr(engine, "verifier", None)
    if verifier is None:
        return {}
    model = verifier.cost_model
    state: dict = {
        "population_survival": [round(float(s), 4) for s in verifier.population_survival],
        "predictiveness": round(float(verifier.predictiveness), 4),
    }
    by_depth = getattr(model, "draft_costs_by_depth", None)
    if by_depth is not None:
        prices = by_depth(num_reqs, verifier.num_positions)
        state["draft_ms_by_depth"] = [round(float(ms), 4) for ms in prices]
    lines = getattr(model, "overhead_lines", None)
    if lines is not None:
        state["overhead_lines"] = {
            kind: [round(float(a), 4), round(float(b), 4)] for kind, (a, b) in lines().items()
        }
    return state


def summarise(measurements: list[Measurement]) -> dict:
    """Medians over repeats (and each repeat's tok/s, for the spread). A run's
    ``requests``, ``tokens`` and ``seconds`` are the first repeat's (every repeat runs the
    same prompts), a time-sliced row's their sums over the windows."""
    row = asdict(measurements[0])
    if measurements[0].window:
        for key in ("requests", "tokens", "seconds"):
            row[key] = sum(getattr(m, key) for m in measurements)
    for key in (
        "tok_s",
        "per_user_tok_s",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "schedule_share",
        "step_ms",
        "schedule_us_per_step",
        "graph_captures",
        "capture_s",
        "capture_steps",
        "covered_steps",
        "covered_tokens",
        "filled_steps",
        "settled_steps",
        "filled_drafts",
        "tok_s_wall",
        "undrafted_steps",
        "gate_vetoes",
        "probes",
        "lookahead_hits",
        "lookahead_us_per_step",
        "lookahead_plans",
        "drafting_plans",
        "share_plans",
        "recut_plans",
        "lookahead_reused",
        "gc_full",
        "gc_full_s",
        "gc_s",
    ):
        row[key] = float(np.median([getattr(m, key) for m in measurements]))
    if row["depth_steps"]:  # per depth, the median over repeats (not the first repeat's)
        by_depth = np.array([m.depth_steps for m in measurements], dtype=float)
        row["depth_steps"] = [float(v) for v in np.median(by_depth, axis=0)]
    for key in ("acceptance_length", "verified_per_round"):
        row[key] = float(np.mean([getattr(m, key) for m in measurements]))
    row["tok_s_runs"] = [round(m.tok_s, 2) for m in measurements]
    row["gc_full_runs"] = [m.gc_full for m in measurements]
    del row["probe_ms"], row["phase_ms"], row["learnt"]  # per run only, below
    row["probe_ms_runs"] = [[round(v, 4) for v in m.probe_ms] for m in measurements]
    row["phase_ms_runs"] = [{k: round(v, 4) for k, v in m.phase_ms.items()} for m in measurements]
    row["learnt_runs"] = [m.learnt for m in measurements]
    return row
