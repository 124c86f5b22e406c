"""Which ONNX nodes the encoder writes as typed terms, and with which argument values.

A node becomes a typed term when its op has a spec (unity_eq/ops/) and every argument can be stated: inputs in
their places, constant integer lists known, no attribute the constructor does not model, no secondary output
read. Its values are then made canonical by the op's family (``OpFamily.normalize``: negative axes, implicit
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
from unity_eq.ops.family import NodeView, NotModeled
from unity_eq.ops.registry import family_for
from unity_eq.ops.spec import Family, OpSpec
from unity_eq.ops.tensors import norm_axis

__all__ = ["guard_facts", "node_view", "reshape_pairs", "typed_values", "used_outputs"]


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
        view = node_view(node, graph)
        return _checked(spec, _normalize(node, spec, _collect(node, graph, spec, used), view))
    except NotModeled:
        return None


def _collect(node: Node, graph: Graph, spec: OpSpec, used: set[str]) -> dict[str, Any]:
    """Collect a typed node's arguments by name (inputs and attributes), defaults filled in."""
    family = family_for(spec.name)
    implied = family.implied_attrs.get(spec.name, frozenset()) if family else _IMPLIED_ATTRS.get(spec.name, set())
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
    family = family_for(spec.name)
    if family is not None:
        return family.normalize(spec.name, v, view) if family.normalize else v
    return _legacy_normalize(node, spec, v, view)


def guard_facts(node: Node, graph: Graph, spec: OpSpec, values: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Literal-keyed facts for guards egglog cannot compute itself (see analysis.egg), as tuples: the fact's
    name, then ints and int tuples."""
    family = family_for(spec.name)
    if family is not None:
        if family.guard_facts is not None:
            yield from family.guard_facts(spec.name, values, node_view(node, graph))
        return
    if spec.family is Family.RESHAPE:
        src = graph.types[values[spec.args[0].name]].shape
        dst = graph.types[node.outputs[0]].shape
        for d, d2 in reshape_pairs(src, dst):
            yield ("reshape-map", src, dst, d, d2)


# ----------------------------------------------------------------------------------------------------------
# The normalization of the families not yet moved to unity_eq/ops/ (moved family by family)

#: attributes that the normalized constructor already states (Split's sizes come from its output shapes)
_IMPLIED_ATTRS = {"Split": {"num_outputs"}}


def _legacy_normalize(node: Node, spec: OpSpec, v: dict[str, Any], view: NodeView) -> dict[str, Any]:
    """Make implicit ONNX conventions explicit so that equal computations become equal terms."""
    op = node.op_type
    out_shape = view.outputs[0] if view.outputs else None
    first = next((a.name for a in spec.args if a.kind == "input"), None)
    in_rank = view.rank(v[first]) if first and spec.args[0].sort == "T" else 0
    if op in ("Split", "Gather"):
        v["axis"] = norm_axis(v["axis"], in_rank)
    elif op == "Flatten":
        v["axis"] = int(v["axis"]) + in_rank if int(v["axis"]) < 0 else int(v["axis"])
    elif op == "Concat":
        v["axis"] = norm_axis(v["axis"], view.rank(v["inputs"][0]))
    elif op == "Transpose":
        v["perm"] = tuple(v["perm"]) if v["perm"] else tuple(reversed(range(in_rank)))
    elif op in ("Reshape", "Expand"):
        if out_shape is None:
            raise NotModeled
        v["shape"] = out_shape
        if op == "Reshape":
            v["allowzero"] = 0
    elif op == "Squeeze":
        shape = view.shape(v["data"])
        axes = v["axes"] if v["axes"] else tuple(i for i, n in enumerate(shape) if n == 1)
        v["axes"] = tuple(sorted(norm_axis(a, in_rank) for a in axes))
    elif op == "Unsqueeze":
        out_rank = in_rank + len(v["axes"])
        v["axes"] = tuple(sorted(norm_axis(a, out_rank) for a in v["axes"]))
    elif op == "Slice":
        v.update(_normalize_slice(view.shape(v["data"]), v))
    if op == "Split":  # the sizes, whether given, implied by `num_outputs` or by the number of outputs
        if any(shape is None for shape in view.outputs):
            raise NotModeled
        v["split"] = tuple(shape[v["axis"]] for shape in view.outputs if shape is not None)
    return v


def _normalize_slice(shape: tuple[int, ...], v: dict[str, Any]) -> dict[str, Any]:
    starts, ends = list(v["starts"]), list(v["ends"])
    axes = list(v["axes"]) if v["axes"] else list(range(len(starts)))
    steps = list(v["steps"]) if v["steps"] else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(s <= 0 for s in steps):
        raise NotModeled
    axes = [norm_axis(a, len(shape)) for a in axes]
    norm_starts, norm_ends = [], []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        begin, stop, _ = slice(start, end, step).indices(shape[axis])
        norm_starts.append(begin)
        norm_ends.append(max(stop, begin))
    return {
        "starts": tuple(norm_starts),
        "ends": tuple(norm_ends),
        "axes": tuple(axes),
        "steps": tuple(steps),
    }


def reshape_pairs(src: tuple[int, ...], dst: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Dimension pairs (d, d2) where splitting d of ``src`` equals splitting d2 of the reshaped ``dst``.

    They are the dims, both of size > 1, before which the two shapes hold the same number of elements: a
    contiguous chunking of the data at that point is the same chunking in either shape.
    """
    prefix_dst: dict[int, list[int]] = {}
    acc = 1
    for d2, n in enumerate(dst):
        if n > 1:
            prefix_dst.setdefault(acc, []).append(d2)
        acc *= n
    acc = 1
    for d, n in enumerate(src):
        if n > 1:
            for d2 in prefix_dst.get(acc, [])[:1]:
                yield d, d2
        acc *= n
