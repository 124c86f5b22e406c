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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

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

__all__ = ["build_plan", "extract_greedy", "greedy_dag", "node_costs", "output_classes"]

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
    import numpy as np

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


def node_costs(data: EGraphData, model: CostModel) -> dict[str, Cost]:
    """Price every e-node of a tensor class (INF compute for nodes that cannot be lowered)."""
    locals_ = {cid: local_shape(c, model) for cid, c in data.classes.items() if c.sort == "T"}
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
    return model.compute(str(op), in_shapes, in_bytes, out_shape, _bytes(cls.id, data, locals_), cls.dtype or "")


# ----------------------------------------------------------------------------------------------------------
# Greedy DAG extraction


@dataclass
class _Best:
    total: float
    costs: dict[str, float]  # e-class -> cost of its chosen node, over the chosen sub-DAG
    node: ENode


def greedy_dag(data: EGraphData, costs: dict[str, Cost]) -> dict[str, ENode]:
    """Pick, for every reachable e-class, the node whose sub-DAG of distinct classes costs least."""
    parents: dict[str, list[ENode]] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            for child in set(node.children):
                parents.setdefault(child, []).append(node)
    best: dict[str, _Best] = {}
    counter = 0
    queue: list[tuple[float, int, ENode]] = []
    for cls in data.classes.values():
        for node in cls.nodes:
            if not node.children and costs[node.id].total < INF:
                heapq.heappush(queue, (costs[node.id].total, counter, node))
                counter += 1
    while queue:
        _, _, node = heapq.heappop(queue)
        children = set(node.children)
        if any(c not in best for c in children) or node.eclass in children:
            continue
        own = costs[node.id].total
        if own == INF:
            continue
        merged: dict[str, float] = {}
        for child in sorted(children, key=lambda c: -len(best[c].costs)):
            if not merged:
                merged = dict(best[child].costs)
            else:
                merged.update(best[child].costs)
        if node.eclass in merged:
            continue  # choosing this node would make a cycle
        merged[node.eclass] = own
        total = math.fsum(merged.values())
        current = best.get(node.eclass)
        if current is not None and total >= current.total * (1 - 1e-12):
            continue
        best[node.eclass] = _Best(total, merged, node)
        for parent in parents.get(node.eclass, ()):
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


def break_cycles(
    data: EGraphData, choice: dict[str, ENode], costs: dict[str, Cost], roots: list[str]
) -> dict[str, ENode]:
    """Make the chosen graph acyclic.

    Greedy DAG extraction keeps a class's choice when a child later improves, so the final choices can form
    a cycle (x = Partition(Combine(x))). Re-choose one class of each cycle among the nodes whose children,
    under the current choices, never reach that class again; the re-choice cannot create a new cycle.
    """
    choice = dict(choice)
    for _ in range(len(data.classes) + 1):
        cycle = _find_cycle(choice, roots)
        if cycle is None:
            return choice
        best: tuple[float, str, ENode] | None = None
        for cid in cycle:
            for node in data.classes[cid].nodes:
                if node is choice[cid] or costs[node.id].total == INF:
                    continue
                children = _tensor_children(node)
                if any(c not in choice for c in children):
                    continue
                loops, closure = _reaches(choice, children, cid)
                if loops:
                    continue
                total = costs[node.id].total + math.fsum(costs[choice[c].id].total for c in closure)
                if best is None or total < best[0]:
                    best = (total, cid, node)
        if best is None:
            names = ", ".join(sorted({n.op for c in cycle for n in data.classes[c].nodes}))
            raise ExtractionError(f"no acyclic plan: e-classes {cycle} ({names}) only depend on each other")
        choice[best[1]] = best[2]
    raise ExtractionError("internal error: could not remove cycles from the extracted plan")


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
        self.original = {cid: encoding.tensor_names[i] for i, cid in data.tensor_class.items()}
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
        self.tensors[name] = PlanTensor(name, cls.shape or (), cls.dtype or "none", placement, self.original.get(cid))
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


def extract_greedy(data: EGraphData, encoding: Encoding, graph: Graph, model: CostModel) -> Plan:
    """Extract the cheapest plan (greedy, DAG-aware) whose outputs are the model's outputs, replicated."""
    check_invariants(data)
    costs = node_costs(data, model)
    roots = output_classes(data, encoding, graph)
    choice = break_cycles(data, greedy_dag(data, costs), costs, roots)
    return build_plan(data, choice, costs, encoding, graph, model)


def check_invariants(data: EGraphData) -> None:
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
        mesh=encoding.mesh,
        machine=model.machine,
        objective=model.objective,
        tensors=builder.tensors,
        steps=builder.steps,
        inputs=list(graph.inputs),
        outputs=outputs,
        cost=total,
        step_costs=builder.step_costs,
    )
