"""Folding to a fixpoint (step 4 of :mod:`unity_eq.frontends.onnx`): canonical forms (``Dropout`` →
``Identity``, ``Sum`` → ``Add`` chain), onnx's shape inference, constant folding into initializers; then
what no output needs is pruned and the nodes sorted (step 5's graph structure).

Separate from building the IR: this rewrites the :class:`~unity_eq.frontends.onnx_normalize.Work` until
nothing changes and hands back the static type of every tensor.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from unity_eq.dtypes import is_float
from unity_eq.errors import ModelError
from unity_eq.frontends.onnx_normalize import MIN_OPSET, Work, static_type
from unity_eq.frontends.onnx_read import one_line, shape_only
from unity_eq.ir import TensorType, WeightOrigin

__all__ = ["fold_to_fixpoint", "unique_name", "used_names"]

_NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)
"""Ops whose result is random (Dropout is, in training mode; inference-mode ones become Identity first)."""
_SUBGRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


# ------------------------------------------------------------------------------------------ folding


def fold_to_fixpoint(work: Work) -> dict[str, TensorType]:
    """Alternate canonicalization, shape inference and constant folding until nothing changes.

    Returns the static types of the final graph. Each productive round removes a Sum, a Dropout or a folded
    node, so the loop ends; usually after two or three rounds (Constant nodes, then Shape of what the first
    round fixed).
    """
    while True:
        changed = _canonicalize(work)
        types = _infer_types(work)
        changed |= _fold_constants(work, types)
        if not changed:
            _prune(work)
            return types


def _infer_types(work: Work) -> dict[str, TensorType]:
    """Static types of every tensor onnx's shape inference (with data propagation) can fix."""
    try:
        inferred = onnx.shape_inference.infer_shapes(work.as_model(), data_prop=True)
    except Exception as e:  # InferenceError, or a C++ error for an op whose inference fails
        raise ModelError(f"{work.where}: shape inference failed: {one_line(e)}. Check the model.") from e
    g = inferred.graph
    types = {v.name: t for v in (*g.input, *g.value_info, *g.output) if (t := static_type(v.type))}
    for name, array in work.consts.items():
        types[name] = TensorType(tuple(int(d) for d in array.shape), array.dtype.name)
    return types


def _fold_constants(work: Work, types: Mapping[str, TensorType]) -> bool:
    """Replace every node whose result is known now by initializers; True if any node was folded."""
    kept = []
    for node in work.nodes:
        absent = [name for name in node.input if name in work.missing]
        if absent and node.op_type not in ("Shape", "Size"):
            values = _shape_only_outputs(node, work.consts, types)
            for name in node.output if values is not None else ():
                if name:
                    work.missing[name] = f"folded from {absent[0]!r}, whose data is missing: {work.missing[absent[0]]}"
        else:
            values = _constant_outputs(node, work.consts, types, work.opsets.get("", MIN_OPSET))
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values, strict=False):
            if name:
                work.consts[name] = value
                work.origins[name] = folded_origin(node, work.origins, value)
    changed = len(kept) != len(work.nodes)
    work.nodes = kept
    return changed


def folded_origin(node: onnx.NodeProto, origins: Mapping[str, WeightOrigin], value: np.ndarray) -> WeightOrigin:
    """The origin of an output of ``node`` folded into an initializer: made of the parameters its inputs are
    made of (``folded``, the ops on the way recorded), or a constant when none flows in or the value is not a
    float tensor (an index, a shape, a mask): no gradient reaches a parameter through it."""
    inputs = [origins.get(name, WeightOrigin.constant()) for name in node.input if name]
    ops = (*dict.fromkeys(op for o in inputs for op in o.ops), node.op_type)
    sources = tuple(sorted({s for o in inputs if o.trainable for s in o.sources}))
    if not sources or not is_float(value.dtype):
        return WeightOrigin.constant(ops)
    return WeightOrigin("folded", sources, ops)


def _constant_outputs(
    node: onnx.NodeProto, consts: Mapping[str, np.ndarray], types: Mapping[str, TensorType], opset: int
) -> list[np.ndarray] | None:
    """The outputs of ``node`` if they are known before running the model, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
        return None
    if any(a.type in _SUBGRAPH_ATTRS for a in node.attribute):
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] in types:
        shape = types[node.input[0]].shape
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [np.array(shape[attrs.get("start", 0) : attrs.get("end", len(shape))], dtype=np.int64)]
    if not all(name in consts for name in node.input if name):
        return None
    feeds = {name: consts[name] for name in node.input if name}
    try:
        results = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
    except Exception:  # an op the reference runtime lacks stays in the graph; folding is only an optimization
        return None
    if not all(isinstance(r, (np.ndarray, np.generic)) for r in results):
        return None  # sequences, optionals, sparse tensors: not an initializer
    return [np.asarray(r) for r in results]


def _shape_only_outputs(
    node: onnx.NodeProto, consts: Mapping[str, np.ndarray], types: Mapping[str, TensorType]
) -> list[np.ndarray] | None:
    """The outputs of a node that reads a constant whose data is missing, as shape-only arrays: folded as
    :func:`_constant_outputs` would fold it (so the plan is the plan of the model with its weights), with
    the shapes and dtypes shape inference gave. None when it would not fold or an output's type is unknown."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
        return None
    if any(a.type in _SUBGRAPH_ATTRS for a in node.attribute):
        return None
    if not all(name in consts for name in node.input if name):
        return None
    if not all(name in types for name in node.output if name):
        return None
    empty = np.zeros((), np.float32)  # an unused optional output: never stored (see _fold_constants)
    return [shape_only(np.dtype(types[n].dtype), types[n].shape) if n else empty for n in node.output]


# ------------------------------------------------------------------------------------------ canonical forms


def _canonicalize(work: Work) -> bool:
    """Rewrite ops that have a simpler standard equivalent, so rules need not cover them; True if any did."""
    used = used_names(work)
    taken = used | {o for n in work.nodes for o in n.output} | set(work.consts)
    rewritten: list[onnx.NodeProto] = []
    changed = False
    for node in work.nodes:
        replacement = None
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "Dropout" and _is_inference_dropout(node, work, used):
            replacement = [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)]
        elif standard and node.op_type == "Sum":
            replacement = _sum_as_adds(node, taken)
        changed |= replacement is not None
        rewritten.extend(replacement if replacement is not None else [node])
    work.nodes = rewritten
    return changed


def _is_inference_dropout(node: onnx.NodeProto, work: Work, used: set[str]) -> bool:
    """Dropout is the identity when not training (``training_mode`` absent or constant false).

    Only then, and when no one reads the mask, may it become an Identity.
    """
    mask_used = len(node.output) > 1 and node.output[1] in used
    training = node.input[2] if len(node.input) > 2 else ""
    if not training:
        return not mask_used
    return not mask_used and training in work.consts and not bool(work.consts[training])


def _sum_as_adds(node: onnx.NodeProto, taken: set[str]) -> list[onnx.NodeProto]:
    """``Sum(a, b, c) -> y`` as ``Add(Add(a, b), c) -> y``; one input is an Identity."""
    inputs, out = list(node.input), node.output[0]
    if len(inputs) == 1:
        return [helper.make_node("Identity", inputs, [out], name=node.name)]
    adds = []
    acc = inputs[0]
    for k, operand in enumerate(inputs[1:], start=1):
        last = k == len(inputs) - 1
        target = out if last else unique_name(f"{out}_sum{k}", taken)
        name = f"{node.name}_add{k}" if node.name else ""
        adds.append(helper.make_node("Add", [acc, operand], [target], name=name))
        acc = target
    return adds


# ------------------------------------------------------------------------------------------ graph structure


def _node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs and the outer-scope names its subgraphs (If, Loop, Scan) use."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            names.extend(sorted(_outer_scope_names(g)))
    return names


def _outer_scope_names(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    outer: set[str] = set()
    for node in graph.node:
        outer.update(n for n in _node_reads(node) if n not in defined)
        defined.update(node.output)
    return outer


def used_names(work: Work) -> set[str]:
    """Names read by some node or returned by the graph."""
    return {n for node in work.nodes for n in _node_reads(node)} | {o.name for o in work.outputs}


def _prune(work: Work) -> None:
    """Drop nodes and constants that no graph output depends on (model inputs always stay)."""
    work.nodes = _topological_sort(work.nodes, work.where)
    needed = {o.name for o in work.outputs}
    kept = []
    for node in reversed(work.nodes):
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(_node_reads(node))
    work.nodes = kept[::-1]
    work.consts = {n: a for n, a in work.consts.items() if n in needed}


def _topological_sort(nodes: list[onnx.NodeProto], where: str) -> list[onnx.NodeProto]:
    """Kahn's algorithm, keeping the original order wherever the dependencies allow it."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    deps = [{producer[r] for r in _node_reads(n) if r in producer} - {i} for i, n in enumerate(nodes)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    waiting = [len(ds) for ds in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i, w in enumerate(waiting) if w)
        raise ModelError(f"{where}: the graph has a cycle through node {stuck.name or stuck.op_type!r}.")
    return order


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3``… — the first not in ``taken`` (which it then joins)."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
