"""onnxruntime sessions: opening a model (``make_session``) and telling a model onnxruntime cannot run on a
provider from one it refuses (``missing_kernel``).

Here, below both, because lowering opens every device file it writes (``lower.device.validate_device_file``:
``optimize`` never reports a plan that cannot load) and the runtime runs them (``unity_eq.runtime``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

__all__ = ["MissingKernel", "make_session", "missing_kernel"]

_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def make_session(
    model: onnx.ModelProto | bytes | str,
    providers: list[Any],
    threads: int = 0,
    external_folder: Path | None = None,
    prepack: bool = True,
) -> Any:
    """An onnxruntime session of a model (a proto, its bytes or a path). A model given in memory whose
    weights are external data reads them from ``external_folder`` (its files are read by onnxruntime, never
    copied through Python). ``prepack=False`` keeps onnxruntime from copying weights into its packed
    layouts: external weights then stay memory-mapped and unread, for a session that only checks a model
    loads (a 256 MiB device file costs 8 MiB instead of 300)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # warnings of the process-wide logger (e.g. about plugin EPs) are noise
    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors come back as exceptions; onnxruntime's own log lines are noise
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if external_folder is not None:
        options.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(external_folder))
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    payload = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(payload, options, providers=providers)


#: onnxruntime's words when a provider has no kernel for an op at the types the model uses (bfloat16 MatMul on
#: the CPU): the model is valid, this provider cannot run it.
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")


@dataclass(frozen=True)
class MissingKernel:
    """An op onnxruntime has no kernel for on the providers tried, and the element type it was asked for."""

    op: str
    node: str
    dtype: str  # "" when the node's inputs have no known type

    def describe(self, where: str = "CPU") -> str:
        kind = f"{self.dtype} kernel" if self.dtype else "kernel at this model's types"
        node = f" (node {self.node!r})" if self.node else ""
        return f"onnxruntime's {where} provider has no {kind} for {self.op}{node}"


def missing_kernel(exc: BaseException, model: onnx.ModelProto | str | Path | None = None) -> MissingKernel | None:
    """The op and dtype of onnxruntime's "no implementation" error, or None for any other error.

    Such a model is valid (``onnx.checker`` passes); it needs a provider that implements the op at its type:
    onnxruntime's CPU provider has no bfloat16 arithmetic at all (MatMul, Add, Mul, Relu, LayerNormalization),
    its CUDA provider has. ``model`` (a proto or a path, read without its external data) lets the dtype of the
    node's first input be named."""
    found = _NO_KERNEL.search(str(exc))
    if found is None:
        return None
    op, name = found.group(1), found.group(3)
    return MissingKernel(op, name, _node_input_dtype(model, op, name) if model is not None else "")


def _node_input_dtype(model: onnx.ModelProto | str | Path, op: str, name: str) -> str:
    """The element type of the first input of the node ``name`` (the first ``op`` node when unnamed)."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # shape inference rejects the model: the types the file already gives are used
        inferred = proto
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        if node.op_type == op and (node.name == name or not name) and node.input:
            elem = types.get(node.input[0], 0)
            return onnx.TensorProto.DataType.Name(elem).lower() if elem else ""
    return ""
