"""How each mesh axis sits on the machine, as plan.json records it (``machine.axes``) and explain shows it.

Built from the cost model's topology (which nodes an axis's groups span, the link they use), so it sits above
``cost``; both ``lower`` (writing plan.json) and ``search`` (showing each mesh tried) use it.
"""

from __future__ import annotations

import math

from unity_eq.cost.topology import MeshTopology
from unity_eq.planfile.sections import AxisRecord

__all__ = ["axis_info"]


def axis_info(model: MeshTopology, axis: str) -> AxisRecord:
    """How an axis sits on the machine, for plan.json and explain."""
    tops = model.group_topologies(axis)
    worst = max(tops, key=lambda t: (t.m, t.k))
    link = model.axis_link(axis)
    return AxisRecord(
        name=axis,
        size=model.mesh.axis_size(axis),
        spans_nodes=worst.m > 1,
        nodes=worst.m,
        ranks_per_node=worst.k,
        link=link.name or "?",
        bandwidth_gbs=round(link.bandwidth / 1e9, 3) if math.isfinite(link.bandwidth) else None,
    )
