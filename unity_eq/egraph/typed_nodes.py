"""Which ONNX nodes the encoder writes as typed terms, and with which argument values.

A node becomes a typed term when its op has a spec (unity_eq/ops/) and every argument can be stated: inputs in
their places, constant integer lists known, no attribute the constructor does not model, no secondary output
read, its tensors of dtypes the op's type constraints allow (unity_eq/ops/dtypes.py). Its values are then made
canonical by the op's family (``OpFamily.normalize``: negative axes, implicit
defaults, shapes read off the node) so that equal computations become equal terms, and the family names the
literal-keyed facts its guards need (``OpFamily.guard_facts``). Any other node is carried opaquely: it runs as
onnxruntime runs it, on one piece of the mesh, and is never sharded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from unity_eq.ir import Graph, Node
from unity_eq.ops.dtypes import node_types_allowed
from unity_eq.ops.family import NodeView, NotModeled, OpFamily
from unity_eq.ops.registry import family_for
from unity_eq.ops.spec import OpSpec

__all__ = ["const_ints", "guard_facts", "node_view", "typed_values", "used_outputs"]


def const_ints(graph: Graph, name: str) -> tuple[int, ...] | None:
    """The value of a constant integer tensor input, or None when it is not a constant."""
    array = graph.initializers.get(name)
    if array is None or array.dtype.kind not in "iu":
        return None
    return tuple(int(v) for v in np.asarray(array).reshape(-1))


def used_outputs(graph: Graph) -> set[str]:
    """Every tensor some node or the graph's outputs read."""
    used = set(graph.outputs)
    for node in graph.nodes:
        used.update(name for name in node.inputs if name)
    return used


def node_view(node: Node, graph: Graph) -> NodeView:
    """The shapes a family's hooks may read: the node's inputs and outputs."""
    shapes = {name: graph.types[name].shape for name in node.inputs if name and name in graph.types}
    outputs = tuple(graph.types[o].shape if o and o in graph.types else None for o in node.outputs)
    return NodeView(node.op_type, shapes, outputs)


def typed_values(node: Node, graph: Graph, spec: OpSpec, used: set[str]) -> dict[str, Any] | None:
    """The typed constructor's arguments by name, canonical; None when the node must stay opaque."""
    try:
        _refuse_empty(node, graph, spec)
        view = node_view(node, graph)
        values = _collect(node, graph, spec, used)
        _check_dtypes(spec, values, graph)
        return _checked(spec, _normalize(node, spec, values, view))
    except NotModeled:
        return None


#: Ops whose verifier instances include an empty result (a Slice that selects nothing, a Split part of size 0:
#: docs/verify.md's ranges), so a node of theirs that writes an empty tensor from non-empty ones is typed.
EMPTY_RESULTS = frozenset({"Slice", "Split"})


def _refuse_empty(node: Node, graph: Graph, spec: OpSpec) -> None:
    """A node that reads a tensor with a dim of 0 (an empty KV cache), or writes one where its op's instances
    have none, stays opaque: no verifier instance has such an operand, and a rule proven without one can be
    wrong there (issue 21, the sixth adversary: ``ReduceSum(x, [d]) = x`` where dim d <= 1, and MatMul over an
    inner dim <= 1 as a Mul, both wrong at 0). Static inputs (a shape, axes) are values, not operands. Such a
    node is carried as the model has it, and runs as onnxruntime runs it."""
    inputs = [a for a in spec.args if a.kind == "input"]
    operands = [
        name
        for position, name in enumerate(node.inputs)
        if name and inputs[min(position, len(inputs) - 1)].sort in ("T", "TList")
    ]
    written = [] if spec.name in EMPTY_RESULTS else [name for name in node.outputs if name]
    for name in (*operands, *written):
        ttype = graph.types.get(name)
        if ttype is not None and any(d == 0 for d in ttype.shape):
            raise NotModeled


def _check_dtypes(spec: OpSpec, values: dict[str, Any], graph: Graph) -> None:
    """The node's tensors have dtypes the op's type constraints allow (unity_eq/ops/dtypes.py): the verifier
    proves rules for those only, so a node of any other dtype (an integer Gemm, a string Equal) stays opaque."""
    seen: dict[str, str | None] = {}
    for arg in spec.args:
        if arg.sort == "T":
            names = [values[arg.name]] if values[arg.name] else []
        elif arg.sort == "TList":
            names = list(values[arg.name])
        else:
            continue
        for name in names:
            ttype = graph.types.get(name)
            dtype = ttype.dtype if ttype is not None else None
            if not node_types_allowed(spec.name, {arg.name: dtype}):
                raise NotModeled
            seen.setdefault(arg.name, dtype)
            if seen[arg.name] != dtype:
                raise NotModeled  # a list's tensors of different dtypes
    if not node_types_allowed(spec.name, seen):
        raise NotModeled


def _collect(node: Node, graph: Graph, spec: OpSpec, used: set[str]) -> dict[str, Any]:
    """Collect a typed node's arguments by name (inputs and attributes), defaults filled in."""
    implied = _family(spec).implied_attrs.get(spec.name, frozenset())
    if set(node.attrs) - {a.name for a in spec.args if a.kind == "attr"} - implied:
        raise NotModeled  # an attribute we do not model
    if not spec.multi_output and any(out in used for out in node.outputs[1:]):
        raise NotModeled  # a secondary output (MaxPool indices, LayerNorm mean…) is used
    inputs = [a for a in spec.args if a.kind == "input"]
    if inputs and inputs[-1].sort != "TList" and len(node.inputs) > len(inputs):
        raise NotModeled
    values: dict[str, Any] = {}
    for position, arg in enumerate(inputs):
        if arg.sort == "TList":
            values[arg.name] = [name for name in node.inputs if name]
            continue
        name = node.inputs[position] if position < len(node.inputs) else ""
        if arg.sort == "T":
            if not name and not arg.optional:
                raise NotModeled
            values[arg.name] = name or None
        else:  # a constant integer list given as an input
            if not name:
                values[arg.name] = None
                continue
            const = const_ints(graph, name)
            if const is None:
                raise NotModeled
            values[arg.name] = const
    for arg in spec.args:
        if arg.kind == "attr":
            values[arg.name] = node.attrs.get(arg.name, arg.default)
    return values


def _checked(spec: OpSpec, v: dict[str, Any]) -> dict[str, Any]:
    """Every attribute present and every float finite (else onnxruntime, not us, says what is wrong)."""
    for arg in spec.args:
        if arg.kind == "attr" and v[arg.name] is None:
            raise NotModeled  # required attribute missing: let onnxruntime complain, not us
        if arg.sort == "f64" and not math.isfinite(float(v[arg.name])):
            raise NotModeled
    return v


def _normalize(node: Node, spec: OpSpec, v: dict[str, Any], view: NodeView) -> dict[str, Any]:
    """The family's normalization (a family without one has nothing implicit to make explicit)."""
    family = _family(spec)
    return family.normalize(spec.name, v, view) if family.normalize else v


def guard_facts(node: Node, graph: Graph, spec: OpSpec, values: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Literal-keyed facts for guards egglog cannot compute itself (see analysis.egg), as tuples: the fact's
    name, then ints and int tuples."""
    family = _family(spec)
    if family.guard_facts is not None:
        yield from family.guard_facts(spec.name, values, node_view(node, graph))


def _family(spec: OpSpec) -> OpFamily:
    """The family of a typed op (every op in the registry has one: the registry builds both together)."""
    family = family_for(spec.name)
    if family is None:
        raise KeyError(f"{spec.name}: typed in OPS without an op family in unity_eq/ops/registry.py")
    return family
