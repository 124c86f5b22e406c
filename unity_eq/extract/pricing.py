"""Pricing e-nodes: every e-node's cost on its local (per-device) shapes under a cost model.

Also what pricing needs to know about e-classes: their local shapes, where their values come from (a weight,
a model input or an activation), and the names of the values they hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping

import numpy as np

from unity_eq.collectives import TERMS, by_term
from unity_eq.cost import ZERO, Cost, CostModel, OpInstance
from unity_eq.dtypes import is_float
from unity_eq.egraph import ClassRef, EClass, EGraphData, ENode
from unity_eq.ir import Partial, Placement, Replicate, Shard
from unity_eq.ops.registry import family_for, spec_for

INF = math.inf


def reachable(roots: Iterable[str], children: Callable[[str], Iterable[str]]) -> list[str]:
    """The e-classes reachable from ``roots`` through ``children`` (which nodes of a class count is the
    caller's: the chosen one, the finite-cost ones), each once, in depth-first discovery order: the order the
    ILP numbers its columns in, so it is part of the plan that comes out."""
    seen: set[str] = set()
    order: list[str] = []
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid not in seen:
            seen.add(cid)
            order.append(cid)
            stack.extend(children(cid))
    return order


#: the e-graph's parallel constructors (one per collective kind with a term: unity_eq.collectives)
PARALLEL_OPS = frozenset(TERMS)


LEAVES = {"Input", "Weight", "NoneT"}


def placement_of(state: str) -> Placement:
    if state.startswith("S("):
        return Shard(int(state[2:-1]))
    if state == "P":
        return Partial()
    return Replicate()


def local_shape(cls: EClass, model: CostModel) -> tuple[int, ...] | None:
    if cls.shape is None:
        return None
    shape = list(cls.shape)
    for axis, size in zip(model.mesh.axes, model.mesh.sizes, strict=True):
        state = cls.state(axis)
        if state == "?":
            return None
        if state.startswith("S("):
            d = int(state[2:-1])
            if d >= len(shape) or shape[d] % size:
                return None
            shape[d] //= size
    return tuple(shape)


def local_shapes(data: EGraphData, model: CostModel) -> dict[str, tuple[int, ...] | None]:
    """Every tensor class's :func:`local_shape` on ``model``'s mesh, by class id: the one table the pricing,
    the extractor and the profiler's op instances each build."""
    return {cid: local_shape(c, model) for cid, c in data.classes.items() if c.sort == "T"}


def itemsize(dtype: str | None) -> int:
    if dtype in (None, "none"):
        return 0
    return int(np.dtype(dtype).itemsize)


#: the kinds of stored tensors that are not activations: a trainable weight, a constant (a weight that is not
#: trainable: ``ir.WeightOrigin``), a model input
WEIGHT_KINDS = ("weight", "constant")


def source_kinds(data: EGraphData, constants: Collection[str] = frozenset()) -> dict[str, str]:
    """'input', 'weight' (trainable) or 'constant' (a weight of ``constants``: ``Graph.constants()``) for
    e-classes that are a model input or weight, maybe sliced or replicated, or data layout of weights alone;
    'nograd' for an integer or bool activation, 'activation' for the rest. Training prices gradients by it:
    a constant has none (no gradient all-reduce, no optimizer state), nor has a 'nograd' activation (no
    gradient collective)."""
    kinds: dict[str, str] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            if node.op == "Input":
                kinds[cls.id] = "input"
            elif node.op == "NoneT" or (node.op == "Weight" and str(node.args[0]) not in constants):
                kinds[cls.id] = "weight"
            elif node.op == "Weight":
                kinds[cls.id] = "constant"
    changed = True
    while changed:
        changed = False
        for cls in data.classes.values():
            if cls.id in kinds:
                continue
            for node in cls.nodes:
                if node.op in PARALLEL_OPS and node.children and node.children[0] in kinds:
                    kinds[cls.id] = kinds[node.children[0]]
                    changed = True
                    break
                if foldable(node.op) and _all_weights(node, data, kinds):
                    # data movement over weights only: folded at lowering; trainable when a weight is in it
                    members = _members(node, data) or []
                    kinds[cls.id] = "weight" if any(kinds.get(m) == "weight" for m in members) else "constant"
                    changed = True
                    break
    for cls in data.classes.values():  # what no gradient flows through: an integer or bool activation
        if cls.id not in kinds and cls.sort == "T" and not floating_dtype(cls.dtype):
            kinds[cls.id] = "nograd"
    return kinds


def floating_dtype(dtype: str | None) -> bool:
    """Whether a tensor of ``dtype`` can carry a gradient (unknown or absent: assumed so)."""
    return dtype in (None, "none") or is_float(dtype)


def foldable(op: str) -> bool:
    """A data-movement op that lowering evaluates at lowering time when every tensor operand is a weight (the
    generated rules slice and concatenate weights: Split(W), Concat(W1, W2)); it costs nothing at run time."""
    spec = spec_for(op)
    return spec is not None and spec.foldable


def _members(node: ENode, data: EGraphData) -> list[str] | None:
    """The tensor classes ``node`` reads, its list operands' members included (None: a list without members)."""
    members: list[str] = []
    for child in node.children:
        if data.classes[child].sort == "TList":
            items = list_members(child, data)
            if items is None:
                return None
            members.extend(items)
        else:
            members.append(child)
    return members


def _all_weights(node: ENode, data: EGraphData, kinds: dict[str, str]) -> bool:
    members = _members(node, data)
    return members is not None and bool(members) and all(kinds.get(m) in WEIGHT_KINDS for m in members)


def as_costs(totals: Mapping[str, float]) -> dict[str, Cost]:
    """Seconds per e-node as Costs (what the ILP reads), for totals that carry restrictions and penalties."""
    return {k: Cost(compute=v) for k, v in totals.items()}


def derives_from(data: EGraphData, cid: str, source: str | None) -> bool:
    """Whether e-class ``cid`` is ``source`` under parallel ops only (a slice or replica of it)."""
    seen: set[str] = set()
    while source is not None and cid not in seen:
        if cid == source:
            return True
        seen.add(cid)
        node = next((n for n in data.classes[cid].nodes if n.op in PARALLEL_OPS and n.children), None)
        if node is None:
            return False
        cid = node.children[0]
    return False


def value_names(data: EGraphData, original: dict[str, str]) -> dict[str, str]:
    """Name every e-class after the original tensor whose global value it holds: parallel ops keep the global
    value, so a name flows across them in both directions (a sharded core gets the name of what it computes)."""
    names = dict(original)
    edges: list[tuple[str, str]] = []
    for cls in data.classes.values():
        for node in cls.nodes:
            if node.op in PARALLEL_OPS and node.children:
                edges.append((cls.id, node.children[0]))
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            if a in names and b not in names:
                names[b] = names[a]
                changed = True
            elif b in names and a not in names:
                names[a] = names[b]
                changed = True
    return names


def node_costs(
    data: EGraphData,
    model: CostModel,
    locals_: dict[str, tuple[int, ...] | None] | None = None,
    kinds: dict[str, str] | None = None,
) -> dict[str, Cost]:
    """Price every e-node of a tensor class (INF compute for nodes that cannot be lowered). ``locals_`` (local
    shapes) and ``kinds`` (source kinds) are computed when not given."""
    if locals_ is None:
        locals_ = local_shapes(data, model)
    if kinds is None:
        kinds = source_kinds(data)
    costs: dict[str, Cost] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            costs[node.id] = _price(node, cls, data, model, locals_, kinds)
    return costs


def class_bytes(cid: str, data: EGraphData, locals_: Mapping[str, tuple[int, ...] | None]) -> float:
    shape = locals_.get(cid)
    return 0.0 if shape is None else math.prod(shape) * itemsize(data.classes[cid].dtype)


def list_members(cid: str, data: EGraphData) -> list[str] | None:
    """Tensor classes of an explicit TCons/TNil list class (None when it has only PList forms)."""
    members: list[str] = []
    seen = set()
    while cid not in seen:
        seen.add(cid)
        cls = data.classes[cid]
        nil = next((n for n in cls.nodes if n.op == "TNil"), None)
        if nil is not None:
            return members
        cons = next((n for n in cls.nodes if n.op == "TCons"), None)
        if cons is None:
            return None
        members.append(cons.args[0].id)
        cid = cons.args[1].id
    return None


def _price(
    node: ENode,
    cls: EClass,
    data: EGraphData,
    model: CostModel,
    locals_: dict[str, tuple[int, ...] | None],
    kinds: dict[str, str],
) -> Cost:
    infinite = Cost(compute=INF)
    if cls.sort == "TList":
        return infinite if node.op == "PList" else ZERO
    out_shape = locals_.get(cls.id)
    if out_shape is None:
        return infinite
    if node.op in LEAVES:
        return ZERO
    if foldable(node.op) and kinds.get(cls.id) in WEIGHT_KINDS and _all_weights(node, data, kinds):
        return ZERO  # folded into an initializer at lowering time
    kind = by_term(node.op)
    if kind is not None:  # a collective: its kind prices it on its source's and result's local bytes
        src = node.args[0].id
        if locals_.get(src) is None:
            return infinite
        source_bytes, result_bytes = class_bytes(src, data, locals_), class_bytes(cls.id, data, locals_)
        return kind.price(model, node.args[-1], source_bytes, result_bytes, kinds.get(src, "activation"))
    instance = enode_instance(node, cls, data, locals_)
    return infinite if instance is None else model.compute(instance)


def enode_instance(
    node: ENode, cls: EClass, data: EGraphData, locals_: Mapping[str, tuple[int, ...] | None]
) -> OpInstance | None:
    """A compute e-node on its local shapes (None when one of them is unknown: it cannot be priced); an absent
    optional operand is None in its position (a scalar fill and an absent mask are told apart), trailing ones
    left out."""
    out_shape = locals_.get(cls.id)
    if out_shape is None:
        return None
    in_shapes: list[tuple[int, ...] | None] = []
    in_bytes = 0.0
    for arg in node.args:
        if not isinstance(arg, ClassRef):
            continue
        child = data.classes[arg.id]
        members = [arg.id] if child.sort == "T" else list_members(arg.id, data)
        if members is None:
            return None
        for member in members:
            if data.classes[member].dtype == "none":  # an absent optional input (NoneT): no operand
                in_shapes.append(None)
                continue
            if locals_.get(member) is None:
                return None
            in_shapes.append(locals_[member])
            in_bytes += class_bytes(member, data, locals_)
    op = node.args[0] if node.op == "Opaque" else node.op
    spec = spec_for(node.op)
    sizes = spec.output_sizes_in(node.args) if spec is not None else None
    outputs = len(sizes) if sizes else 1
    out_bytes = class_bytes(cls.id, data, locals_)
    family = family_for(node.op)
    attrs = tuple((n, node.args[spec.arg_index(n)]) for n in family.priced_attrs) if family and spec else ()
    return OpInstance(str(op), tuple(in_shapes), in_bytes, tuple(out_shape), out_bytes, cls.dtype or "", outputs, attrs)


CostTable = Mapping[str, Cost] | Mapping[str, float]


def seconds_of(cost: Cost | float) -> float:
    return cost.total if isinstance(cost, Cost) else float(cost)


def totals_of(costs: CostTable) -> dict[str, float]:
    return {k: seconds_of(v) for k, v in costs.items()}
