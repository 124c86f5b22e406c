"""One-node ONNX models: the model that runs a :class:`~unity_eq.profile.instances.ProfiledOp` (random
activations, its weights where known), and the calibration's large MatMul and Add."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from unity_eq.dtypes import as_dtype, is_float
from unity_eq.ops.registry import ONNX_NAMESAKES
from unity_eq.profile.instances import ProfiledOp

OPSET = 18


def _onnx_dtype(dtype: str) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def single_op_model(
    instance: ProfiledOp,
    weights: Mapping[int, np.ndarray],
    rng: np.random.Generator,
    opsets: Mapping[str, int] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model running ``instance``, and the feeds of its activation inputs. Refused (ValueError, the
    reason the table's ``skipped`` keeps) for a term that shares its name, not its meaning, with an ONNX op
    (Attention: keys transposed): its node would run ONNX's op; ``--framework torch`` times it as trained."""
    if not instance.domain and instance.op in ONNX_NAMESAKES:
        raise ValueError(
            f"the {instance.op} term means something else than ONNX's {instance.op} op, so it has no one-node "
            "ONNX model; the roofline prices it (`--framework torch` times it as the torch backend runs it)"
        )
    names: list[str] = []
    graph_inputs, initializers = [], []
    feeds: dict[str, np.ndarray] = {}
    for position, spec in enumerate(instance.inputs):
        name = f"in{position}"
        if spec.kind == "absent":
            names.append("")
            continue
        names.append(name)
        if spec.kind == "constant":
            initializers.append(numpy_helper.from_array(np.asarray(spec.value, dtype=np.int64), name))
            continue
        value = weights.get(position)
        if value is None:
            value = _random(spec.shape, spec.dtype, rng)
        if spec.kind == "weight":
            initializers.append(numpy_helper.from_array(value, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _onnx_dtype(spec.dtype), list(spec.shape)))
            feeds[name] = value
    outputs = [f"out{k}" for k in range(instance.outputs)]
    attrs: dict[str, Any] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in instance.attrs}
    attrs = {k: v for k, v in attrs.items() if not (isinstance(v, list) and not v)}
    node = helper.make_node(instance.op, names, outputs, domain=instance.domain or None, **attrs)
    graph = helper.make_graph(
        [node],
        f"profile.{instance.op}",
        graph_inputs,
        [
            helper.make_tensor_value_info(o, _onnx_dtype(d), None)
            for o, d in zip(outputs, instance.output_dtypes, strict=True)
        ],
        initializer=initializers,
    )
    versions = {"": OPSET, **(opsets or {})}
    if instance.domain and instance.domain not in ("", "ai.onnx"):
        versions.setdefault(instance.domain, 1)
    imports = [helper.make_opsetid(domain, version) for domain, version in versions.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=9), feeds


def _random(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    kind = as_dtype(dtype).kind
    if is_float(dtype):
        return rng.standard_normal(tuple(shape)).astype(as_dtype(dtype))
    if kind == "b":
        return rng.random(tuple(shape)) < 0.5
    return np.zeros(tuple(shape), dtype=dtype)  # integers index things: 0 is always in range


def matmul_model(n: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    b = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])],
        "calibrate.matmul",
        [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [n, n])],
        initializer=[b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    return model, {"A": rng.standard_normal((n, n)).astype(np.float32)}


def add_model(elements: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    one = numpy_helper.from_array(np.ones((1,), np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "one"], ["Y"])],
        "calibrate.add",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [elements])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [elements])],
        initializer=[one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    return model, {"X": np.random.default_rng(0).standard_normal(elements).astype(np.float32)}


def attention_model(b: int, h: int, s: int, d: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ONNX's own fused ``Attention`` (opset 23) on float32 (b, h, s, d) Q, K and V: the kernel the
    calibration's ``attention`` efficiency is measured on in onnxruntime."""
    from unity_eq.ops.attention import ONNX_ATTENTION_OPSET

    shape = [b, h, s, d]
    graph = helper.make_graph(
        [helper.make_node("Attention", ["Q", "K", "V"], ["Y"])],
        "calibrate.attention",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name in "QKV"],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_ATTENTION_OPSET)], ir_version=10)
    rng = np.random.default_rng(0)
    return model, {name: rng.standard_normal(shape).astype(np.float32) for name in "QKV"}
