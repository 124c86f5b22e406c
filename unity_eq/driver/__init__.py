"""The optimize driver: one checked request (:class:`OptimizeRequest`), then the search it names.

``build_request`` checks the options once (the CLI and the API both build one); ``plan_spmd`` runs the SPMD
search (unity_eq.search), ``optimize_pipeline`` the stage search alone (unity_eq.stages, pipeline
parallelism), ``optimize_training`` both on a training step, keeping the cheaper. Each pass of a driver is
a function returning an immutable result, and the plan's report is assembled once (``finished_plan``).
"""

from __future__ import annotations

from unity_eq.driver.request import OptimizeRequest, Planner, build_request, load_rules, machine_for
from unity_eq.driver.spmd import OptimizeResult, optimize, plan_spmd, write_spmd
from unity_eq.driver.staged import lower_stages, optimize_pipeline
from unity_eq.driver.training import TrainingResult, optimize_training, spmd_step_s

__all__ = [
    "OptimizeRequest",
    "OptimizeResult",
    "Planner",
    "TrainingResult",
    "build_request",
    "load_rules",
    "lower_stages",
    "machine_for",
    "optimize",
    "optimize_pipeline",
    "optimize_training",
    "plan_spmd",
    "spmd_step_s",
    "write_spmd",
]
