"""Integer inputs that a model accepts: ranges found by interval propagation through the graph.

``unity-eq check`` feeds random inputs to the original model and to the plan. An integer input that ends up,
through any chain of integer ops, as the indices of a ``Gather`` (an embedding lookup, a position table) must
stay in range, or the *original* model fails. An OPT-style attention mask, for example, reaches the position
embedding's ``Gather`` through ``CumSum → Mul → Sub → Add``; only 0/1 values keep it in range.

The mechanism: give every integer input a list of candidate ranges (widest first: the sizes of the tables it
reaches, 0-9, 0/1, 0), propagate intervals forward through the graph (:func:`propagate`), find every index site
whose interval leaves the table, and narrow the widest input that reaches a violated site, until every site is
in range. Ops without a rule give an unknown interval: a site reached only through them is not constrained
(nothing is claimed about it). Inputs whose name says ``mask`` start at 0/1.

Indices that depend on no model input at all (a BERT export's ``GatherND`` over a constant index table) are
no interval but values: they are computed (:func:`fixed_sites_checked`) and checked coordinate by coordinate,
and no input is narrowed for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from unity_eq.errors import ModelError, OptionError
from unity_eq.ir import Graph, Node

__all__ = ["IndexSite", "integer_input_ranges", "propagate"]

Interval = tuple[float, float]

#: Ops whose output holds values of (some of) their inputs: the union of the listed inputs' intervals.
_PASS_THROUGH: dict[str, tuple[int, ...]] = {
    "Identity": (0,),
    "Cast": (0,),
    "Reshape": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Flatten": (0,),
    "Transpose": (0,),
    "Expand": (0,),
    "Slice": (0,),
    "Tile": (0,),
    "Gather": (0,),
    "GatherElements": (0,),
    "GatherND": (0,),
    "Split": (0,),
    "Where": (1, 2),
    "ReduceMax": (0,),
    "ReduceMin": (0,),
}
_BOOLEAN = frozenset(
    {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}
)
#: Ops that read integer indices into one of their inputs: (indices input, data input).
_INDEXING: dict[str, tuple[int, int]] = {
    "Gather": (1, 0),
    "GatherElements": (1, 0),
    "GatherND": (1, 0),
    "ScatterElements": (1, 0),
    "ScatterND": (1, 0),
}


@dataclass(frozen=True)
class IndexSite:
    """Integer values that must lie in ``[low, high]``: the indices of one indexing node."""

    node: str
    op_type: str
    tensor: str
    low: int
    high: int


def index_sites(graph: Graph) -> list[IndexSite]:
    """Every indexing node's indices with the range its data allows (negative indices count from the end)."""
    sites = []
    for node in graph.nodes:
        if node.op_type not in _INDEXING or node.domain:
            continue
        i, d = _INDEXING[node.op_type]
        if len(node.inputs) <= max(i, d) or not node.inputs[i] or not node.inputs[d]:
            continue
        shape = graph.types[node.inputs[d]].shape
        if not shape:
            continue
        if node.op_type == "GatherND":
            batch = int(node.attrs.get("batch_dims", 0))
            size = min(shape[batch:]) if shape[batch:] else 1
        else:
            axis = int(node.attrs.get("axis", 0))
            size = shape[axis]
        sites.append(IndexSite(node.name or node.op_type, node.op_type, node.inputs[i], -size, size - 1))
    return sites


def _range_of(array: np.ndarray) -> Interval | None:
    if array.size == 0 or array.dtype.kind not in "iufb":
        return None
    values = array.astype(np.float64)
    if not np.isfinite(values).all():
        return None
    return float(values.min()), float(values.max())


def _union(intervals: list[Interval | None]) -> Interval | None:
    if not intervals or any(i is None for i in intervals):
        return None
    known = [i for i in intervals if i is not None]
    return min(i[0] for i in known), max(i[1] for i in known)


def _mul(a: Interval, b: Interval) -> Interval:
    corners = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(corners), max(corners)


def _accumulate(a: Interval, count: int) -> Interval:
    """Sums of up to ``count`` values of ``a`` (CumSum, ReduceSum)."""
    return min(a[0], a[0] * count, 0.0 if a[0] >= 0 else a[0] * count), max(a[1], a[1] * count)


def _node_intervals(node: Node, get: dict[str, Interval | None], graph: Graph) -> list[Interval | None]:
    """The output intervals of one node from its inputs' (None: unknown)."""
    ins = [get.get(name) if name else None for name in node.inputs]
    op = node.op_type
    outs = len(node.outputs)
    if node.domain:
        return [None] * outs
    if op in _BOOLEAN:
        return [(0.0, 1.0)] * outs
    if op in ("Shape", "Size"):
        shape = graph.types[node.inputs[0]].shape
        high = math.prod(shape) if op == "Size" else max(shape, default=0)
        return [(0.0, float(high))]
    if op == "Constant":
        value = node.attrs.get("value")
        return [_range_of(numpy_helper.to_array(value)) if isinstance(value, onnx.TensorProto) else None]
    if op == "ConstantOfShape":
        value = node.attrs.get("value")
        return [_range_of(numpy_helper.to_array(value)) if isinstance(value, onnx.TensorProto) else (0.0, 0.0)]
    if op in ("ArgMax", "ArgMin", "NonZero"):
        shape = graph.types[node.inputs[0]].shape
        return [(0.0, float(max(shape, default=1) - 1))] * outs
    if op == "TopK":
        shape = graph.types[node.inputs[0]].shape
        axis = int(node.attrs.get("axis", -1))
        return [ins[0], (0.0, float(shape[axis] - 1)) if shape else None]
    if op == "Concat":
        return [_union(ins)]
    if op in _PASS_THROUGH:
        return [_union([ins[i] if i < len(ins) else None for i in _PASS_THROUGH[op]])] * outs
    return [_arithmetic(op, node, ins, graph)] + [None] * (outs - 1)


def _arithmetic(op: str, node: Node, ins: list[Interval | None], graph: Graph) -> Interval | None:
    a = ins[0]
    b = ins[1] if len(ins) > 1 else None
    if op == "Add" and a and b:
        return a[0] + b[0], a[1] + b[1]
    if op == "Sub" and a and b:
        return a[0] - b[1], a[1] - b[0]
    if op == "Mul" and a and b:
        return _mul(a, b)
    if op == "Neg" and a:
        return -a[1], -a[0]
    if op == "Abs" and a:
        return (0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))), max(abs(a[0]), abs(a[1]))
    if op == "Relu" and a:
        return max(a[0], 0.0), max(a[1], 0.0)
    if op in ("Max", "Min") and all(i is not None for i in ins):
        known = [i for i in ins if i is not None]
        pick = max if op == "Max" else min
        return pick(i[0] for i in known), pick(i[1] for i in known)
    if op == "Div" and a and b and (b[0] > 0 or b[1] < 0):
        corners = [a[0] / b[0], a[0] / b[1], a[1] / b[0], a[1] / b[1]]
        return math.floor(min(corners)), math.ceil(max(corners))
    if op == "Mod" and b and b[0] > 0:
        high = b[1] - 1
        return (0.0, high) if not node.attrs.get("fmod") else (-high, high)
    if op in ("CumSum", "ReduceSum") and a:
        shape_in = graph.types[node.inputs[0]].shape
        shape_out = graph.types[node.outputs[0]].shape
        count = _cumsum_count(shape_in, ins) if op == "CumSum" else _reduced_count(shape_in, shape_out)
        return _accumulate(a, max(count, 1))
    if op == "Clip" and a:
        # min(max(x, lo), hi) with lo and hi themselves intervals (absent bounds are unbounded)
        lo = ins[1] if len(ins) > 1 and ins[1] is not None else (-math.inf, -math.inf)
        hi = ins[2] if len(ins) > 2 and ins[2] is not None else (math.inf, math.inf)
        return min(max(a[0], lo[0]), hi[0]), min(max(a[1], lo[1]), hi[1])
    if op == "Range" and ins[0] is not None and ins[1] is not None:
        return min(ins[0][0], ins[1][0]), max(ins[0][1], ins[1][1])
    return None


def _cumsum_count(shape: tuple[int, ...], ins: list[Interval | None]) -> int:
    """How many values a CumSum adds at most: the length of its axis (the longest axis when unknown)."""
    axis = ins[1] if len(ins) > 1 else None
    if axis is not None and axis[0] == axis[1] and shape:
        return shape[int(axis[0])]
    return max(shape, default=1)


def _reduced_count(shape_in: tuple[int, ...], shape_out: tuple[int, ...]) -> int:
    return max(math.prod(shape_in) // max(math.prod(shape_out), 1), 1)


def propagate(graph: Graph, ranges: Mapping[str, Interval]) -> dict[str, Interval | None]:
    """The interval of every tensor given the model inputs' ``ranges`` (None where unknown)."""
    known: dict[str, Interval | None] = {}
    for name, t in graph.inputs.items():
        kind = np.dtype(t.dtype).kind if t.dtype != "none" else ""
        known[name] = ranges.get(name) or ((0.0, 1.0) if kind == "b" else None)
    for name, array in graph.initializers.items():
        values = np.asarray(array)
        # Integer constants (shapes, offsets) matter; large float weights are not read (an unknown interval).
        known[name] = _range_of(values) if values.dtype.kind in "iub" or values.size <= 4096 else None
    for node in graph.nodes:
        for out, interval in zip(node.outputs, _node_intervals(node, known, graph), strict=False):
            if out:
                known[out] = interval
    return known


def _dependents(graph: Graph, roots: list[str]) -> dict[str, frozenset[str]]:
    """For every tensor, the integer inputs its value depends on."""
    deps: dict[str, frozenset[str]] = {name: frozenset({name}) for name in roots}
    for node in graph.nodes:
        found = frozenset().union(*(deps.get(i, frozenset()) for i in node.inputs if i))
        for out in node.outputs:
            if out:
                deps[out] = found
    return deps


def _candidates(name: str, sites: list[IndexSite], reached: list[IndexSite]) -> list[Interval]:
    """Ranges to try for one input, widest first: each table it reaches, 0-9, 0/1, 0."""
    found = {(0.0, float(s.high)) for s in reached if s.high >= 0}
    found |= {(0.0, 9.0), (0.0, 1.0), (0.0, 0.0)}
    ordered = sorted(found, key=lambda r: -r[1])
    if "mask" in name.lower():
        ordered = [r for r in ordered if r[1] <= 1]
    elif not reached:
        ordered = [r for r in ordered if r[1] <= 9]
    return ordered


def integer_input_ranges(graph: Graph, where: str = "model") -> dict[str, tuple[int, int]]:
    """An inclusive range for every integer model input that keeps every index site in range."""
    names = [n for n, t in graph.inputs.items() if t.dtype != "none" and np.dtype(t.dtype).kind in "iu"]
    if not names:
        return {}
    sites = fixed_sites_checked(graph, index_sites(graph), where)
    deps = _dependents(graph, names)
    candidates = {
        name: _candidates(name, sites, [s for s in sites if name in deps.get(s.tensor, frozenset())]) for name in names
    }
    choice = dict.fromkeys(names, 0)
    for _ in range(sum(len(c) for c in candidates.values()) + 1):
        ranges = {name: candidates[name][choice[name]] for name in names}
        intervals = propagate(graph, ranges)
        violated = [s for s in sites if _outside(intervals.get(s.tensor), s)]
        if not violated:
            return {name: (int(r[0]), int(r[1])) for name, r in ranges.items()}
        site = violated[0]
        movable = [n for n in deps.get(site.tensor, frozenset()) if choice[n] + 1 < len(candidates[n])]
        if not movable:
            raise OptionError(
                f"{where}: cannot choose random integer inputs that keep the indices of {site.op_type} node "
                f"{site.node!r} in [{site.low}, {site.high}] (they depend on {sorted(deps.get(site.tensor, []))}). "
                "Pass inputs with `--inputs`."
            )
        widest = max(movable, key=lambda n: (candidates[n][choice[n]][1] - candidates[n][choice[n]][0], n))
        choice[widest] += 1
    raise AssertionError("narrowing did not terminate")


def _outside(interval: Interval | None, site: IndexSite) -> bool:
    return interval is not None and (interval[0] < site.low or interval[1] > site.high)


#: Largest tensor (elements) computed for a site's constant indices: index tables are small; a chain through
#: a weight matrix is left alone (the site then keeps its interval check).
_FIXED_LIMIT = 1 << 20


def fixed_sites_checked(graph: Graph, sites: list[IndexSite], where: str) -> list[IndexSite]:
    """The sites whose indices depend on some model input; those that depend on none are computed here and
    checked exactly (a ModelError when the model's own constant indices leave their table: no input can fix
    that). A site whose constant indices cannot be computed here (too large, an op of another domain) stays."""
    free = _input_free(graph)
    producer = {out: node for node in graph.nodes for out in node.outputs if out}
    values: dict[str, np.ndarray | None] = {}
    kept = []
    for site in sites:
        value = _fixed_value(graph, producer, free, site.tensor, values) if site.tensor in free else None
        if value is None:
            kept.append(site)
            continue
        node = next(n for n in graph.nodes if (n.name or n.op_type) == site.node and site.tensor in n.inputs)
        bad = _fixed_outside(graph, node, value)
        if bad is not None:
            raise ModelError(
                f"{where}: the indices of {site.op_type} node {site.node!r} are constants (they depend on no "
                f"input) and leave their table: {bad}. The model fails on every input; fix or re-export it."
            )
    return kept


def _input_free(graph: Graph) -> set[str]:
    """Tensors whose values depend on no model input (a Shape or Size of anything is fixed: shapes are)."""
    free = set(graph.initializers)
    for node in graph.nodes:
        if node.domain:
            continue
        if node.op_type in ("Shape", "Size") or all(i in free for i in node.inputs if i):
            free.update(o for o in node.outputs if o)
    return free


def _fixed_value(
    graph: Graph,
    producer: Mapping[str, Node],
    free: set[str],
    tensor: str,
    values: dict[str, np.ndarray | None],
) -> np.ndarray | None:
    """The value of an input-free tensor, computed node by node with onnx's reference evaluator (memoized in
    ``values``); None when it is too large or made by a node computed here without a rule (a subgraph)."""
    if tensor in values:
        return values[tensor]
    result: np.ndarray | None = None
    if tensor in graph.initializers:
        array = np.asarray(graph.initializers[tensor])
        result = array if array.size <= _FIXED_LIMIT else None
    elif tensor in producer:
        node = producer[tensor]
        outs = _evaluate(graph, producer, free, node, values)
        for name, out in zip(node.outputs, outs, strict=False):
            values[name] = out
        result = values.get(tensor)
    values[tensor] = result
    return result


def _evaluate(
    graph: Graph, producer: Mapping[str, Node], free: set[str], node: Node, values: dict[str, np.ndarray | None]
) -> list[np.ndarray | None]:
    """One input-free node's outputs (None each when an input is unknown or the node has a subgraph)."""
    none: list[np.ndarray | None] = [None] * len(node.outputs)
    if node.op_type in ("Shape", "Size"):
        shape = graph.types[node.inputs[0]].shape
        if node.op_type == "Size":
            return [np.array(math.prod(shape), np.int64)]
        start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
        return [np.array(shape[start : None if end is None else int(end)], np.int64)]
    if any(isinstance(v, onnx.GraphProto) for v in node.attrs.values()):
        return none
    feeds = {}
    for name in node.inputs:
        if name:
            value = _fixed_value(graph, producer, free, name, values)
            if value is None:
                return none
            feeds[name] = value
    from onnx.reference import ReferenceEvaluator

    proto = onnx.helper.make_node(node.op_type, list(node.inputs), list(node.outputs), **dict(node.attrs))
    try:
        outs = ReferenceEvaluator(proto, opsets={"": graph.opset}).run(None, feeds)
    except Exception:  # as the frontend's folding (onnx_fold): an op the reference runtime lacks or gets
        return none  # wrong stays uncomputed, and its site keeps the interval check
    return [np.asarray(o) if np.asarray(o).size <= _FIXED_LIMIT else None for o in outs]


def _fixed_outside(graph: Graph, node: Node, indices: np.ndarray) -> str | None:
    """What is wrong with a node's constant indices (None when every one is in range): a GatherND's are
    checked coordinate by coordinate against the dimensions each indexes."""
    _, d = _INDEXING[node.op_type]
    shape = graph.types[node.inputs[d]].shape
    if node.op_type in ("GatherND", "ScatterND"):
        batch = int(node.attrs.get("batch_dims", 0))
        sizes = list(shape[batch : batch + indices.shape[-1]]) if indices.ndim else []
        columns = [(indices[..., k], size) for k, size in enumerate(sizes)]
    else:
        columns = [(indices, shape[int(node.attrs.get("axis", 0))])]
    for k, (column, size) in enumerate(columns):
        if column.size and (column.min() < -size or column.max() > size - 1):
            return f"coordinate {k} takes values in [{column.min()}, {column.max()}], the dimension has {size}"
    return None
