"""A second opinion for ``check``: the original model run in float64.

A plan may compute a long float32 reduction in a different order than onnxruntime does on the original
model (a mean over a sharded dimension: each device's partial means, then their mean), and onnxruntime's
float32 result is then not always the accurate side: over millions of terms with cancellation its error can
exceed any useful tolerance while the plan's is small. When an output mismatches, ``check`` asks for this
reference — the same graph with every float32 tensor made float64 — and judges the plan against it. The
conversion is exact (float32 values are float64 values); when onnxruntime has no float64 kernel for an op, or
the model has subgraphs, there is no second opinion and the float32 verdict stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from unity_eq.runtime.devices import run_in_batches

__all__ = ["Float64Reference", "widen_to_float64"]

_FLOAT, _DOUBLE = TensorProto.FLOAT, TensorProto.DOUBLE


def _widen_type(value: onnx.ValueInfoProto) -> None:
    tensor = value.type.tensor_type
    if tensor.elem_type == _FLOAT:
        tensor.elem_type = _DOUBLE


def _widen_tensor(tensor: TensorProto) -> TensorProto:
    if tensor.data_type != _FLOAT:
        return tensor
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)


def widen_to_float64(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model with float32 made float64 everywhere, or None when it cannot be (a subgraph)."""
    graph = model.graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return None
            if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == _FLOAT:
                attr.i = _DOUBLE
            if attr.type == onnx.AttributeProto.TENSOR:
                attr.t.CopyFrom(_widen_tensor(attr.t))
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:
            _widen_type(value)
    widened = [_widen_tensor(t) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(widened)
    return model


class Float64Reference:
    """The original model in float64, built on first use; ``run`` returns None when there is none."""

    def __init__(self, model_path: str | Path) -> None:
        self.model_path = Path(model_path)
        self._session: Any = None
        self._failed = False
        self.reason = ""  # why there is no second opinion, when there is none

    def _load(self) -> Any:
        if self._session is None and not self._failed:
            import onnxruntime as ort

            try:
                model = widen_to_float64(onnx.load(self.model_path))
                if model is None:
                    self._failed, self.reason = True, "the model has subgraphs"
                    return None
                self._session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            except Exception as exc:  # no float64 kernel or a type clash: no second opinion
                self._failed, self.reason = True, _first_line(exc)
        return self._session

    def run(self, inputs: Mapping[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray] | None:
        session = self._load()
        if session is None:
            return None
        feeds = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in inputs.items()}
        try:
            values = run_in_batches(session, output_names, feeds)
        except Exception as exc:  # as above: the float32 verdict stands
            self.reason = _first_line(exc)
            return None
        return dict(zip(output_names, values, strict=True))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
