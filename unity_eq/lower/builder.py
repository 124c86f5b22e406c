"""One rank's ONNX graph, built step by step from a plan: weights become this rank's chunks (views until
written), data movement over weights is folded into initializers, and each collective cuts the graph (its
source a graph output, its result a graph input)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from typing_extensions import assert_never

from unity_eq.collectives import BY_NAME
from unity_eq.ir import Graph, Replicate
from unity_eq.lower.names import Names, derived_names
from unity_eq.ops.registry import plugin_for, spec_for
from unity_eq.ops.spec import Family
from unity_eq.plan import CollectiveStep, Compute, Const, LoadInput, LoadWeight, Plan, Step
from unity_eq.weightfile import Deferred, value_of


def _tensor_type(dtype: str) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _chunk(array: np.ndarray | Deferred, dim: int, index: int, parts: int) -> np.ndarray | Deferred:
    """Chunk ``index`` of ``parts`` along ``dim``: a view (of a memory-mapped weight, nothing is read yet),
    or, of a deferred constant, a deferred chunk."""
    if isinstance(array, Deferred):
        shape = (*array.shape[:dim], array.shape[dim] // parts, *array.shape[dim + 1 :])
        return Deferred(shape, array.dtype, lambda: _view_chunk(array.make(), dim, index, parts))
    return _view_chunk(array, dim, index, parts)


def _view_chunk(array: np.ndarray, dim: int, index: int, parts: int) -> np.ndarray:
    size = array.shape[dim] // parts
    where = [slice(None)] * array.ndim
    where[dim] = slice(index * size, (index + 1) * size)
    return array[tuple(where)]


def lowered_opset(plan: Plan, graph: Graph) -> int:
    """The default-domain opset a plan's device models are written at: the model's, raised to what the
    lowering of a plug-in op the plan uses needs (``OpFamily.opset``: ONNX's Attention is opset 23)."""
    wanted = [
        family.opset
        for step in plan.steps
        if isinstance(step, Compute) and not step.domain and (family := plugin_for(step.op_type)) is not None
    ]
    return max([graph.opset, *wanted])


class _LowerContext:
    """What a plug-in family's ``lower`` hook asks of the graph being built (ops.family.LowerContext)."""

    def __init__(self, builder: DeviceGraphBuilder, step: Compute) -> None:
        self.builder, self.step = builder, step

    def fresh(self, base: str) -> str:
        return self.builder.names.fresh(base)

    def constant(self, array: Any, base: str) -> str:
        name = self.builder.names.fresh(base)
        self.builder.initializers[name] = np.asarray(array)
        return name

    def _tid(self, index: int) -> str | None:
        ref = self.step.inputs[index] if index < len(self.step.inputs) else None
        return ref if isinstance(ref, str) else None

    def shape(self, index: int) -> tuple[int, ...] | None:
        tid = self._tid(index)
        return None if tid is None else self.builder.local_shape(tid)

    def value(self, index: int) -> Any:
        tid = self._tid(index)
        if tid is None:
            return None
        got = self.builder.consts.get(self.builder.alias.get(tid, tid))
        return None if got is None else value_of(got)

    def opset(self) -> int:
        return lowered_opset(self.builder.plan, self.builder.graph)

    def dtype(self, index: int) -> Any:
        tid = self._tid(index)
        return (
            None if tid is None else helper.tensor_dtype_to_np_dtype(_tensor_type(self.builder.plan.tensors[tid].dtype))
        )


class DeviceGraphBuilder:
    """Builds one rank's ONNX graph, step by step."""

    def __init__(self, plan: Plan, graph: Graph, rank: int) -> None:
        self.plan = plan
        self.graph = graph
        self.rank = rank
        self.mesh = plan.mesh
        self.coords = plan.mesh.coords(rank)
        self.consts: dict[str, np.ndarray | Deferred] = {}  # tensors known at lowering time (weights and slices)
        self.weight_of: dict[str, str] = {}  # constant tensor -> the weight it is a piece of
        self.const_names: dict[str, str] = {}  # constant tensor -> its initializer's name
        self.alias: dict[str, str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray | Deferred] = {}  # values, written when the model is saved
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.value_info: dict[str, onnx.ValueInfoProto] = {}
        self.names = Names(self._reserved())
        self.node_names = Names(set())
        self.tensor_names: dict[str, str] = {}  # plan tensor (non-constant) -> its ONNX name on this rank
        self.producer = {out: node for node in graph.nodes for out in node.outputs if out and node.name}
        self.cuts: list[dict[str, Any]] = []  # collective cuts, described in the model's metadata
        self.derived = derived_names(plan)  # source-model names for tensors the rewrites made

    def _reserved(self) -> set[str]:
        """Names fixed by the original model: its inputs and outputs keep them on every rank."""
        names = set(self.plan.outputs)
        names.update(s.name for s in self.plan.steps if isinstance(s, LoadInput))
        return names

    # --- names and values ----------------------------------------------------------------------------
    def local_shape(self, tid: str) -> tuple[int, ...]:
        return self.plan.tensors[tid].local_shape(self.mesh)

    def info(self, tid: str, name: str | None = None) -> onnx.ValueInfoProto:
        t = self.plan.tensors[tid]
        return helper.make_tensor_value_info(name or tid, _tensor_type(t.dtype), list(self.local_shape(tid)))

    def readable(self, tid: str) -> str:
        """A name that says what ``tid`` holds on this rank: the original tensor (or weight) it is, with its
        placement when it is a piece of it (``attn.q.matmul[S(2)]``); the plan's id when it is neither."""
        t = self.plan.tensors.get(tid)
        value = (t.value or t.source) if t is not None else None
        value = value or self.weight_of.get(tid) or self.derived.get(tid)
        if not value:
            return tid
        if t is not None and any(not isinstance(p, Replicate) for p in t.placement):
            return f"{value}[{','.join(t.placement_str())}]"
        return value

    def value(self, tid: str) -> str:
        """The ONNX name holding tensor ``tid`` on this rank; constants become initializers on first use.

        Distinct local values get distinct names (a weight kept whole for one consumer and sliced for another
        is two initializers), and every name is chosen from the plan alone, so all ranks agree on them (the
        collectives in plan.json name the cut tensors once for every rank)."""
        tid = self.alias.get(tid, tid)
        if tid not in self.consts:
            if tid not in self.tensor_names:
                self.tensor_names[tid] = self.names.fresh(self.readable(tid))
            return self.tensor_names[tid]
        if tid not in self.const_names:
            name = self.names.fresh(self.readable(tid))
            self.const_names[tid] = name
            self.initializers[name] = self.consts[tid]
        return self.const_names[tid]

    def literal(self, values: tuple[int, ...], base: str = "const") -> str:
        name = self.names.fresh(base)
        self.initializers[name] = np.asarray(values, dtype=np.int64)
        return name

    def node_name(self, step_outputs: tuple[str, ...] | list[str], op_type: str, node: str = "") -> str:
        """The source model's node name for the node computing ``step_outputs`` (``attn.q.matmul``), with the
        op appended when lowering computes it with another op (``attn.q.matmul/Slice``); unique per graph.
        ``node`` is the original node's name when the plan step knows it."""
        if node:
            return self.node_names.fresh(node)
        for out in step_outputs:
            t = self.plan.tensors.get(out) if out else None
            value = ((t.value or t.source) if t is not None else None) or self.derived.get(out)
            if value and value in self.producer:
                source = self.producer[value]
                same = source.op_type == op_type
                return self.node_names.fresh(source.name if same else f"{source.name}/{op_type}")
            if value:  # a model input or a weight
                return self.node_names.fresh(f"{value}/{op_type}")
        return self.node_names.fresh(op_type)

    # --- steps -------------------------------------------------------------------------------------------
    def add(self, step: Step, collectives: list[dict[str, Any]]) -> None:
        match step:
            case LoadInput(out=out, name=name):
                self.inputs.append(self.info(out, name))
                self.tensor_names[out] = name
            case LoadWeight(out=out, name=name):
                self.consts[out] = self.graph.initializers[name]
                self.weight_of[out] = name
            case Compute():
                self._compute(step)
            case CollectiveStep():
                self._move(step, collectives)
            case _:
                assert_never(step)

    def _move(self, step: CollectiveStep, collectives: list[dict[str, Any]]) -> None:
        """A collective as its kind is lowered: an alias of its source, this rank's slice, or a cut."""
        out, src = step.out, step.src
        match step.kind.lowering:
            case "alias":
                self.alias[out] = self.alias.get(src, src)
            case "slice":
                self._slice(out, src, step.dims()["dim"], step.axis)
            case "cut":
                self._collective(out, src, collectives)
            case _:
                assert_never(step.kind.lowering)

    def _slice(self, out: str, src: str, dim: int, axis: str) -> None:
        i = self.mesh.axes.index(axis)
        n, c = self.mesh.sizes[i], self.coords[i]
        src = self.alias.get(src, src)
        if src in self.consts:
            self.consts[out] = _chunk(self.consts[src], dim, c, n)
            if src in self.weight_of:
                self.weight_of[out] = self.weight_of[src]
            return
        size = self.local_shape(out)[dim]
        node = self.node_name([out], "Slice")
        starts = self.literal((c * size,), f"{node}.starts")
        ends, axes = self.literal(((c + 1) * size,), f"{node}.ends"), self.literal((dim,), f"{node}.axes")
        name = self.value(out)
        self.nodes.append(helper.make_node("Slice", [self.value(src), starts, ends, axes], [name], name=node))
        self.nodes[-1].doc_string = f"this rank's chunk {c} of {n} along dim {dim} (mesh axis {axis})"
        self.value_info[name] = self.info(out, name)

    def _compute(self, step: Compute) -> None:
        if self._fold(step):
            return
        node = self.node_name(step.outputs, step.op_type, step.node)
        inputs: list[str] = []
        for position, ref in enumerate(step.inputs):
            if ref is None:
                inputs.append("")
            elif isinstance(ref, Const):
                values = ref.values
                if step.op_type in ("Reshape", "Expand") and position == 1:
                    values = self.local_shape(step.outputs[0])  # global target shape -> this rank's piece
                inputs.append(self.literal(values, f"{node}.const"))
            else:
                inputs.append(self.value(ref))
        attrs = {k: v for k, v in step.attrs.items() if not (isinstance(v, list) and not v)}
        # An omitted output ('') gets a name of its own: onnxruntime crashes on some ops (Split) without one.
        outputs = [self.value(o) if o else self.names.fresh(f"{node}.unused") for o in step.outputs]
        family = None if step.domain else plugin_for(step.op_type)
        if family is not None and family.lower is not None:  # a plug-in op that is no ONNX operator as such
            lowered = family.lower(step.op_type, inputs, outputs, attrs, _LowerContext(self, step))
            self.nodes += lowered
            self._record_between(step, inputs, outputs, lowered)
        else:
            self.nodes.append(
                helper.make_node(step.op_type, inputs, outputs, name=node, domain=step.domain or None, **attrs)
            )
        for out, name in zip(step.outputs, outputs, strict=True):
            if out:
                self.value_info[name] = self.info(out, name)

    def _record_between(self, step: Compute, inputs: list[str], outputs: list[str], nodes: list[Any]) -> None:
        """Record the type of every tensor a plug-in's lowering makes between its own nodes (Attention's keys
        transposed back): a collective before one of the step's inputs cuts the device graph there
        (runtime/segments.py), and a tensor that crosses the cut must have its type recorded, as every other
        tensor of the graph has. ONNX's shape inference over the lowered nodes alone gives it."""
        between = [o for node in nodes for o in node.output if o and o not in outputs]
        if not between:
            return
        known = [self.info(ref, name) for ref, name in zip(step.inputs, inputs, strict=True) if isinstance(ref, str)]
        for name in dict.fromkeys(i for node in nodes for i in node.input):
            array = self.initializers.get(name)
            if array is not None:  # a constant of the lowering (a scale, a causal mask) or a weight's chunk
                kind = int(helper.np_dtype_to_tensor_dtype(np.dtype(array.dtype)))
                known.append(helper.make_tensor_value_info(name, kind, list(array.shape)))
        results = [self.info(o, n) for o, n in zip(step.outputs, outputs, strict=True) if o]
        ours = helper.make_graph(nodes, "lowered", known, results)
        opset = lowered_opset(self.plan, self.graph)
        model = helper.make_model(ours, opset_imports=[helper.make_opsetid("", opset)])
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
        for name in between:
            if name in inferred:
                self.value_info[name] = inferred[name]

    def _fold(self, step: Compute) -> bool:
        """Evaluate data movement over weights now (the generated rules split and concatenate weights:
        ``Split(W)``, ``Concat(W1, W2)``): the result is an initializer, as the cost model assumes."""
        spec = None if step.domain else spec_for(step.op_type)
        if spec is None or not spec.foldable:
            return False
        refs = [r for r in step.inputs if isinstance(r, str)]
        if not refs or any(self.alias.get(r, r) not in self.consts for r in refs):
            return False
        consts = [self.consts[self.alias.get(r, r)] for r in refs]
        outs = [o for o in step.outputs if o]
        axis = int(step.attrs.get("axis", 0))
        if spec.family is Family.CONCAT:  # a copy: made when written (see Deferred)
            shape = list(consts[0].shape)
            shape[axis] = sum(c.shape[axis] for c in consts)
            concat = Deferred(
                tuple(shape), consts[0].dtype, lambda: np.concatenate([value_of(c) for c in consts], axis=axis)
            )
            if concat.shape != self.local_shape(outs[0]):
                return False
            self.consts[outs[0]] = concat
            return True
        values = [value_of(c) for c in consts]  # views, except of a deferred Concat (rare: made now)
        if spec.output_sizes is not None:  # Split: its outputs' sizes are given, or the plan's local shapes
            position = spec.input_index(spec.output_sizes)
            given = step.inputs[position] if len(step.inputs) > position else None
            sizes = (
                list(given.values) if isinstance(given, Const) else [self.local_shape(o)[axis] for o in step.outputs]
            )
            parts = np.split(values[0], np.cumsum(sizes)[:-1], axis=axis)
            results = {o: p for o, p in zip(step.outputs, parts, strict=True) if o}
        elif spec.family is Family.TRANSPOSE:
            perm = step.attrs.get("perm") or list(reversed(range(values[0].ndim)))
            results = {outs[0]: np.transpose(values[0], perm)}
        else:  # Reshape, Flatten, Squeeze, Unsqueeze: this rank's piece in the output's local shape
            results = {outs[0]: np.reshape(values[0], self.local_shape(outs[0]))}
        for out, value in results.items():
            if tuple(value.shape) != self.local_shape(out):
                return False  # not what the plan expects here: leave it to the op
        self.consts.update(results)
        return True

    def _materialize(self, tid: str) -> str:
        """A node-produced name for ``tid`` (a graph output cannot be an initializer in every runtime, nor a
        graph input: a collective can read the result of an earlier one, e.g. a gather on one mesh axis of a
        tensor just reduced on another)."""
        name = self.value(tid)
        if name in self.initializers or name in {v.name for v in self.inputs}:
            produced = self.names.fresh(f"{name}.copy")
            self.nodes.append(
                helper.make_node("Identity", [name], [produced], name=self.node_names.fresh(f"{name}/Identity"))
            )
            return produced
        return name

    def _collective(self, out: str, src: str, collectives: list[dict[str, Any]]) -> None:
        """Cut the graph: the source leaves as a graph output, the result comes back as a graph input."""
        src_name = self._materialize(src)
        cut = self.describe_cut(len(collectives), out)
        if src_name not in {v.name for v in self.outputs}:
            self.outputs.append(self.info(src, src_name))  # src may alias another name; its shape is its own
            self.outputs[-1].doc_string = f"sent to {cut}"
        self.value_info.pop(src_name, None)
        dst_name = self.names.fresh(self.readable(out))
        self.inputs.append(self.info(out, dst_name))
        self.inputs[-1].doc_string = f"result of {cut}"
        self.tensor_names[out] = dst_name
        collectives.append({"src": src_name, "dst": dst_name})
        self.cuts.append({"id": len(self.cuts), "src": src_name, "dst": dst_name, **self.cut_fields(out), "what": cut})

    def cut_fields(self, out: str) -> dict[str, Any]:
        """A collective as data for the model's metadata: kind, mesh axis, dim, this rank's peers (the ranks it
        runs with, itself included) and the bytes of its result on each rank."""
        step = next(s for s in self.plan.collectives() if s.out == out)
        peers, nbytes = list(self.mesh.group(self.rank, step.axis)), self.plan.tensors[out].local_bytes(self.mesh)
        # all_to_all's split and concat dims beside a gather's dim
        return {"kind": step.kind.name, "axis": step.axis, "dim": None, **step.dims(), "peers": peers, "bytes": nbytes}

    def describe_cut(self, index: int, out: str) -> str:
        """``collective 0: all_gather on mesh axis x (dim 2) with ranks [0, 1], 4096 bytes per rank`` for Netron
        and for users."""
        fields = self.cut_fields(out)
        what = BY_NAME[fields["kind"]].cut_label()
        dim = f" (dim {fields['dim']})" if fields["dim"] is not None else ""
        return (
            f"collective {index}: {what} on mesh axis {fields['axis']}{dim} with ranks {fields['peers']}, "
            f"{fields['bytes']} bytes per rank"
        )

    def finish(self, opset_imports: list[onnx.OperatorSetIdProto], ir_version: int) -> onnx.ModelProto:
        for model_out, tid in self.plan.outputs.items():
            name = self.value(tid)
            if name != model_out:
                node = self.node_names.fresh(f"{model_out}/Identity")
                self.nodes.append(helper.make_node("Identity", [name], [model_out], name=node))
            self.outputs.append(self.info(tid, model_out))
            self.value_info.pop(model_out, None)
        io = {v.name for v in self.inputs} | {v.name for v in self.outputs}
        value_info = [v for k, v in self.value_info.items() if k not in io]
        graph = helper.make_graph(
            self.nodes,
            f"{self.plan.model}.rank{self.rank}",
            self.inputs,
            self.outputs,
            value_info=value_info,
        )
        model = helper.make_model(graph, opset_imports=opset_imports, ir_version=ir_version, producer_name="unity-eq")
        model.doc_string = (
            f"unity-eq plan for {self.plan.model}: rank {self.rank} of {self.mesh.size}, mesh {self.mesh}, "
            f"coordinates {list(self.coords)}. Collectives cut this graph: each one's source is a graph output and "
            "its result a graph input (see their doc strings and plan.json)."
        )
        return model
