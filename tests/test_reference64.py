"""`check`'s second opinion: an output that mismatches the float32 reference is judged against the original model
run in float64 (unity_eq/runtime/reference64.py), so a plan that reduces in another order — more accurately
than onnxruntime's one long float32 sum — is not called wrong, and a wrong plan still is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from unity_eq.runtime.checker import second_opinion
from unity_eq.runtime.comparison import compare_outputs
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


def test_the_report_gives_the_figures_the_float64_model_measured(tmp_path: Path) -> None:
    """Not a claim ("the plan is the more accurate side") but what was measured: the plan's error and
    onnxruntime's float32 error, each against the float64 model, and the plan against onnxruntime."""
    from unity_eq.runtime.comparison import CheckResult

    model = _mean_model(tmp_path / "mean.onnx")
    x = np.random.default_rng(0).uniform(-100, 100, N).astype(np.float32)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = {"Y": session.run(None, {"X": x})[0]}
    exact = x.astype(np.float64).mean()
    accurate = {"Y": np.asarray(exact, np.float32)}
    first = compare_outputs(expected, accurate, 1e-6).outputs
    judged = second_opinion(first, Float64Reference(model), {"X": x}, accurate, 1e-6, expected)
    o = judged[0]
    # onnxruntime's own error against float64, computed here the same way: |ort − exact| / |exact|
    ort_error = abs(float(expected["Y"]) - exact) / abs(exact)
    plan_error = abs(float(accurate["Y"]) - exact) / abs(exact)
    assert o.onnxruntime_error == pytest.approx(ort_error) and o.float64_error == pytest.approx(plan_error)
    assert o.onnxruntime_error > 1e-6 > o.float64_error  # the measured figures, not an assumption, say who is off
    text = CheckResult(judged, 1e-6).describe()
    assert f"plan off by {plan_error:.2e}" in text and f"onnxruntime's float32 result off by {ort_error:.2e}" in text
    assert "more accurate side" not in text
    # a wrong plan: the figures are reported too, and say it is beyond tolerance of float64
    wrong = {"Y": np.asarray(exact * 1.01, np.float32)}
    judged = second_opinion(
        compare_outputs(expected, wrong, 1e-6).outputs, Float64Reference(model), {"X": x}, wrong, 1e-6, expected
    )
    assert not judged[0].passed and judged[0].float64_error == pytest.approx(0.01, rel=1e-3)
    assert "beyond tolerance of the float64 result" in CheckResult(judged, 1e-6).describe()
