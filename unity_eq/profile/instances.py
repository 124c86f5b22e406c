"""What ``profile`` measures: every distinct compute op of the e-graph on its local shapes (:class:`ProfiledOp`),
with the ONNX inputs to run it with (:class:`InputSpec`) and the cost model's view of it, built as extraction
builds it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.cost import CostModel, OpInstance
from unity_eq.egraph import EGraphData, Encoding, ENode
from unity_eq.extract.build import typed_attrs
from unity_eq.extract.pricing import LEAVES, PARALLEL_OPS, enode_instance, list_members, local_shapes, source_kinds
from unity_eq.ir import Graph, Mesh
from unity_eq.machine import default_machine
from unity_eq.ops.registry import OPS
from unity_eq.profile_table import frozen_value


@dataclass(frozen=True)
class InputSpec:
    """One ONNX input of a measured op. ``kind``: ``activation`` (fed each run), ``weight`` (an initializer,
    as in a device model), ``constant`` (an integer list of the op, e.g. Reshape's shape), ``absent``."""

    shape: tuple[int, ...]
    dtype: str
    kind: str
    value: tuple[int, ...] | None = None  # constants, and small integer weights

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "kind": self.kind}
        if self.value is not None:
            out["value"] = list(self.value)
        return out


@dataclass(frozen=True)
class ProfiledOp:
    """One distinct op of the e-graph on local shapes: what is run (an ONNX node and its inputs), and
    ``priced``, the cost model's view of it, built as extraction builds it."""

    op: str
    domain: str
    attrs: tuple[tuple[str, Any], ...]  # sorted (name, value); lists as tuples
    inputs: tuple[InputSpec, ...]
    outputs: int  # outputs of the ONNX node
    output_index: int
    output_dtypes: tuple[str, ...]
    priced: OpInstance

    @property
    def in_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Every input's local shape (an instance is only made when all are known); ``()`` for an absent
        optional one (the table's key: :meth:`ProfileTable.lookup` reads a priced instance's None so)."""
        return tuple(() if s is None else tuple(s) for s in self.priced.in_shapes)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.priced.out_shape

    @property
    def dtype(self) -> str:
        return self.priced.dtype

    @property
    def run_key(self) -> tuple[Any, ...]:
        """Instances with the same run key are one measurement (the outputs of one multi-output node)."""
        return (self.op, self.domain, self.attrs, self.inputs, self.outputs)


def _itemsize(dtype: str | None) -> int:
    return 0 if dtype in (None, "", "none") else int(np.dtype(dtype).itemsize)


def _weight_value(cid: str, data: EGraphData, graph: Graph, shape: tuple[int, ...]) -> np.ndarray | None:
    """The values of a weight class (its first local chunk), found through Partition/Replicate chains."""
    seen: set[str] = set()
    while cid not in seen:
        seen.add(cid)
        cls = data.classes[cid]
        leaf = next((n for n in cls.nodes if n.op == "Weight"), None)
        if leaf is not None:
            array = graph.initializers.get(str(leaf.args[0]))
            if array is None or array.ndim != len(shape) or any(a < s for a, s in zip(array.shape, shape, strict=True)):
                return None
            return np.array(array[tuple(slice(0, s) for s in shape)], order="C")  # keeps a scalar 0-d
        step = next((n for n in cls.nodes if n.op in ("Partition", "Replicate")), None)
        if step is None:
            return None
        cid = step.args[0].id
    return None


def _tensor_input(
    cid: str, data: EGraphData, graph: Graph, locals_: Mapping[str, tuple[int, ...] | None], kinds: Mapping[str, str]
) -> tuple[InputSpec, np.ndarray | None]:
    cls = data.classes[cid]
    shape = locals_[cid] or ()
    dtype = cls.dtype or "float32"
    if cls.dtype == "none" or any(n.op == "NoneT" for n in cls.nodes):  # an optional operand left out
        return InputSpec((), "", "absent"), None
    if kinds.get(cid) == "weight":
        value = _weight_value(cid, data, graph, shape)
        ints = None
        if value is not None and value.dtype.kind in "iu" and value.size <= 64:
            ints = tuple(int(v) for v in value.reshape(-1))  # small integer weights (shapes, indices) matter
        return InputSpec(shape, dtype, "weight", ints), value
    return InputSpec(shape, dtype, "activation"), None


def _node_instance(
    node: ENode,
    out_cid: str,
    data: EGraphData,
    encoding: Encoding,
    graph: Graph,
    locals_: Mapping[str, tuple[int, ...] | None],
    kinds: Mapping[str, str],
    values: dict[ProfiledOp, dict[int, np.ndarray]],
) -> ProfiledOp | None:
    """The instance of a compute e-node (None when its local shapes are unknown: the cost model prices it ∞)."""
    cls = data.classes[out_cid]
    priced = enode_instance(node, cls, data, locals_)
    if priced is None:
        return None
    out_shape, dtype = priced.out_shape, priced.dtype

    inputs: list[InputSpec] = []
    arrays: dict[int, np.ndarray] = {}

    def add_tensor(cid: str) -> None:
        spec, value = _tensor_input(cid, data, graph, locals_, kinds)
        if value is not None:
            arrays[len(inputs)] = value
        inputs.append(spec)

    if node.op == "Opaque":
        op_type, key, args, index = node.args
        ir_node = encoding.opaque_nodes[str(key)]
        for member in list_members(args.id, data) or []:
            add_tensor(member)
        attrs = {k: frozen_value(v) for k, v in ir_node.attrs.items()}
        domain, outputs, output_index = ir_node.domain, len(ir_node.outputs), int(index)
        out_dtypes = tuple(graph.types[o].dtype if o in graph.types else dtype for o in ir_node.outputs)
        op = str(op_type)
    else:
        spec = OPS[node.op]
        for arg, value in zip(spec.args, node.args, strict=False):
            if arg.kind != "input":
                continue
            if arg.sort == "T":
                add_tensor(value.id)
            elif arg.sort == "TList":
                for member in list_members(value.id, data) or []:
                    add_tensor(member)
            elif not value and arg.optional:
                inputs.append(InputSpec((), "", "absent"))
            else:
                ints = tuple(out_shape) if node.op in ("Reshape", "Expand") and arg.name == "shape" else tuple(value)
                inputs.append(InputSpec((len(ints),), "int64", "constant", ints))
        while inputs and inputs[-1].kind == "absent":
            inputs.pop()
        attrs = {k: frozen_value(v) for k, v in typed_attrs(spec, list(node.args)).items()}
        op, domain = node.op, ""
        output_index = int(node.args[-1]) if spec.multi_output else 0
        sizes = spec.output_sizes_in(node.args)
        outputs = len(sizes) if sizes else output_index + 1
        out_dtypes = (dtype,) * outputs
    instance = ProfiledOp(
        op, domain, tuple(sorted(attrs.items())), tuple(inputs), outputs, output_index, out_dtypes, priced
    )
    values.setdefault(instance, arrays)
    return instance


def op_instances(
    data: EGraphData, encoding: Encoding, graph: Graph, mesh: Mesh
) -> tuple[list[ProfiledOp], dict[ProfiledOp, dict[int, np.ndarray]]]:
    """Every distinct compute op of the e-graph on its local shapes (sorted), and known weight values."""
    model = CostModel(default_machine(mesh.size), mesh)  # only its mesh matters for local shapes
    locals_ = local_shapes(data, model)
    kinds = source_kinds(data)
    values: dict[ProfiledOp, dict[int, np.ndarray]] = {}
    found: set[ProfiledOp] = set()
    for cls in data.classes.values():
        if cls.sort != "T":
            continue
        for node in cls.nodes:
            if node.op in LEAVES or node.op in PARALLEL_OPS or node.op == "Tensor":
                continue
            instance = _node_instance(node, cls.id, data, encoding, graph, locals_, kinds, values)
            if instance is not None:
                found.add(instance)
    ordered = sorted(found, key=lambda i: (i.op, i.in_shapes, i.out_shape, repr(i.attrs), i.output_index))
    return ordered, values
