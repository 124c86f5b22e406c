"""The model while it is normalized (step 2 of :mod:`unity_eq.frontends.onnx`): weights split from model
inputs into numpy arrays (:class:`Work`), ``onnx.checker``, local functions inlined and the default-domain
opset upgraded to :data:`MIN_OPSET`.

Separate because :class:`Work` is the state every later step (input shapes, folding, building the IR) reads
and rewrites; it keeps large weights out of protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.inliner
import onnx.version_converter
from onnx import helper, numpy_helper

from unity_eq.errors import ModelError
from unity_eq.frontends.onnx_read import one_line
from unity_eq.ir import TensorType, WeightOrigin

__all__ = ["MIN_OPSET", "Work", "run_checker", "static_type", "upgrade"]

MIN_OPSET = 18
"""Default-domain opset every model is upgraded to (torch's dynamo exporter writes 18 and above)."""

_MIN_IR_VERSION = 7
_INLINE_LIMIT = 1024
"""Constants with more elements than this reach shape inference as typed inputs, not as initializers."""


# ------------------------------------------------------------------------------------------ working state


@dataclass
class Work:
    """The model while it is being normalized: protobuf nodes, numpy constants, typed inputs and outputs."""

    where: str
    name: str
    nodes: list[onnx.NodeProto]
    inputs: list[onnx.ValueInfoProto]
    outputs: list[onnx.ValueInfoProto]
    consts: dict[str, np.ndarray]
    opsets: dict[str, int]
    ir_version: int
    value_info: list[onnx.ValueInfoProto] = field(default_factory=list)
    functions: list[onnx.FunctionProto] = field(default_factory=list)
    #: constants known by dtype and shape only (shape-only arrays, see ``onnx_read.shape_only``), and why:
    #: their values are never shown to onnx's tools, and what is folded from them is shape-only too
    missing: dict[str, str] = field(default_factory=dict)
    #: where each constant comes from: a parameter of the source file, folded from parameters, or a constant
    #: (``ir.WeightOrigin``); filled when the weights are split from the inputs, extended as nodes fold
    origins: dict[str, WeightOrigin] = field(default_factory=dict)

    @classmethod
    def from_model(
        cls,
        model: onnx.ModelProto,
        where: str,
        external: Mapping[str, np.ndarray],
        missing: Mapping[str, str] | None = None,
        consume: bool = True,
    ) -> Work:
        """Split weights from model inputs: a graph input that has an initializer (IR 3 style) is a weight.

        With ``consume`` each embedded weight is converted to numpy and then cleared from the proto at once,
        so a large model is never held twice; a caller's in-memory model is passed with ``consume=False`` and
        left as it was.
        """
        g = model.graph
        consts: dict[str, np.ndarray] = {}
        for t in g.initializer:
            if t.name in external:
                consts[t.name] = external[t.name]
                continue
            try:
                consts[t.name] = numpy_helper.to_array(t)
            except Exception as e:  # a tensor whose data does not match its dims or type
                raise ModelError(f"{where}: initializer {t.name!r} is malformed ({one_line(e)}). Re-export.") from e
            if consume:
                t.Clear()
        return cls(
            where=where,
            name=g.name,
            nodes=list(g.node),
            inputs=[i for i in g.input if i.name not in consts],
            outputs=list(g.output),
            consts=consts,
            opsets=_opsets(model),
            ir_version=max(model.ir_version, _MIN_IR_VERSION),
            value_info=[v for v in g.value_info if static_type(v.type) is not None],
            functions=list(model.functions),
            missing=dict(missing or {}),
        )

    def as_model(self, declared_outputs: bool = False) -> onnx.ModelProto:
        """A model for onnx's tools; constants over ``_INLINE_LIMIT`` elements, and those whose values are
        missing (shape inference must not propagate stand-in zeros), are typed inputs, not data.

        ``declared_outputs`` keeps the outputs as the file declares them (for the checker); otherwise they keep
        only their element type, since declared shapes may predate new input shapes.
        """
        inline = {n for n, a in self.consts.items() if a.size <= _INLINE_LIMIT and n not in self.missing}
        small = [numpy_helper.from_array(a, n) for n, a in self.consts.items() if n in inline]
        large = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in self.consts.items()
            if n not in inline
        ]
        outputs = list(self.outputs)
        if not declared_outputs:
            outputs = [helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None) for o in outputs]
        graph = helper.make_graph(
            self.nodes, self.name, [*self.inputs, *large], outputs, small, value_info=self.value_info
        )
        opsets = [helper.make_opsetid(d, v) for d, v in self.opsets.items()]
        return helper.make_model(graph, opset_imports=opsets, ir_version=self.ir_version, functions=self.functions)

    def take_model(self, model: onnx.ModelProto) -> None:
        """Adopt the nodes, new constants and opsets of a model produced by ``as_model`` and an onnx tool."""
        for t in model.graph.initializer:
            if t.name not in self.consts:
                self.consts[t.name] = numpy_helper.to_array(t)
        self.nodes = list(model.graph.node)
        self.inputs = [i for i in model.graph.input if i.name not in self.consts]
        self.opsets = _opsets(model)
        self.functions = list(model.functions)


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    """Opset version per domain, with the default domain spelled ``""`` (never ``"ai.onnx"``)."""
    return {"" if o.domain == "ai.onnx" else o.domain: o.version for o in model.opset_import}


def upgrade(work: Work) -> None:
    """Inline local functions and bring the default-domain opset to ``MIN_OPSET``, so rules see one op set."""
    opset = work.opsets.get("", 0)
    if not work.functions and opset >= MIN_OPSET:
        return
    model = work.as_model()
    if work.functions:
        model = onnx.inliner.inline_local_functions(model)
    if opset < MIN_OPSET:
        if "" not in work.opsets:
            model.opset_import.append(helper.make_opsetid("", MIN_OPSET))
        else:
            try:
                model = onnx.version_converter.convert_version(model, MIN_OPSET)
            except Exception as e:  # the converter raises RuntimeError/ConvertError for missing adapters
                raise ModelError(
                    f"{work.where}: cannot convert opset {opset} to {MIN_OPSET} ({one_line(e)}). "
                    f"Re-export the model at opset >= {MIN_OPSET}."
                ) from e
    work.take_model(model)
    work.ir_version = max(work.ir_version, helper.find_min_ir_version_for(model.opset_import, True))


def run_checker(work: Work, where: str) -> None:
    """Run onnx.checker on the model with its large weights as typed inputs.

    The checker serializes the whole model (5 s and another copy of the weights for BERT-Large); the graph's
    validity does not depend on the weights' values, whose sizes were checked when they were converted.
    """
    try:
        onnx.checker.check_model(work.as_model(declared_outputs=True))
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{where}: fails the ONNX checker: {one_line(e)}. Fix the model or re-export it.") from e


def static_type(type_proto: onnx.TypeProto) -> TensorType | None:
    """The TensorType of a fully known tensor type; None for dynamic shapes, unknown dtypes, non-tensors."""
    if not type_proto.HasField("tensor_type"):
        return None
    tensor = type_proto.tensor_type
    if not tensor.elem_type or not tensor.HasField("shape"):
        return None
    if not all(d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    return TensorType(tuple(d.dim_value for d in tensor.shape.dim), dtype)
