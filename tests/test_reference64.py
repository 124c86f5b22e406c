"""`check`'s second opinion: an output that mismatches the float32 reference is judged against the original model
run in float64 (unity_eq/runtime/reference64.py), so a plan that reduces in another order — more accurately
than onnxruntime's one long float32 sum — is not called wrong, and a wrong plan still is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from unity_eq.runtime.checker import compare_outputs, second_opinion
from unity_eq.runtime.reference64 import Float64Reference

N = 1 << 22  # 4M values uniform in ±100: their mean is near 0, and onnxruntime's float32 mean is off by ~2e-5


def _mean_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["X"], ["Y"], keepdims=0)],
        "mean",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_an_accurate_output_passes_against_float64_and_a_wrong_one_still_fails(tmp_path: Path) -> None:
    model = _mean_model(tmp_path / "mean.onnx")
    x = np.random.default_rng(0).uniform(-100, 100, N).astype(np.float32)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = {"Y": session.run(None, {"X": x})[0]}
    exact = x.astype(np.float64).mean()
    tolerance = 1e-6
    accurate = {"Y": np.asarray(exact, np.float32)}  # what a plan of partial means gives, to float32 rounding
    first = compare_outputs(expected, accurate, tolerance).outputs
    assert not first[0].passed  # the float32 reference is the inaccurate side at this tolerance
    judged = second_opinion(first, Float64Reference(model), {"X": x}, accurate, tolerance)
    assert judged[0].passed and judged[0].reference == "float64"
    assert judged[0].float32_error == first[0].relative_error
    wrong = {"Y": np.asarray(exact * 1.01, np.float32)}
    judged = second_opinion(
        compare_outputs(expected, wrong, tolerance).outputs, Float64Reference(model), {"X": x}, wrong, tolerance
    )
    assert not judged[0].passed and judged[0].reference == ""


def test_the_float64_model_runs_in_float64_and_an_unreadable_one_gives_no_opinion_with_a_reason(
    tmp_path: Path,
) -> None:
    model = _mean_model(tmp_path / "mean.onnx")
    reference = Float64Reference(tmp_path / "missing.onnx")  # unreadable: no second opinion, with the reason
    assert reference.run({"X": np.zeros(N, np.float32)}, ["Y"]) is None
    assert reference.reason
    assert Float64Reference(model).run({"X": np.ones(N, np.float32)}, ["Y"]) == {"Y": np.float64(1.0)}
