"""The planner: for every composite, a measured kernel on some backend or its decomposition.

Importing this package registers the built-in kernels and the "planned" device.
See docs/planner.md.
"""

from tensorgraphs.plan import library as _library  # noqa: F401  (registers the built-in kernels)
from tensorgraphs.plan.cost import CostModel, Estimate
from tensorgraphs.plan.executor import PLANNED, PlannedBackend
from tensorgraphs.plan.implementations import (
    IMPLEMENTATIONS,
    KERNEL_BACKENDS,
    Implementation,
    ImplementationRejected,
    KernelBackend,
    Sample,
    register_implementation,
    register_kernel_backend,
)
from tensorgraphs.plan.planner import DECOMPOSE, GraphPlan, PlanError, Planner, Route, default_planner
from tensorgraphs.plan.signature import Signature, TensorSpec, signature_of

__all__ = [
    "DECOMPOSE", "IMPLEMENTATIONS", "KERNEL_BACKENDS", "PLANNED", "CostModel", "Estimate", "GraphPlan",
    "Implementation", "ImplementationRejected", "KernelBackend", "PlanError", "PlannedBackend", "Planner", "Route",
    "Sample", "Signature", "TensorSpec", "default_planner", "register_implementation", "register_kernel_backend",
    "signature_of",
]
