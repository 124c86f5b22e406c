"""unity-eq: decide how to run an ONNX model across many devices, with e-graphs, and prove the rules sound.

The public entry points are :func:`optimize` (model → plan directory), :func:`run_plan` (plan directory →
outputs) and :func:`check` (original vs plan on the same inputs), and the placement types. Everything else
is reachable through its stage module (``unity_eq.ir``, ``unity_eq.egraph``, ``unity_eq.cost``,
``unity_eq.extract``, ``unity_eq.plan``, ``unity_eq.lower``, ``unity_eq.runtime``) but is not promised stable.
"""

from __future__ import annotations

__version__ = "0.1.0"

from unity_eq.errors import UnityEqError
from unity_eq.ir import Partial, Placement, Replicate, Shard
from unity_eq.pipeline import OptimizeResult, optimize
from unity_eq.runtime import CheckResult, check, run_plan

__all__ = [
    "CheckResult",
    "OptimizeResult",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "UnityEqError",
    "__version__",
    "check",
    "optimize",
    "run_plan",
]
