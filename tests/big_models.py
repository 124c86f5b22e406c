"""Large models with external data, and the peak memory of a command: for the streaming tests and
``benchmarks/memory.py``.

A plain module, imported by tests and the benchmark; nothing here is collected by pytest.

The models are written one weight at a time straight into the external data file, so making a 1 GiB model
never holds more than one weight in memory (test machines have little memory to spare).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["MlpModel", "Peak", "peak_rss_bytes", "write_external_fanout", "write_external_mlp"]

# Runs the unity-eq CLI in this fresh interpreter (arguments as given) and prints its peak RSS: the process's
# own (reading, lowering, writing, running) and its children's (the e-graph worker). The own peak is VmHWM,
# the high-water mark of the process's memory since exec: ru_maxrss would also count the RSS of the parent
# it was forked from (Linux keeps it across exec), so a large parent would raise every measurement.
_MEASURE = """
import json, resource, sys
from unity_eq.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
with open("/proc/self/status") as status:
    hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": rc, "self": hwm * 1024, "children": children * 1024}))
"""


@dataclass(frozen=True)
class MlpModel:
    """What :func:`write_external_mlp` wrote: the model file and its weights' sizes."""

    path: Path
    weight_bytes: int
    largest_tensor_bytes: int


def write_external_mlp(folder: Path, hidden: int, ffn: int, pairs: int, batch: int = 8, seed: int = 0) -> MlpModel:
    """``pairs`` blocks of ``MatMul(hidden→ffn) → Relu → MatMul(ffn→hidden) → Relu`` (float32, no biases),
    every weight in ``model.onnx.data``; weights are normal samples times 1/sqrt(fan_in), so values stay
    of order one through the layers. Weights are generated and written one at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    data_name = "model.onnx.data"
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    initializers: list[TensorProto] = []
    largest = offset = 0
    current = "x"
    with (folder / data_name).open("wb") as data:
        for i in range(2 * pairs):
            rows, cols = (hidden, ffn) if i % 2 == 0 else (ffn, hidden)
            weight = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(rows)).astype("<f4")
            nbytes = weight.nbytes
            data.write(weight.tobytes())
            del weight
            initializers.append(_external_tensor(f"w{i}", (rows, cols), data_name, offset, nbytes))
            offset += nbytes
            largest = max(largest, nbytes)
            nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"], name=f"layer{i}.matmul"))
            out = "y" if i == 2 * pairs - 1 else f"h{i}"
            nodes.append(helper.make_node("Relu", [f"mm{i}"], [out], name=f"layer{i}.relu"))
            current = out
    graph = helper.make_graph(
        nodes,
        "external_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, hidden])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    path = folder / "model.onnx"
    onnx.save_model(model, path)  # the initializers already point into model.onnx.data
    return MlpModel(path, offset, largest)


def write_external_fanout(folder: Path, hidden: int, width: int, branches: int, batch: int = 8) -> MlpModel:
    """``y_i = MatMul(x, w_i)`` for ``branches`` weights of ``hidden × width`` (float32, external data): the
    shape of q, k and v projections, which the shipped merge rules turn into one MatMul over
    ``Concat(w_0, w_1, …)``: a weight that lowering computes, not slices."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    initializers, nodes, offset = [], [], 0
    with (folder / "model.onnx.data").open("wb") as data:
        for i in range(branches):
            weight = (rng.standard_normal((hidden, width), dtype=np.float32) / np.sqrt(hidden)).astype("<f4")
            data.write(weight.tobytes())
            initializers.append(_external_tensor(f"w{i}", (hidden, width), "model.onnx.data", offset, weight.nbytes))
            offset += weight.nbytes
            nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"proj{i}"))
    graph = helper.make_graph(
        nodes,
        "external_fanout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, hidden])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [batch, width]) for i in range(branches)],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save_model(model, folder / "model.onnx")
    return MlpModel(folder / "model.onnx", offset, offset // branches)


def _external_tensor(name: str, dims: tuple[int, int], location: str, offset: int, length: int) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


@dataclass(frozen=True)
class Peak:
    """Peak resident memory (bytes) of one unity-eq command: its own process, and its largest child."""

    self_bytes: int
    children_bytes: int


def peak_rss_bytes(args: list[str], timeout: float = 600) -> Peak:
    """Run ``unity-eq ARGS`` in a fresh interpreter and return its peak RSS (Linux only: ``VmHWM`` and
    ``ru_maxrss``).
    Raises ``AssertionError`` with its output when the command fails."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"unity-eq {args} failed: {proc.stdout[-1000:]} {proc.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert result["rc"] in (0, None), f"unity-eq {args} exited {result['rc']}: {proc.stderr[-2000:]}"
    return Peak(int(result["self"]), int(result["children"]))
