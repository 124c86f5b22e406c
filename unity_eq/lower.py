"""Lowering: a Plan becomes one ONNX model per device plus ``plan.json``.

Each ``device_<rank>.onnx`` holds only standard ONNX ops and the rank's slice of every weight. onnxruntime's
PyPI wheels have no collective ops, so a collective is a cut in the device graph: its source is a graph
*output* and its result a graph *input*; ``plan.json`` lists the collectives in order, each with the stage
(how many collectives precede it on any path) that the runtime uses to run the device graph in segments.
Every tensor of a device graph has its local shape recorded in ``value_info``.

``plan.json`` (format version 1) holds: the model's inputs and outputs, the mesh and the device of each rank,
the per-tensor sharding (global shape, placement per axis, local shape), the steps, the ordered collectives
(kind, axis, dim, groups of participating ranks, bytes, stage) and the predicted cost split into compute
and communication. See docs/plan-format.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper
from typing_extensions import assert_never

from unity_eq.cost import Cost
from unity_eq.errors import PlanError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.ir import Graph, Replicate, Shard
from unity_eq.ops.registry import spec_for
from unity_eq.ops.spec import Family
from unity_eq.plan import (
    AllGather,
    AllReduce,
    Compute,
    Const,
    LoadInput,
    LoadWeight,
    Plan,
    Replicated,
    Slice,
    Step,
    step_inputs,
    step_outputs,
)
from unity_eq.planfile import (
    PLAN_FORMAT_VERSION,
    CollectiveRecord,
    CombineStepRecord,
    ComputeStepRecord,
    CostRecord,
    DeviceKindRecord,
    InputStepRecord,
    LinkRecord,
    MachineRecord,
    MeshRecord,
    ModelInputRecord,
    ModelOutputRecord,
    ModelRecord,
    NodeRecord,
    PartitionStepRecord,
    PlanMemoryRecord,
    PlanRecord,
    RankRecord,
    ReduceStepRecord,
    ReplicateStepRecord,
    StepRecord,
    TensorRecord,
    WeightStepRecord,
    json_default,
    write_plan_json,
)
from unity_eq.version import __version__
from unity_eq.weightfile import (
    META_COLLECTIVES,
    META_COORDS,
    META_MESH,
    META_PLAN_HASH,
    META_RANK,
    Deferred,
    ExternalWeights,
    embedded,
    identity_header,
    release_pages,
    value_of,
)

__all__ = ["LoweredPlan", "lower", "plan_record", "step_record", "write_plan_dir"]

# A rank whose weights exceed this writes them to ``device_<rank>.onnx.data`` one tensor at a time (streamed:
# memory holds one tensor, not the rank); smaller ranks stay one self-contained file.
EXTERNAL_DATA_BYTES = 16 << 20


@dataclass
class LoweredPlan:
    """A plan ready to be written: device models are built one rank at a time, so a large replicated
    model is never held once per rank."""

    plan: Plan
    graph: Graph
    stages: dict[str, int]
    opsets: list[onnx.OperatorSetIdProto]
    ir_version: int
    plan_hash: str = ""

    @property
    def world_size(self) -> int:
        return self.plan.mesh.size

    def build_rank(self, rank: int) -> tuple[onnx.ModelProto, list[dict[str, Any]], int]:
        """Rank ``rank``'s model with its weights inside, its collectives' tensor names, and its weight bytes."""
        model, collectives, weights = self._build_rank(rank)
        model.graph.initializer.extend(embedded(name, value_of(array)) for name, array in weights.items())
        return model, collectives, _weight_bytes(weights)

    def write_rank(self, rank: int, folder: Path) -> tuple[list[dict[str, Any]], int]:
        """Write ``device_<rank>.onnx`` to ``folder``; return its collectives' tensor names and weight bytes.

        The weights are views of the source model's (memory-mapped) weights until written. Over
        ``EXTERNAL_DATA_BYTES`` they are streamed: each is sliced, appended to ``device_<rank>.onnx.data`` and
        dropped before the next, so memory holds one tensor of the rank, never the rank."""
        model, collectives, weights = self._build_rank(rank)
        nbytes = _weight_bytes(weights)
        if nbytes > EXTERNAL_DATA_BYTES:
            header = identity_header(self.plan_hash, rank)
            with ExternalWeights(folder / f"device_{rank}.onnx.data", header) as data:
                for name in list(weights):
                    model.graph.initializer.append(data.add(name, value_of(weights.pop(name))))
        else:
            model.graph.initializer.extend(embedded(name, value_of(array)) for name, array in weights.items())
        del weights
        onnx.save_model(model, folder / f"device_{rank}.onnx")
        return collectives, nbytes

    def _build_rank(self, rank: int) -> tuple[onnx.ModelProto, list[dict[str, Any]], dict[str, np.ndarray | Deferred]]:
        """Rank ``rank``'s model without initializers, its collectives, and its initializers' values in graph
        order (mostly views of the source weights: nothing is copied yet)."""
        builder = _DeviceGraphBuilder(self.plan, self.graph, rank)
        collectives: list[dict[str, Any]] = []
        for step in self.plan.steps:
            builder.add(step, collectives)
        model = builder.finish(self.opsets, self.ir_version)
        onnx.helper.set_model_props(model, identity_props(self.plan, rank, self.plan_hash, builder.cuts))
        return model, collectives, builder.initializers

    def models(self) -> Iterator[onnx.ModelProto]:
        for rank in range(self.world_size):
            yield self.build_rank(rank)[0]


def _contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy only when needed; unlike np.ascontiguousarray it keeps a scalar 0-dimensional."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


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


def collective_stages(plan: Plan) -> dict[str, int]:
    """Stage of every collective's output tensor: 1 + the stage of the collectives it depends on."""
    stage: dict[str, int] = {}
    result: dict[str, int] = {}
    for step in plan.steps:
        level = max((stage.get(i, 0) for i in step_inputs(step)), default=0)
        if isinstance(step, AllGather | AllReduce):
            result[step.out] = level
            level += 1
        for out in step_outputs(step):
            stage[out] = level
    return result


class _Names:
    """Unique names in one graph: the first request for a base gets it, later ones ``base.1``, ``base.2``…"""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        base = base or "unnamed"
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}.{k}"
        self.taken.add(name)
        return name


def derived_names(plan: Plan) -> dict[str, str]:
    """Names from the source model for the tensors the rewrites made, which have none (``uq.35``), so that a
    user finds them in Netron: a tensor made of named pieces alone is named after them, ``+``-joined (the q, k
    and v weights concatenated: ``attn.q.weight+attn.k.weight+attn.v.weight``); one that feeds named values is
    named after those (the one MatMul for q, k and v, whose result is split into them:
    ``attn.q.matmul+attn.k.matmul+attn.v.matmul``). Chosen from the plan alone, so every rank agrees."""
    names = {tid: name for tid, t in plan.tensors.items() if (name := t.value or t.source)}
    made: dict[str, str] = {}
    for step in plan.steps:  # forward, through data movement only: pieces -> what they make
        if isinstance(step, Compute) and not _moves_data(step.op_type):
            continue
        ins = [names.get(i) or made.get(i) for i in step_inputs(step)]
        if ins and all(ins):
            for out in step_outputs(step):
                if out not in names:
                    made[out] = _joined(n for n in ins if n)
    feeds: dict[str, str] = {}
    for step in reversed(plan.steps):  # backward: what a nameless tensor becomes
        known = _joined(n for n in (names.get(o) or feeds.get(o) for o in step_outputs(step)) if n)
        for tid in step_inputs(step):
            if known and tid not in names and tid not in made and tid not in feeds:
                feeds[tid] = known
    return {**feeds, **made}


def _moves_data(op_type: str) -> bool:
    """A pure data-layout op (lowering folds it over weights): its outputs are named after its inputs."""
    spec = spec_for(op_type)
    return spec is not None and spec.foldable


def _joined(names: Iterable[str], most: int = 4) -> str:
    """``a+b+c``, each name once; past ``most`` names, ``a+b+c+5 more`` (a name is for finding, not listing)."""
    unique = list(dict.fromkeys(part for name in names for part in name.split("+")))
    if len(unique) > most:
        return "+".join(unique[: most - 1]) + f"+{len(unique) - most + 1} more"
    return "+".join(unique)


class _DeviceGraphBuilder:
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
        self.names = _Names(self._reserved())
        self.node_names = _Names(set())
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
            case Replicated(out=out, src=src):
                self.alias[out] = self.alias.get(src, src)
            case Slice(out=out, src=src, dim=dim, axis=axis):
                self._slice(out, src, dim, axis)
            case Compute():
                self._compute(step)
            case AllGather(out=out, src=src) | AllReduce(out=out, src=src):
                self._collective(out, src, collectives)
            case _:
                assert_never(step)

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
        self.nodes.append(
            helper.make_node(step.op_type, inputs, outputs, name=node, domain=step.domain or None, **attrs)
        )
        for out, name in zip(step.outputs, outputs, strict=True):
            if out:
                self.value_info[name] = self.info(out, name)

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
        step = next(s for s in self.plan.steps if isinstance(s, AllGather | AllReduce) and s.out == out)
        return {
            "kind": "all_gather" if isinstance(step, AllGather) else "all_reduce",
            "axis": step.axis,
            "dim": step.dim if isinstance(step, AllGather) else None,
            "peers": list(self.mesh.group(self.rank, step.axis)),
            "bytes": self.plan.tensors[out].local_bytes(self.mesh),
        }

    def describe_cut(self, index: int, out: str) -> str:
        """``collective 0: all_gather on mesh axis x (dim 2) with ranks [0, 1], 4096 bytes per rank`` for Netron
        and for users."""
        fields = self.cut_fields(out)
        what = "all_gather" if fields["kind"] == "all_gather" else "all_reduce (sum)"
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


def lower(plan: Plan, graph: Graph) -> LoweredPlan:
    """Check the plan and prepare it for writing (device models are built when written)."""
    problems = plan.validate()
    if problems:
        raise PlanError("internal error: the extracted plan is inconsistent: " + "; ".join(problems[:3]))
    opsets = [helper.make_opsetid("", graph.opset)] + [helper.make_opsetid(d, v) for d, v in graph.extra_opsets.items()]
    ir_version = min(max(graph.ir_version, 8), 10)
    return LoweredPlan(plan, graph, collective_stages(plan), opsets, ir_version, plan_hash(plan, graph))


def identity_props(plan: Plan, rank: int, digest: str, cuts: list[dict[str, Any]]) -> dict[str, str]:
    """Who a device file is: its rank, mesh coordinates, the plan's hash, and the collectives cutting it."""
    mesh = plan.mesh
    return {
        META_RANK: str(rank),
        META_PLAN_HASH: digest,
        META_COORDS: json.dumps(dict(zip(mesh.axes, mesh.coords(rank), strict=True))),
        META_MESH: json.dumps(dict(zip(mesh.axes, mesh.sizes, strict=True))),
        META_COLLECTIVES: json.dumps(cuts),
    }


def plan_hash(plan: Plan, graph: Graph) -> str:
    """A digest of what a plan computes: its steps, tensors, mesh and outputs, and the model's weights.

    Two plans share it only when their device files are interchangeable; ``run`` compares it between
    plan.json and every device file. Weights are hashed in place (no copy), one tensor at a time."""
    digest = hashlib.blake2b(digest_size=16)
    structure = {
        "model": plan.model,
        "mesh": [list(plan.mesh.axes), list(plan.mesh.sizes), list(plan.mesh.devices)],
        "steps": [step_record(s).to_json() for s in plan.steps],
        "tensors": {tid: [list(t.shape), t.dtype, t.placement_str()] for tid, t in plan.tensors.items()},
        "outputs": plan.outputs,
        "inputs": {n: [list(t.shape), t.dtype] for n, t in graph.inputs.items()},
    }
    digest.update(json.dumps(structure, sort_keys=True, default=json_default).encode())
    for name in sorted(graph.initializers):
        array = np.asarray(graph.initializers[name])
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        if array.dtype.kind == "O":  # string tensors
            digest.update(repr(array.tolist()).encode())
        elif array.size:
            digest.update(_contiguous(array.reshape(-1)).data)
            release_pages(array)
    return digest.hexdigest()


def _weight_bytes(weights: dict[str, np.ndarray | Deferred]) -> int:
    return sum(int(array.nbytes) for array in weights.values())


def step_record(step: Step, cost: Cost | None = None) -> StepRecord:
    """A step as plan.json lists it, with its predicted seconds when the plan was priced step by step."""
    seconds = {"compute_s": cost.compute, "communication_s": cost.comm} if cost is not None else {}
    match step:
        case Compute(outputs=outputs, op_type=op, inputs=inputs, attrs=attrs, domain=domain):
            refs = tuple(tuple(i.values) if isinstance(i, Const) else i for i in inputs)
            plain = {k: v for k, v in attrs.items() if isinstance(v, int | float | str | list)}
            return ComputeStepRecord(op=op, inputs=refs, outputs=outputs, attrs=plain, domain=domain, **seconds)
        case LoadInput(out=out, name=name):
            return InputStepRecord(out=out, name=name, **seconds)
        case LoadWeight(out=out, name=name):
            return WeightStepRecord(out=out, name=name, **seconds)
        case Slice(out=out, src=src, dim=dim, axis=axis):
            return PartitionStepRecord(out=out, src=src, dim=dim, axis=axis, **seconds)
        case AllGather(out=out, src=src, dim=dim, axis=axis):
            return CombineStepRecord(out=out, src=src, dim=dim, axis=axis, **seconds)
        case AllReduce(out=out, src=src, axis=axis):
            return ReduceStepRecord(out=out, src=src, axis=axis, **seconds)
        case Replicated(out=out, src=src, axis=axis):
            return ReplicateStepRecord(out=out, src=src, axis=axis, **seconds)
        case _:
            assert_never(step)


def plan_record(lowered: LoweredPlan, device_collectives: list[dict[str, Any]], weight_bytes: list[int]) -> PlanRecord:
    """The content of plan.json (see the module docstring): ``device_collectives`` names the tensors each
    collective cuts (the same on every rank), ``weight_bytes`` is the weights written for each rank."""
    plan, graph, stages = lowered.plan, lowered.graph, lowered.stages
    mesh, machine = plan.mesh, plan.machine
    ranks = tuple(
        RankRecord(
            rank=rank,
            coords=mesh.coords(rank),
            device=mesh.devices[rank],
            device_kind=machine.devices[mesh.devices[rank]].name,
            node=machine.node_of[mesh.devices[rank]],
        )
        for rank in range(mesh.size)
    )
    plan_collectives = [s for s in plan.steps if isinstance(s, AllGather | AllReduce)]
    collectives = tuple(
        CollectiveRecord(
            id=index,
            kind="all_gather" if isinstance(step, AllGather) else "all_reduce",
            axis=step.axis,
            dim=step.dim if isinstance(step, AllGather) else None,
            src=names["src"],
            dst=names["dst"],
            groups=tuple(tuple(g) for g in mesh.groups(step.axis)),
            bytes=plan.tensors[step.out].local_bytes(mesh),
            stage=stages[step.out],
        )
        for index, (step, names) in enumerate(zip(plan_collectives, device_collectives, strict=True))
    )
    tensors = {
        tid: TensorRecord(
            shape=t.shape,
            dtype=t.dtype,
            placement=tuple(t.placement_str()),
            local_shape=t.local_shape(mesh),
            source=t.source or None,
            value=t.value or None,
        )
        for tid, t in plan.tensors.items()
    }
    model = ModelRecord(
        name=plan.model,
        source=graph.source,
        fingerprint=graph.fingerprint or None,
        inputs={n: ModelInputRecord(shape=t.shape, dtype=t.dtype) for n, t in graph.inputs.items()},
        outputs={
            n: ModelOutputRecord(shape=graph.types[n].shape, dtype=graph.types[n].dtype, tensor=plan.outputs[n])
            for n in graph.outputs
        },
    )
    report = plan.report
    return PlanRecord(
        format_version=PLAN_FORMAT_VERSION,
        unity_eq_version=__version__,
        model=model,
        objective=plan.objective.name,
        mesh=MeshRecord(axes=mesh.axes, sizes=mesh.sizes, devices=mesh.devices, ranks=ranks),
        machine=machine_record(plan),
        cost=report.cost
        or CostRecord(total_s=plan.cost.total, compute_s=plan.cost.compute, communication_s=plan.cost.comm),
        files=tuple(f"device_{r}.onnx" for r in range(mesh.size)),
        tensors=tensors,
        steps=tuple(step_record(s, c) for s, c in zip(plan.steps, _costs(plan), strict=True)),
        collectives=collectives,
        shardings={
            tid: tuple(t.placement_str())
            for tid, t in plan.tensors.items()
            if any(isinstance(p, Shard) for p in t.placement)
        },
        mesh_search=report.mesh_search,
        baselines=report.baselines,
        extraction=report.extraction,
        blocks=report.blocks,
        parallelism=report.parallelism,
        stats=plan.stats,
        plan_hash=lowered.plan_hash,
        memory=PlanMemoryRecord(usage=report.memory, weight_bytes_per_rank=tuple(weight_bytes)),
    )


def _costs(plan: Plan) -> list[Cost | None]:
    return list(plan.step_costs) if len(plan.step_costs) == len(plan.steps) else [None] * len(plan.steps)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def machine_record(plan: Plan) -> MachineRecord:
    """The machine as plan.json records it: device kinds, nodes and links (SI units: FLOP/s, bytes/s, s)."""
    from unity_eq.cost import CostModel, axis_info

    machine = plan.machine
    kinds = {}
    for device in machine.devices:
        kinds[device.name] = DeviceKindRecord(
            peak_flops=dict(device.flops),
            memory_bandwidth_bytes_s=device.memory_bandwidth,
            memory_bytes=device.memory,
        )
    nodes = []
    for index in sorted(set(machine.node_of)):
        node = machine.node(index)
        network = node.network
        nodes.append(
            NodeRecord(
                name=node.name,
                devices=tuple(d for d, n in enumerate(machine.node_of) if n == index),
                link=LinkRecord(
                    name=node.link.name, bandwidth_bytes_s=_finite(node.link.bandwidth), latency_s=node.link.latency
                ),
                network=None
                if network is None
                else LinkRecord(name=network.name, bandwidth_bytes_s=network.bandwidth, latency_s=network.latency),
                nics=node.nics,
            )
        )
    model = CostModel(machine, plan.mesh, plan.objective)
    return MachineRecord(
        name=machine.name,
        source=machine.source,
        devices=machine.device_count,
        nodes=machine.node_count,
        device_kinds=kinds,
        node_list=tuple(nodes),
        launch_overhead_s=machine.launch_overhead,
        efficiency=machine.efficiency,
        memory_fraction=machine.memory_fraction,
        mesh_axes=tuple(axis_info(model, a) for a in plan.mesh.axes),
    )


def write_plan_dir(
    lowered: LoweredPlan, out_dir: str | Path, on_rank: Callable[[int, int], None] | None = None
) -> Path:
    """Write the plan directory atomically: everything goes to a temporary sibling that replaces ``out_dir``
    only when complete, so a failure never leaves a half-written plan. Ranks are built, saved and dropped
    one at a time; ``on_rank(done, total)`` hears each one written (a large model takes a while per rank)."""
    # resolved: `-o .` names the folder by its real name (its sibling temporary folder, not one inside it),
    # and `-o link` writes where the link points instead of replacing the link by a folder
    target = Path(out_dir).resolve()
    check_output_dir(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with plan_tempdir(target) as tmp:
        weight_bytes: list[int] = []
        collectives: list[dict[str, Any]] = []
        for rank in range(lowered.world_size):
            names, nbytes = lowered.write_rank(rank, tmp)
            path = tmp / f"device_{rank}.onnx"
            validate_device_file(path, target / path.name)
            weight_bytes.append(nbytes)
            if on_rank is not None:
                on_rank(rank + 1, lowered.world_size)
            if rank == 0:
                collectives = names
        write_plan_json(tmp / "plan.json", plan_record(lowered, collectives, weight_bytes))
        replace_plan_files(tmp, target)
    return target


def validate_device_file(path: Path, shown: Path) -> None:
    """Refuse a device file that fails ``onnx.checker`` (full check, with shape inference) or that onnxruntime
    does not open: ``optimize`` never reports success for a plan that cannot run. ``shown`` is the path named in
    the error (the file's final place; nothing is written there when this fails)."""
    from unity_eq.runtime.devices import make_session

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # onnx raises ValidationError, InferenceError and others
        problem = f"onnx.checker: {str(exc).strip().splitlines()[0][:400]}"
    else:
        try:
            make_session(str(path), ["CPUExecutionProvider"], prepack=False)  # loads; weights stay on disk
            return
        except Exception as exc:  # onnxruntime refuses the model
            problem = f"onnxruntime: {str(exc).strip().splitlines()[0][:400]}"
    raise PlanError(
        f"{shown}: the lowered device model is invalid ({problem}); no plan was written. "
        "This is a bug in unity-eq's lowering: please report it with the model and options."
    )
