"""Read the serialized e-graph back: e-classes of tensors with their shape, dtype and per-axis placement, and
e-nodes with decoded literal arguments — what the extractor reads.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClassRef", "EClass", "EGraphData", "ENode", "parse_serialized"]


@dataclass(frozen=True)
class ClassRef:
    """An argument that is another e-class (a tensor or a tensor list)."""

    id: str


@dataclass(frozen=True)
class ENode:
    id: str
    op: str
    eclass: str
    args: tuple[Any, ...]  # ClassRef | int | float | str | tuple[int, ...]

    @functools.cached_property
    def children(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.args if isinstance(a, ClassRef))


@dataclass
class EClass:
    id: str
    sort: str  # "T" or "TList"
    nodes: list[ENode] = field(default_factory=list)
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    placement: dict[str, list[str]] = field(default_factory=dict)  # axis -> states found (one if valid)

    def state(self, axis: str) -> str:
        states = self.placement.get(axis, [])
        return states[0] if len(states) == 1 else "?"


@dataclass
class EGraphData:
    """The saturated e-graph as plain data: what every extractor reads."""

    classes: dict[str, EClass]
    tensor_class: dict[int, str]  # tensor id (Encoding.tensor_ids, the `Tensor` names) -> e-class

    @property
    def enode_count(self) -> int:
        return sum(len(c.nodes) for c in self.classes.values())

    def conflicts(self) -> list[str]:
        """E-classes holding two placements on one axis: a rule broke the one-placement invariant."""
        found = []
        for cls in self.classes.values():
            for axis, states in cls.placement.items():
                if len(states) > 1:
                    ops = sorted({n.op for n in cls.nodes})
                    found.append(f"e-class {cls.id} ({', '.join(ops)}) is {' and '.join(states)} on axis {axis}")
        return found


def _literal(node: dict[str, Any], sort: str, nodes: dict[str, dict[str, Any]]) -> Any:
    op = node["op"]
    if sort == "i64":
        return int(op)
    if sort == "f64":
        return float(op)
    if sort == "String":
        return json.loads(op) if op.startswith('"') else op
    if sort == "IVec":
        return tuple(int(nodes[c]["op"]) for c in node["children"])
    return op


def parse_serialized(serialized: dict[str, Any]) -> EGraphData:
    """Decode egglog's JSON serialization into EGraphData."""
    nodes: dict[str, dict[str, Any]] = serialized["nodes"]
    class_sort = {cid: data["type"] for cid, data in serialized["class_data"].items()}
    classes: dict[str, EClass] = {}
    tensor_class: dict[int, str] = {}

    def arg_of(child_id: str) -> Any:
        child = nodes[child_id]
        sort = class_sort.get(child["eclass"], "")
        if sort in ("T", "TList"):
            return ClassRef(child["eclass"])
        return _literal(child, sort, nodes)

    def state_of(pl_id: str) -> str:
        pl = nodes[pl_id]
        return f"S({int(nodes[pl['children'][0]]['op'])})" if pl["op"] == "S" else pl["op"]

    primitive = {n["eclass"]: n for nid, n in nodes.items() if nid.startswith("primitive-")}
    analyses = []
    for node_id, node in nodes.items():
        sort = class_sort.get(node["eclass"], "")
        if sort in ("T", "TList"):
            cls = classes.setdefault(node["eclass"], EClass(node["eclass"], sort))
            if node["op"] == "Tensor":
                tensor_class[int(nodes[node["children"][0]]["op"])] = node["eclass"]
                continue
            args = tuple(arg_of(c) for c in node["children"])
            cls.nodes.append(ENode(node_id, node["op"], node["eclass"], args))
        elif node["op"] in ("shape", "dtype", "placed"):
            analyses.append(node)
    for node in analyses:
        owner = classes.get(nodes[node["children"][0]]["eclass"])
        if owner is None:
            continue
        if node["op"] == "shape":
            owner.shape = tuple(int(nodes[c]["op"]) for c in primitive[node["eclass"]]["children"])
        elif node["op"] == "dtype":
            owner.dtype = json.loads(primitive[node["eclass"]]["op"])
        elif node["op"] == "placed":
            axis = json.loads(nodes[node["children"][1]]["op"])
            state = state_of(node["children"][2])
            states = owner.placement.setdefault(axis, [])
            if state not in states:
                states.append(state)
    return EGraphData(classes, tensor_class)
