"""dspark: DSpark speculative decoding with confidence-scheduled adaptive verification.

Importing ``dspark`` loads the NumPy-only scheduling core; torch-backed parts
(``dspark.ops``) are imported explicitly.
"""

from dspark.scheduling import (
    AdaptiveVerifier,
    CostTables,
    StepCostModel,
    StepTiming,
    allocate_drafts,
    build_cost_tables,
    choose_draft_budget,
    cost_curves,
    profile_sizes,
    upper_bound_split,
    verification_layout,
)

__version__ = "0.1.0"

__all__ = [
    "AdaptiveVerifier",
    "CostTables",
    "StepCostModel",
    "StepTiming",
    "__version__",
    "allocate_drafts",
    "build_cost_tables",
    "choose_draft_budget",
    "cost_curves",
    "profile_sizes",
    "upper_bound_split",
    "verification_layout",
]
