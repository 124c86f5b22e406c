"""``unity-eq explain plan/``: what a plan does and what it costs, read from plan.json alone.

The report has the mesh and how its axes sit on the machine, the cost split (compute, communication by axis
and phase, the training overlap, memory per device), the baselines priced at optimize time (one device,
data parallel, best single-axis tensor parallel) with their ratio to the plan, the meshes the search tried,
the sharding of every op, a text picture of the parallel computation graph and notes on ops that stayed
replicated. :func:`explain` returns it as plain data (``--json`` prints that); :func:`render` makes the text.

The package: :mod:`~unity_eq.explain.explanation` (the report's records), :mod:`~unity_eq.explain.pcg` (the
PCG as text, tensor kinds, names and bytes), :mod:`~unity_eq.explain.build` (plan.json → the report) and
:mod:`~unity_eq.explain.text` (the report as text).
"""

# BASELINE_ORDER, plan_json_path and pcg_lines were public names of explain.py outside its __all__: still importable
from unity_eq.explain.build import BASELINE_ORDER as BASELINE_ORDER
from unity_eq.explain.build import explain, load_plan, reading_plan, report_of
from unity_eq.explain.build import plan_json_path as plan_json_path
from unity_eq.explain.explanation import Explanation, OpInput, OpRow, TrafficRow
from unity_eq.explain.pcg import comm_us, named, tensor_bytes
from unity_eq.explain.pcg import pcg_lines as pcg_lines
from unity_eq.explain.text import render

__all__ = [
    "Explanation",
    "OpInput",
    "OpRow",
    "TrafficRow",
    "comm_us",
    "explain",
    "load_plan",
    "named",
    "reading_plan",
    "render",
    "report_of",
    "tensor_bytes",
]
