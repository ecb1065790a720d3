"""The serving simulator: verification policies side by side on measured step costs."""

from dspark.sim.acceptance import AcceptanceModel, published_rates
from dspark.sim.policies import Adaptive, FixedK, IdealInformation, NoSpeculation, StepView
from dspark.sim.simulator import RunResult, SimConfig, simulate
from dspark.sim.surface import CostSurface, SurfaceCostModel, seed_tables_from_surface
from dspark.sim.workload import Workload

__all__ = [
    "AcceptanceModel",
    "Adaptive",
    "CostSurface",
    "FixedK",
    "IdealInformation",
    "NoSpeculation",
    "RunResult",
    "SimConfig",
    "StepView",
    "SurfaceCostModel",
    "Workload",
    "published_rates",
    "seed_tables_from_surface",
    "simulate",
]
