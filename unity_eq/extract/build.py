"""From a choice (one e-node per e-class) to a :class:`~unity_eq.plan.Plan`: steps in topological order,
placements, and each step's cost counted once. Every chooser (greedy, ILP, the block DP) ends here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from unity_eq.collectives import by_term
from unity_eq.cost import ZERO, Cost, CostModel
from unity_eq.egraph import ClassRef, EGraphData, Encoding, ENode
from unity_eq.errors import ExtractionError
from unity_eq.extract.pricing import PARALLEL_OPS, placement_of, value_names
from unity_eq.ir import Graph
from unity_eq.ops.registry import OPS
from unity_eq.ops.spec import OpSpec
from unity_eq.plan import (
    Compute,
    Const,
    InputRef,
    LoadInput,
    LoadWeight,
    Plan,
    PlanTensor,
    Step,
)


def _is_default(arg_name: str, value: object, default: object) -> bool:
    if isinstance(value, tuple):
        if not value:
            return True
        if arg_name in ("strides", "dilations") and all(v == 1 for v in value):
            return True
        return arg_name == "pads" and all(v == 0 for v in value)
    return default is not None and value == default


def typed_attrs(spec: OpSpec, values: list[object]) -> dict[str, object]:
    attrs: dict[str, object] = {}
    for arg, value in zip(spec.args, values, strict=False):
        if arg.kind != "attr" or _is_default(arg.name, value, arg.default):
            continue
        attrs[arg.name] = list(value) if isinstance(value, tuple) else value
    return attrs


class PlanBuilder:
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
        placement = tuple(placement_of(cls.state(axis)) for axis in self.mesh.axes)
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
                raise ExtractionError(self.no_choice_message(cid))
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

    def no_choice_message(self, cid: str) -> str:
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
        elif (kind := by_term(op)) is not None and kind.step is not None:  # Term(x, *dims, axis): its step
            dims = (int(a) for a in args[1:-1])
            self._append(kind.step(out, self.tensor(args[0].id), *dims, args[-1]), node)  # type: ignore[call-arg]
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
        attrs = typed_attrs(spec, list(node.args))
        if not spec.multi_output:
            self._append(Compute((out,), node.op, tuple(inputs), attrs), node)
            return
        index = int(node.args[-1])
        group = (node.op, tuple(inputs), tuple(sorted(attrs.items(), key=lambda kv: kv[0])).__repr__())
        sizes = spec.output_sizes_in(node.args)
        count = len(sizes) if sizes is not None else index + 1
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
    builder = PlanBuilder(data, choice, encoding, graph, costs)
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
        weight_origins=graph.weight_origins(),
    )
