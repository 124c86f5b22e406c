"""unity-eq: decide how to run an ONNX model across many devices, with e-graphs, and prove the rules sound.

The public entry points are :func:`optimize` (model → plan directory), :func:`run_plan` (plan directory →
outputs) and :func:`check` (original vs plan on the same inputs), and the placement types. Everything else
is reachable through the module of its pass (``unity_eq.ir``, ``unity_eq.egraph``, ``unity_eq.cost`` and
``unity_eq.machine``, ``unity_eq.extract``, ``unity_eq.memory``, ``unity_eq.search``, ``unity_eq.plan``,
``unity_eq.report``, ``unity_eq.lower``, ``unity_eq.runtime``, ``unity_eq.explain``) but is not promised stable.

Every name is imported lazily so that ``import unity_eq`` (and the e-graph worker process) stays cheap: it
loads the standard library only, so the console script installs its signal handlers before numpy, typer
or onnxruntime are imported (``unity_eq.cli.entry``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

_LAZY = {
    "UnityEqError": "unity_eq.errors",
    "Partial": "unity_eq.ir",
    "Placement": "unity_eq.ir",
    "Replicate": "unity_eq.ir",
    "Shard": "unity_eq.ir",
    "__version__": "unity_eq.version",
    "optimize": "unity_eq.driver",
    "OptimizeResult": "unity_eq.driver",
    "run_plan": "unity_eq.runtime",
    "check": "unity_eq.runtime",
    "CheckResult": "unity_eq.runtime",
}

if TYPE_CHECKING:
    from unity_eq.driver import OptimizeResult, optimize
    from unity_eq.errors import UnityEqError
    from unity_eq.ir import Partial, Placement, Replicate, Shard
    from unity_eq.runtime import CheckResult, check, run_plan
    from unity_eq.version import __version__


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'unity_eq' has no attribute {name!r}")
