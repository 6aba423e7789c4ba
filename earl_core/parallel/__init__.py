"""Parallelism Selector: stage layouts, the memory and throughput models, and the keep-or-switch rule."""

from earl_core.parallel.cost import CostModel, LinearFit, ProfilePoint, fit_line
from earl_core.parallel.layout import SHARDING, STAGES, Layout, candidate_layouts, tp_degrees
from earl_core.parallel.memory import Calibration, MemoryEstimate, MemoryModel, ModelShape, Work
from earl_core.parallel.selector import Candidate, Decision, NoLayoutFits, Outlook, Selector, SelectorPolicy

__all__ = [
    "SHARDING", "STAGES", "Calibration", "Candidate", "CostModel", "Decision", "Layout", "LinearFit", "MemoryEstimate",
    "MemoryModel", "ModelShape", "NoLayoutFits", "Outlook", "ProfilePoint", "Selector", "SelectorPolicy", "Work",
    "candidate_layouts", "fit_line", "tp_degrees",
]
