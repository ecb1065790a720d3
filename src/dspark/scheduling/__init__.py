"""The scheduling core of adaptive verification: NumPy only, no engine state.

Per step: ``choose_draft_budget`` (from stale confidences and a step-cost model) decides
how many draft slots to verify, ``allocate_drafts`` (from fresh confidences) decides
whose, and ``verification_layout`` places them in the packed batch. ``AdaptiveVerifier``
keeps the per-slot confidences and runs that lifecycle for an engine; ``ThroughputGate``
decides from measured step throughput whether drafting pays at all, and
``ObservedDraftCost`` keeps the drafter's price in step with measured drafting time.
"""

from dspark.scheduling.allocation import allocate_drafts
from dspark.scheduling.budget import choose_draft_budget
from dspark.scheduling.cost import (
    CostTables,
    ObservedDraftCost,
    StepCostModel,
    build_cost_tables,
    build_depth_costs,
)
from dspark.scheduling.gate import ThroughputGate
from dspark.scheduling.layout import upper_bound_split, verification_layout
from dspark.scheduling.profiling import (
    PROFILE_REPLAYS,
    StepTiming,
    cost_curves,
    profile_sizes,
)
from dspark.scheduling.verifier import AdaptiveVerifier

__all__ = [
    "PROFILE_REPLAYS",
    "AdaptiveVerifier",
    "CostTables",
    "ObservedDraftCost",
    "StepCostModel",
    "StepTiming",
    "ThroughputGate",
    "allocate_drafts",
    "build_cost_tables",
    "build_depth_costs",
    "choose_draft_budget",
    "cost_curves",
    "profile_sizes",
    "upper_bound_split",
    "verification_layout",
]
