"""Extraction: choose one e-node per needed e-class, minimizing the plan's cost, and build the Plan.

The extractor reads :class:`~unity_eq.egraph.EGraphData` (the serialized e-graph with shapes and placements)
and prices every e-node with the :class:`~unity_eq.cost.CostModel` on its *local* shapes. It is DAG-aware: a
subterm shared by several consumers is paid once, so the cost of choosing a node is the sum over the set of
distinct e-classes its choice pulls in (the "greedy DAG" extractor of extraction-gym). E-graphs here have
cycles (``x = Partition(Combine(x))``); a choice whose cost set contains its own e-class is a cycle and is
skipped.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unity_eq.cost import ZERO, Cost, CostModel
from unity_eq.egraph import ClassRef, EClass, EGraphData, Encoding, ENode
from unity_eq.errors import ExtractionError
from unity_eq.ir import Graph, Partial, Placement, Replicate, Shard
from unity_eq.ops import OPS, OpSpec
from unity_eq.plan import (
    AllGather,
    AllReduce,
    Compute,
    Const,
    InputRef,
    LoadInput,
    LoadWeight,
    Plan,
    PlanTensor,
    Replicated,
    Slice,
    Step,
)

__all__ = ["Extractor", "Restriction", "build_plan", "extract_greedy", "greedy_dag", "node_costs", "output_classes"]

INF = math.inf
PARALLEL_OPS = {"Partition", "Combine", "Replicate", "Reduce"}
LEAVES = {"Input", "Weight", "NoneT"}


# ----------------------------------------------------------------------------------------------------------
# Local shapes and pricing


def _placement(state: str) -> Placement:
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


def _itemsize(dtype: str | None) -> int:
    if dtype in (None, "none"):
        return 0
    return int(np.dtype(dtype).itemsize)


def source_kinds(data: EGraphData) -> dict[str, str]:
    """'input' or 'weight' for e-classes that are a model input or weight, maybe sliced or replicated;
    'activation' for the rest. Training prices gradients by it."""
    kinds: dict[str, str] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            if node.op == "Input":
                kinds[cls.id] = "input"
            elif node.op in ("Weight", "NoneT"):
                kinds[cls.id] = "weight"
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
                if node.op in FOLDABLE_OPS and _all_weights(node, data, kinds):
                    kinds[cls.id] = "weight"  # data movement over weights only: folded at lowering
                    changed = True
                    break
    return kinds


#: Data-movement ops that lowering evaluates at lowering time when every tensor operand is a weight (the
#: generated rules slice and concatenate weights: Split(W), Concat(W1, W2)); they cost nothing at run time.
FOLDABLE_OPS = frozenset({"Split", "Concat", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def _all_weights(node: ENode, data: EGraphData, kinds: dict[str, str]) -> bool:
    members: list[str] = []
    for child in node.children:
        if data.classes[child].sort == "TList":
            items = _list_members(child, data)
            if items is None:
                return False
            members.extend(items)
        else:
            members.append(child)
    return bool(members) and all(kinds.get(m) == "weight" for m in members)


def as_costs(totals: Mapping[str, float]) -> dict[str, Cost]:
    """Seconds per e-node as Costs (what the ILP reads), for totals that carry restrictions and penalties."""
    return {k: Cost(compute=v) for k, v in totals.items()}


def _derives_from(data: EGraphData, cid: str, source: str | None) -> bool:
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
        locals_ = {cid: local_shape(c, model) for cid, c in data.classes.items() if c.sort == "T"}
    if kinds is None:
        kinds = source_kinds(data)
    costs: dict[str, Cost] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            costs[node.id] = _price(node, cls, data, model, locals_, kinds)
    return costs


def _bytes(cid: str, data: EGraphData, locals_: dict[str, tuple[int, ...] | None]) -> float:
    shape = locals_.get(cid)
    return 0.0 if shape is None else math.prod(shape) * _itemsize(data.classes[cid].dtype)


def _list_members(cid: str, data: EGraphData) -> list[str] | None:
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
    if node.op in FOLDABLE_OPS and kinds.get(cls.id) == "weight" and _all_weights(node, data, kinds):
        return ZERO  # folded into an initializer at lowering time
    if node.op in PARALLEL_OPS:
        src = node.args[0].id
        if locals_.get(src) is None:
            return infinite
        axis = node.args[-1]
        if node.op == "Partition":
            return model.partition(axis, _bytes(src, data, locals_), kinds.get(src, "activation"))
        if node.op == "Combine":
            return model.combine(axis, _bytes(cls.id, data, locals_))
        if node.op == "Reduce":
            return model.reduce(axis, _bytes(cls.id, data, locals_))
        return model.replicate(axis, _bytes(src, data, locals_), kinds.get(src, "activation"))
    in_shapes: list[tuple[int, ...] | None] = []
    in_bytes = 0.0
    for arg in node.args:
        if not isinstance(arg, ClassRef):
            continue
        child = data.classes[arg.id]
        members = [arg.id] if child.sort == "T" else _list_members(arg.id, data)
        if members is None:
            return infinite
        for member in members:
            if locals_.get(member) is None:
                return infinite
            in_shapes.append(locals_[member])
            in_bytes += _bytes(member, data, locals_)
    op = node.args[0] if node.op == "Opaque" else node.op
    outputs = len(node.args[1]) if node.op == "Split" and node.args[1] else 1
    out_bytes = _bytes(cls.id, data, locals_)
    return model.compute(str(op), in_shapes, in_bytes, out_shape, out_bytes, cls.dtype or "", outputs)


# ----------------------------------------------------------------------------------------------------------
# Greedy DAG extraction


@dataclass
class _Best:
    total: float
    costs: dict[str, float]  # e-class -> cost of its chosen node, over the chosen sub-DAG
    node: ENode


CostTable = Mapping[str, Cost] | Mapping[str, float]


def _seconds(cost: Cost | float) -> float:
    return cost.total if isinstance(cost, Cost) else float(cost)


def _totals(costs: CostTable) -> dict[str, float]:
    return {k: _seconds(v) for k, v in costs.items()}


def parents_of(data: EGraphData) -> dict[str, list[ENode]]:
    """E-class -> the e-nodes that have it as a child (each node once per class)."""
    parents: dict[str, list[ENode]] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            for child in set(node.children):
                parents.setdefault(child, []).append(node)
    return parents


def greedy_dag(data: EGraphData, costs: CostTable, parents: dict[str, list[ENode]] | None = None) -> dict[str, ENode]:
    """Pick, for every reachable e-class, the node whose sub-DAG of distinct classes costs least.

    ``costs`` gives every e-node's own cost (a Cost, or seconds); an infinite cost bans the node. ``parents``
    (from :func:`parents_of`) can be shared between runs on one e-graph.
    """
    totals = _totals(costs)
    if parents is None:
        parents = parents_of(data)
    best: dict[str, _Best] = {}
    counter = 0
    queue: list[tuple[float, int, ENode]] = []
    for cls in data.classes.values():
        for node in cls.nodes:
            if not node.children and totals[node.id] < INF:
                heapq.heappush(queue, (totals[node.id], counter, node))
                counter += 1
    while queue:
        _, _, node = heapq.heappop(queue)
        children = set(node.children)
        if any(c not in best for c in children) or node.eclass in children:
            continue
        own = totals[node.id]
        ordered = sorted(children, key=lambda c: -len(best[c].costs))
        if ordered:
            first = best[ordered[0]]
            merged = dict(first.costs)
            total = first.total
            for child in ordered[1:]:
                for cid, value in best[child].costs.items():
                    if cid not in merged:
                        merged[cid] = value
                        total += value
        else:
            merged, total = {}, 0.0
        if node.eclass in merged:
            continue  # choosing this node would make a cycle
        merged[node.eclass] = own
        total += own
        current = best.get(node.eclass)
        if current is not None and total >= current.total * (1 - 1e-12):
            continue
        best[node.eclass] = _Best(total, merged, node)
        for parent in parents.get(node.eclass, ()):
            if totals[parent.id] < INF:
                heapq.heappush(queue, (total, counter, parent))
                counter += 1
    return {cid: b.node for cid, b in best.items()}


def _tensor_children(node: ENode) -> set[str]:
    return set(node.children)


def _find_cycle(choice: dict[str, ENode], roots: Iterable[str]) -> list[str] | None:
    """A cycle of e-classes in the chosen graph reachable from ``roots``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    for root in roots:
        if state.get(root):
            continue
        path: list[str] = []
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(_tensor_children(choice[root]))))]
        state[root] = 1
        path.append(root)
        while stack:
            cid, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[cid] = 2
                continue
            if child not in choice:
                continue
            if state.get(child) == 1:
                return path[path.index(child) :]
            if not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(_tensor_children(choice[child])))))
    return None


def chosen_closure(choice: dict[str, ENode], roots: Iterable[str]) -> set[str] | None:
    """The classes an extraction needs: those reachable from ``roots`` through the chosen nodes' children;
    None when one of them has no chosen node (the extraction is incomplete)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        node = choice.get(cid)
        if node is None:
            return None
        seen.add(cid)
        stack.extend(node.children)
    return seen


def _reaches(choice: dict[str, ENode], starts: Iterable[str], target: str) -> tuple[bool, set[str]]:
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        cid = stack.pop()
        if cid == target:
            return True, seen
        if cid in seen or cid not in choice:
            continue
        seen.add(cid)
        stack.extend(_tensor_children(choice[cid]))
    return False, seen


def break_cycles(data: EGraphData, choice: dict[str, ENode], costs: CostTable, roots: list[str]) -> dict[str, ENode]:
    """Make the chosen graph acyclic.

    Greedy DAG extraction keeps a class's choice when a child later improves, so the final choices can form
    a cycle (x = Partition(Combine(x))). Re-choose one class of each cycle among the nodes whose children,
    under the current choices, never reach that class again; the re-choice cannot create a new cycle.
    """
    choice = dict(choice)
    totals = _totals(costs)
    for _ in range(len(data.classes) + 1):
        cycle = _find_cycle(choice, roots)
        if cycle is None:
            return choice
        best: tuple[float, str, ENode] | None = None
        for cid in cycle:
            for node in data.classes[cid].nodes:
                if node is choice[cid] or totals[node.id] == INF:
                    continue
                children = _tensor_children(node)
                if any(c not in choice for c in children):
                    continue
                loops, closure = _reaches(choice, children, cid)
                if loops:
                    continue
                total = totals[node.id] + math.fsum(totals[choice[c].id] for c in closure)
                if best is None or total < best[0]:
                    best = (total, cid, node)
        if best is None:
            names = ", ".join(sorted({n.op for c in cycle for n in data.classes[c].nodes}))
            raise ExtractionError(f"no acyclic plan: e-classes {cycle} ({names}) only depend on each other")
        choice[best[1]] = best[2]
    raise ExtractionError("internal error: could not remove cycles from the extracted plan")


def dag_cost(choice: dict[str, ENode], roots: Iterable[str], costs: CostTable) -> float:
    """Seconds of the plan ``choice`` makes for ``roots``: every needed class's chosen node once (INF when a
    needed class has no choice)."""
    needed = chosen_closure(choice, roots)
    if needed is None:
        return INF
    return math.fsum(_seconds(costs[choice[c].id]) for c in needed)


def adopt_multi_outputs(
    data: EGraphData, choice: dict[str, ENode], totals: Mapping[str, float], roots: list[str]
) -> dict[str, ENode]:
    """Choose whole multi-output nodes where that makes the (acyclic) plan cheaper.

    Greedy extraction prices each class alone, so the outputs of one Split each look as if they paid for
    the Split's producer: Q, K and V from one MatMul over concatenated weights (generated/merge.egg) never
    beat three MatMuls class by class, although together they do. For each group of Split e-nodes over one
    input with one sizes and axis, this tries the group for every needed class that holds one of its outputs
    and keeps the change when the DAG cost of the plan drops and it stays acyclic.
    """
    groups: dict[tuple[str, Any, Any], list[tuple[str, ENode]]] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            if node.op == "Split" and totals[node.id] < INF:
                key = (node.children[0], tuple(node.args[1]), node.args[2])
                groups.setdefault(key, []).append((cls.id, node))
    if not groups:
        return choice
    current = dag_cost(choice, roots, totals)
    needed = chosen_closure(choice, roots) or set()
    for members in groups.values():
        swaps = [(cid, node) for cid, node in members if cid in needed and choice[cid] is not node]
        if len(swaps) < 2 or any(c not in choice for _, node in swaps for c in node.children):
            continue
        trial = dict(choice)
        trial.update(swaps)
        cost = dag_cost(trial, roots, totals)
        if cost < current * (1 - 1e-9) and _find_cycle(trial, roots) is None:
            choice, current = trial, cost
            needed = chosen_closure(choice, roots) or set()
    return choice


# ----------------------------------------------------------------------------------------------------------
# Building the plan


def _is_default(arg_name: str, value: object, default: object) -> bool:
    if isinstance(value, tuple):
        if not value:
            return True
        if arg_name in ("strides", "dilations") and all(v == 1 for v in value):
            return True
        return arg_name == "pads" and all(v == 0 for v in value)
    return default is not None and value == default


def _typed_attrs(spec: OpSpec, values: list[object]) -> dict[str, object]:
    attrs: dict[str, object] = {}
    for arg, value in zip(spec.args, values, strict=False):
        if arg.kind != "attr" or _is_default(arg.name, value, arg.default):
            continue
        attrs[arg.name] = list(value) if isinstance(value, tuple) else value
    return attrs


class _PlanBuilder:
    def __init__(
        self,
        data: EGraphData,
        choice: dict[str, ENode],
        encoding: Encoding,
        graph: Graph,
        costs: dict[str, Cost],
    ) -> None:
        self.data = data
        self.choice = choice
        self.encoding = encoding
        self.graph = graph
        self.costs = costs
        self.mesh = encoding.mesh
        self.names: dict[str, str] = {}
        names = encoding.tensor_names
        self.original = {cid: names[i] for i, cid in data.tensor_class.items()}
        self.values = value_names(data, self.original)
        self.tensors: dict[str, PlanTensor] = {}
        self.steps: list[Step] = []
        self.step_costs: list[Cost] = []
        self.groups: dict[tuple[object, ...], int] = {}  # multi-output node -> step index
        self.taken: set[str] = set()

    def tensor(self, cid: str) -> str:
        """Name the tensor of an e-class (the original ONNX name when it has one) and record it."""
        if cid in self.names:
            return self.names[cid]
        cls = self.data.classes[cid]
        name = self.original.get(cid)
        if name is None or name in self.taken:
            name = f"uq.{len(self.names)}"
        self.taken.add(name)
        self.names[cid] = name
        placement = tuple(_placement(cls.state(axis)) for axis in self.mesh.axes)
        self.tensors[name] = PlanTensor(
            name, cls.shape or (), cls.dtype or "none", placement, self.original.get(cid), self.values.get(cid)
        )
        return name

    def build(self, roots: Iterable[str]) -> None:
        done: set[str] = set()
        for root in roots:
            self._visit(root, done)

    def _visit(self, root: str, done: set[str]) -> None:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            cid, expanded = stack.pop()
            if cid in done:
                continue
            node = self.choice.get(cid)
            if node is None:
                raise ExtractionError(self._no_choice_message(cid))
            if not expanded:
                stack.append((cid, True))
                for child in self._tensor_children(node):
                    if child not in done:
                        stack.append((child, False))
                continue
            done.add(cid)
            self._emit(cid, node)

    def _tensor_children(self, node: ENode) -> list[str]:
        out: list[str] = []
        for arg in node.args:
            if isinstance(arg, ClassRef):
                if self.data.classes[arg.id].sort == "TList":
                    out.extend(self._list(arg.id))
                else:
                    out.append(arg.id)
        return out

    def _list(self, cid: str) -> list[str]:
        members: list[str] = []
        while True:
            node = self.choice.get(cid)
            if node is None or node.op == "PList":
                raise ExtractionError(f"tensor list e-class {cid} has no expanded form")
            if node.op == "TNil":
                return members
            members.append(node.args[0].id)
            cid = node.args[1].id

    def _no_choice_message(self, cid: str) -> str:
        cls = self.data.classes[cid]
        ops = ", ".join(sorted({n.op for n in cls.nodes}))
        why = "it has no shape" if cls.shape is None else "every node in it depends on an unpriceable node"
        return f"no plan: e-class {cid} ({ops}) has no finite-cost node; {why}"

    def _append(self, step: Step, node: ENode) -> int:
        self.steps.append(step)
        self.step_costs.append(self.costs[node.id])
        return len(self.steps) - 1

    def _is_absent(self, cid: str) -> bool:
        """An absent optional input, possibly under parallel ops (Replicate(NoneT) is still absent)."""
        node = self.choice[cid]
        while node.op in PARALLEL_OPS:
            node = self.choice[node.args[0].id]
        return node.op == "NoneT"

    def _emit(self, cid: str, node: ENode) -> None:
        op = node.op
        if self._is_absent(cid):
            return
        out = self.tensor(cid)
        args = node.args
        if op == "Input":
            self._append(LoadInput(out, args[0]), node)
        elif op == "Weight":
            self._append(LoadWeight(out, args[0]), node)
        elif op == "Partition":
            self._append(Slice(out, self.tensor(args[0].id), int(args[1]), args[2]), node)
        elif op == "Combine":
            self._append(AllGather(out, self.tensor(args[0].id), int(args[1]), args[2]), node)
        elif op == "Reduce":
            self._append(AllReduce(out, self.tensor(args[0].id), args[1]), node)
        elif op == "Replicate":
            self._append(Replicated(out, self.tensor(args[0].id), args[1]), node)
        elif op == "Opaque":
            self._emit_opaque(out, node)
        else:
            self._emit_typed(out, node)

    def _ref(self, arg: ClassRef) -> InputRef:
        return None if self._is_absent(arg.id) else self.tensor(arg.id)

    def _emit_opaque(self, out: str, node: ENode) -> None:
        op_type, key, args, index = node.args
        ir_node = self.encoding.opaque_nodes[key]
        inputs = tuple(self._ref(ClassRef(m)) for m in self._list(args.id))
        group = ("Opaque", key, tuple(inputs))
        self._set_output(
            group,
            node,
            out,
            int(index),
            len(ir_node.outputs),
            lambda outs: Compute(outs, op_type, inputs, dict(ir_node.attrs), ir_node.domain, ir_node.name),
        )

    def _emit_typed(self, out: str, node: ENode) -> None:
        spec = OPS[node.op]
        inputs: list[InputRef] = []
        for arg, value in zip(spec.args, node.args, strict=False):
            if arg.kind != "input":
                continue
            if arg.sort == "T":
                inputs.append(self._ref(value))
            elif arg.sort == "TList":
                inputs.extend(self.tensor(m) for m in self._list(value.id))
            else:
                inputs.append(Const(tuple(value)) if value or not arg.optional else None)
        while inputs and inputs[-1] is None:
            inputs.pop()
        attrs = _typed_attrs(spec, list(node.args))
        if not spec.multi_output:
            self._append(Compute((out,), node.op, tuple(inputs), attrs), node)
            return
        index = int(node.args[-1])
        group = (node.op, tuple(inputs), tuple(sorted(attrs.items(), key=lambda kv: kv[0])).__repr__())
        count = len(node.args[1]) if node.op == "Split" else index + 1
        self._set_output(group, node, out, index, count, lambda outs: Compute(outs, node.op, tuple(inputs), attrs))

    def _set_output(
        self,
        group: tuple[object, ...],
        node: ENode,
        out: str,
        index: int,
        count: int,
        make: Callable[[tuple[str, ...]], Compute],
    ) -> None:
        """Record output ``index`` of a multi-output node; every output of one node shares one step."""
        position = self.groups.get(group)
        if position is None:
            outputs = [""] * max(count, index + 1)
            outputs[index] = out
            self.groups[group] = self._append(make(tuple(outputs)), node)
            return
        step = self.steps[position]
        assert isinstance(step, Compute)
        outputs = list(step.outputs)
        outputs[index] = out
        self.steps[position] = Compute(tuple(outputs), step.op_type, step.inputs, step.attrs, step.domain, step.node)
        self.step_costs[position] = self.step_costs[position] + self.costs[node.id]


@dataclass(frozen=True)
class Restriction:
    """Which e-nodes an extraction may use. The baselines are extractions restricted this way.

    ``parallel``: parallel ops may appear at all; ``axes``: only on these mesh axes (None: any);
    ``shard_weights``: a weight may be partitioned; ``shard_activations``: a model input or activation may
    be partitioned (without it, tensors get sharded only as the outputs of ops on partitioned weights);
    ``shard_all``: every op that reads an input or activation must run sharded on every mesh axis.
    """

    name: str = "greedy"
    parallel: bool = True
    axes: frozenset[str] | None = None
    shard_weights: bool = True
    shard_activations: bool = True
    shard_all: bool = False

    @classmethod
    def one_device(cls) -> Restriction:
        """No parallel op: the original graph, run whole (on every device, or on one)."""
        return cls("one_device", parallel=False)

    @classmethod
    def data_parallel(cls, strict: bool = True) -> Restriction:
        """Every weight whole on every device, every op's work split (``strict``) along weight-free dims."""
        return cls("data_parallel" if strict else "weights_whole", shard_weights=False, shard_all=strict)

    @classmethod
    def tensor_parallel(cls, axis: str) -> Restriction:
        """One mesh axis only; weights are split, inputs and activations never partitioned (Megatron-LM)."""
        return cls(f"tensor_parallel:{axis}", axes=frozenset({axis}), shard_activations=False)

    def allows(self, node: ENode, cls: EClass, kinds: Mapping[str, str]) -> bool:
        """Whether ``node`` (of e-class ``cls``) may be chosen; ``kinds`` are the source kinds of e-classes."""
        if node.op not in PARALLEL_OPS:
            if not self.shard_all or node.op in LEAVES or cls.sort != "T":
                return True
            if all(kinds.get(c) == "weight" for c in node.children):
                return True  # preparing a weight (a Transpose of it…) is not work on data
            return all(cls.state(axis) not in ("R", "D") for axis in cls.placement)
        if not self.parallel:
            return False
        if self.axes is not None and node.args[-1] not in self.axes:
            return False
        if node.op == "Partition":
            kind = kinds.get(node.children[0], "activation")
            if kind == "weight" and not self.shard_weights:
                return False
            if kind != "weight" and not self.shard_activations:
                return False
        return True


@dataclass
class Extraction:
    """One extracted plan with the knobs that produced it."""

    plan: Plan
    restriction: Restriction
    penalty: float  # seconds per byte of per-device memory added to every node's cost
    ilp: list[Any] = field(default_factory=list)  # IlpReport of each exact extraction behind the plan


class Extractor:
    """Extracts plans from one saturated e-graph under one cost model, sharing the pricing between runs."""

    def __init__(
        self,
        data: EGraphData,
        encoding: Encoding,
        graph: Graph,
        model: CostModel,
        activation_inputs: frozenset[str] = frozenset(),
    ) -> None:
        """``activation_inputs``: model inputs that are really activations (a block's incoming tensor): they
        are priced like activations (their slices copy, their gradients count) rather than free inputs."""
        check_invariants(data)
        self.data = data
        self.encoding = encoding
        self.graph = graph
        self.model = model
        self.activation_inputs = activation_inputs
        self.locals = {cid: local_shape(c, model) for cid, c in data.classes.items() if c.sort == "T"}
        self.kinds = source_kinds(data)
        for name in activation_inputs:
            stream = data.tensor_class.get(encoding.tensor_ids[name])
            for cid, kind in list(self.kinds.items()):
                if kind == "input" and (cid == stream or _derives_from(data, cid, stream)):
                    self.kinds[cid] = "activation"
        self.costs = node_costs(data, model, self.locals, self.kinds)
        self.roots = output_classes(data, encoding, graph)
        self._memory: dict[str, float] | None = None
        self.parents = parents_of(data)

    def node_memory(self) -> dict[str, float]:
        """A per-node proxy of the memory a choice costs on each device: the bytes of the activation it
        makes, and for an op, the (training: with gradient and optimizer state) weight pieces it reads."""
        if self._memory is not None:
            return self._memory
        from unity_eq.memory import weight_state_factor

        training = self.model.objective == "training"
        memory: dict[str, float] = {}
        for cls in self.data.classes.values():
            if cls.sort != "T":
                continue
            out = _bytes(cls.id, self.data, self.locals)
            for node in cls.nodes:
                if node.op in LEAVES or node.op == "Replicate":
                    memory[node.id] = 0.0
                    continue
                kind = self.kinds.get(node.children[0], "activation") if node.children else "activation"
                if node.op in PARALLEL_OPS:
                    memory[node.id] = 0.0 if kind == "weight" else out
                    continue
                total = out
                for child in node.children:
                    if self.kinds.get(child) == "weight":
                        nbytes = _bytes(child, self.data, self.locals)
                        factor = 1.0
                        if training:
                            factor += weight_state_factor(max(1, _itemsize(self.data.classes[child].dtype)))
                        total += nbytes * factor
                memory[node.id] = total
        self._memory = memory
        return memory

    def reprice(self, model: CostModel) -> Extractor:
        """The same e-graph priced by another cost model (e.g. one device, for the baseline)."""
        return Extractor(self.data, self.encoding, self.graph, model, self.activation_inputs)

    def totals(self, restriction: Restriction, penalty: float = 0.0) -> dict[str, float]:
        """Every e-node's cost in seconds as an extraction under ``restriction`` and ``penalty`` sees it."""
        totals: dict[str, float] = {}
        memory = self.node_memory() if penalty > 0 else None
        for cls in self.data.classes.values():
            for node in cls.nodes:
                cost = self.costs[node.id].total
                if not restriction.allows(node, cls, self.kinds):
                    cost = INF
                elif memory is not None:
                    cost += penalty * memory.get(node.id, 0.0)
                totals[node.id] = cost
        return totals

    def extract(
        self,
        restriction: Restriction | None = None,
        penalty: float = 0.0,
        method: str = "greedy",
        time_limit_s: float = 60.0,
    ) -> Extraction:
        """The cheapest plan using only nodes ``restriction`` allows; ``penalty`` adds seconds per byte of the
        node memory proxy to steer towards plans that fit. ``method="ilp"`` refines the greedy plan with the
        exact program of unity_eq.extract_ilp (greedy as the incumbent, within ``time_limit_s``)."""
        restriction = restriction or Restriction()
        totals = self.totals(restriction, penalty)
        choice = greedy_dag(self.data, totals, self.parents)
        missing = [r for r in self.roots if r not in choice]
        if missing:
            builder = _PlanBuilder(self.data, choice, self.encoding, self.graph, self.costs)
            raise ExtractionError(builder._no_choice_message(missing[0]))
        choice = break_cycles(self.data, choice, totals, self.roots)
        choice = adopt_multi_outputs(self.data, choice, totals, self.roots)
        reports = []
        if method == "ilp":
            from unity_eq.extract_ilp import ilp_choice

            choice, report = ilp_choice(self.data, as_costs(totals), self.roots, choice, time_limit_s)
            reports.append(report)
        elif method != "greedy":
            raise ExtractionError(f"`--extractor`: expected greedy or ilp, got {method!r}")
        plan = build_plan(self.data, choice, self.costs, self.encoding, self.graph, self.model)
        return Extraction(plan, restriction, penalty, reports)


def extract_greedy(data: EGraphData, encoding: Encoding, graph: Graph, model: CostModel) -> Plan:
    """Extract the cheapest plan (greedy, DAG-aware) whose outputs are the model's outputs, replicated."""
    return Extractor(data, encoding, graph, model).extract().plan


def check_invariants(data: EGraphData) -> None:
    """Refuse an e-graph in which an e-class holds two placements on one axis (a broken rule)."""
    conflicts = data.conflicts()
    if conflicts:
        raise ExtractionError(
            "a rule broke the one-placement-per-e-class invariant: "
            + "; ".join(conflicts[:3])
            + ". Run `unity-eq verify` on your rule files."
        )


def output_classes(data: EGraphData, encoding: Encoding, graph: Graph) -> list[str]:
    """The e-classes of the model's outputs: the roots every extraction starts from."""
    roots = [data.tensor_class.get(encoding.tensor_ids[name], "") for name in graph.outputs]
    missing = [name for name, root in zip(graph.outputs, roots, strict=True) if root not in data.classes]
    if missing:
        raise ExtractionError(f"output {missing[0]!r} has no e-class: the encoding lost it")
    return roots


def build_plan(
    data: EGraphData,
    choice: dict[str, ENode],
    costs: dict[str, Cost],
    encoding: Encoding,
    graph: Graph,
    model: CostModel,
) -> Plan:
    """Turn one chosen node per e-class into a Plan (steps in topological order, costs summed once each)."""
    builder = _PlanBuilder(data, choice, encoding, graph, costs)
    roots = output_classes(data, encoding, graph)
    builder.build(roots)
    outputs = {name: builder.names[root] for name, root in zip(graph.outputs, roots, strict=True)}
    total = ZERO
    for cost in builder.step_costs:
        total = total + cost
    return Plan(
        model=graph.name,
        mesh=model.mesh,  # the mesh it was priced on: reprice() puts an e-graph's replicated plan on one device
        machine=model.machine,
        objective=model.objective,
        tensors=builder.tensors,
        steps=builder.steps,
        inputs=list(graph.inputs),
        outputs=outputs,
        cost=total,
        step_costs=builder.step_costs,
    )
