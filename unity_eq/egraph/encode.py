"""Encode a Graph into egglog program text for one mesh (no rules: those come from the rule files).

One ``let`` per tensor (so shared subterms stay shared), the global shape, dtype and replicated placement of
every original tensor, the mesh axes, the floating dtypes (``float-dtype``), and the literal-keyed facts the
guards need (``reshape-map``, ``reduce-map``), which the op families name (unity_eq/egraph/typed_nodes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.egraph.typed_nodes import guard_facts, typed_values, used_outputs
from unity_eq.ir import Graph, Mesh, Node
from unity_eq.ops.dtypes import FLOAT_DTYPES
from unity_eq.ops.registry import spec_for
from unity_eq.ops.spec import OpSpec

__all__ = ["MAX_RANK", "Encoding", "encode"]


#: The highest tensor rank the analyses enumerate dims for (verify/_guards.py bounds its search with it too).
MAX_RANK = 8


@dataclass
class Encoding:
    """The egglog program for one graph on one mesh, and what is needed to read the result back."""

    program: str
    mesh: Mesh
    tensor_ids: dict[str, int]  # ONNX tensor name -> id in (Tensor id)
    opaque_nodes: dict[str, Node]  # Opaque key -> the IR node
    typed_nodes: int
    opaque_count: int

    @property
    def tensor_names(self) -> dict[int, str]:
        return {i: name for name, i in self.tensor_ids.items()}


def _egg_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _egg_float(value: float) -> str:
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


def _egg_ivec(values: tuple[int, ...] | list[int]) -> str:
    return f"(vec-of {' '.join(str(int(v)) for v in values)})" if len(values) else "(vec-empty)"


def _egg_fact(fact: tuple[Any, ...]) -> str:
    """A family's guard fact (name, then ints and int tuples) as egglog text."""
    name, *args = fact
    return f"({name} {' '.join(_egg_ivec(a) if isinstance(a, tuple | list) else str(int(a)) for a in args)})"


#: constants of at most this many elements are read for the ``nonzero-values`` fact (a scale such as sqrt(d)
#: is one); weights are never scanned
NONZERO_SCAN_ELEMENTS = 16


def has_nonzero_values(graph: Graph, name: str) -> bool:
    """Whether the initializer ``name`` is a small float constant whose elements are all finite and non-zero:
    the fact ``(nonzero-values x)`` that lets a rule divide by it (rules/analysis.egg). An initializer whose
    bytes are absent (``missing_weights``) has no known values."""
    if name in graph.missing_weights:
        return False
    array = graph.initializers[name]
    if str(array.dtype) not in FLOAT_DTYPES or array.size > NONZERO_SCAN_ELEMENTS or array.size == 0:
        return False
    values = np.asarray(array).astype(np.float64)
    return bool(np.all(np.isfinite(values)) and np.all(values != 0))


class _ProgramWriter:
    """Accumulates the egglog text of an encoding; one `let` per tensor keeps the DAG shared."""

    def __init__(self, graph: Graph, mesh: Mesh) -> None:
        self.graph = graph
        self.mesh = mesh
        self.lines: list[str] = []
        self.vars: dict[str, str] = {}
        self.tensor_ids: dict[str, int] = {}
        self.facts: set[str] = set()
        self._weight_ranks: dict[str, int] | None = None

    def var(self, name: str | None) -> str:
        """The term of a tensor; an initializer becomes a Weight leaf the first time it is read."""
        if name is None:
            return "(NoneT)"
        if name not in self.vars and name in self.graph.initializers:
            self.define(name, f"(Weight {_egg_string(name)})")
            rank = self.weight_rank(name)
            self.lines.append(f"(merge-operand {self.vars[name]} {rank} {rank})")
            if has_nonzero_values(self.graph, name):
                self.lines.append(f"(nonzero-values {self.vars[name]})")
        return self.vars[name]

    def weight_rank(self, name: str) -> int:
        """The initializer's position in the model: the order in which merges concatenate weights."""
        if self._weight_ranks is None:
            self._weight_ranks = {w: i for i, w in enumerate(self.graph.initializers)}
        return self._weight_ranks[name]

    def define(self, name: str, term: str) -> None:
        """Name a tensor ``(Tensor id)`` and state its shape, dtype and (replicated) placement.

        Naming by one constructor keeps the DAG shared without egglog globals, which cost a table each.
        """
        ident = len(self.tensor_ids)
        var = f"(Tensor {ident})"
        self.tensor_ids[name] = ident
        self.vars[name] = var
        ttype = self.graph.types[name]
        self.lines.append(f"(union {var} {term})")
        self.lines.append(f"(set (shape {var}) {_egg_ivec(ttype.shape)})")
        self.lines.append(f"(set (dtype {var}) {_egg_string(ttype.dtype)})")
        for axis in self.mesh.axes:
            self.lines.append(f"(placed {var} {_egg_string(axis)} (R))")

    def fact(self, text: str) -> None:
        if text not in self.facts:
            self.facts.add(text)
            self.lines.append(text)

    def list_term(self, names: list[str | None]) -> str:
        term = "(TNil)"
        for name in reversed(names):
            term = f"(TCons {self.var(name)} {term})"
        return term


def _typed_term(w: _ProgramWriter, spec: OpSpec, values: dict[str, Any], index: int | None) -> str:
    parts = [spec.name]
    for arg in spec.args:
        value = values[arg.name]
        if arg.sort == "T":
            parts.append(w.var(value))
        elif arg.sort == "TList":
            parts.append(w.list_term(value))
        elif arg.sort == "IVec":
            parts.append(_egg_ivec(tuple(value or ())))
        elif arg.sort == "i64":
            parts.append(str(int(value)))
        elif arg.sort == "f64":
            parts.append(_egg_float(value))
        else:
            parts.append(_egg_string(str(value)))
    if spec.multi_output:
        parts.append(str(index))
    return "(" + " ".join(parts) + ")"


def encode(graph: Graph, mesh: Mesh) -> Encoding:
    """Write the egglog program for ``graph`` on ``mesh`` (no rules: those come from the rule files)."""
    w = _ProgramWriter(graph, mesh)
    for axis, size in zip(mesh.axes, mesh.sizes, strict=True):
        w.lines.append(f"(mesh-axis {_egg_string(axis)} {size})")
    _axes_facts(w, mesh)
    for dtype in sorted(FLOAT_DTYPES):  # guards `(float-dtype (dtype x))` restrict rules to float tensors
        w.lines.append(f"(float-dtype {_egg_string(dtype)})")
    max_rank = max((t.rank for t in graph.types.values()), default=1)
    for d in range(max(max_rank, 1)):
        w.lines.append(f"(dim-range {d})")
    for name in graph.inputs:
        w.define(name, f"(Input {_egg_string(name)})")
    used = used_outputs(graph)
    opaque: dict[str, Node] = {}
    typed = 0
    for node in graph.nodes:
        spec = spec_for(node.op_type, node.domain)
        values = typed_values(node, graph, spec, used) if spec is not None else None
        if spec is not None and values is not None:
            typed += 1
            for fact in guard_facts(node, graph, spec, values):
                w.fact(_egg_fact(fact))
            for index, out in enumerate(node.outputs):
                if out and out in used and (index == 0 or spec.multi_output):
                    w.define(out, _typed_term(w, spec, values, index))
        else:
            opaque[node.name] = node
            args = w.list_term([name or None for name in node.inputs])
            for index, out in enumerate(node.outputs):
                if out and out in used:
                    op, key = _egg_string(node.op_type), _egg_string(node.name)
                    w.define(out, f"(Opaque {op} {key} {args} {index})")
    for name in graph.outputs:
        w.var(name)
    return Encoding("\n".join(w.lines) + "\n", mesh, w.tensor_ids, opaque, typed, len(opaque))


def _axes_facts(w: _ProgramWriter, mesh: Mesh) -> None:
    axes = [_egg_string(a) for a in mesh.axes]
    for i, axis in enumerate(axes):
        others = axes[:i] + axes[i + 1 :]
        if len(axes) > 3:
            raise ValueError("meshes of more than 3 axes are not supported")
        w.lines.append(f"(axes-{len(axes)} {' '.join([axis, *others])})")
