"""The command line as a user meets it: the main job, and every bad input gets one clear line, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper


def _assert_clean_error(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_optimize_run_check(examples: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "4", "-o", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "predicted cost" in proc.stdout and "x=4" in proc.stdout
    inputs = tmp_path / "in.npz"
    np.savez(inputs, X=np.random.default_rng(0).standard_normal((8, 128, 256)).astype(np.float32))
    proc = run_cli("run", str(plan), "--inputs", str(inputs), "--outputs", str(tmp_path / "out.npz"))
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "out.npz") as out:
        assert out["Y"].shape == (8, 128, 256)
    proc = run_cli("check", str(examples / "mlp.onnx"), str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "match" in proc.stdout


def test_check_fails_against_another_model(examples: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    assert run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(plan), "-q").returncode == 0
    other = tmp_path / "other.onnx"
    model = onnx.load(str(examples / "mlp.onnx"))
    for init in model.graph.initializer:
        if init.name == "fc2.bias":
            init.CopyFrom(onnx.numpy_helper.from_array(np.ones(256, np.float32), "fc2.bias"))
    onnx.save(model, str(other))
    proc = run_cli("check", str(other), str(plan))
    assert proc.returncode == 1
    # the same architecture (fingerprint) with another fc2.bias: the weight comparison catches it first
    assert "weight 'fc2.bias' (of the model's 'fc2.bias') differs from the model's slice" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_file(tmp_path: Path) -> None:
    _assert_clean_error(run_cli("optimize", str(tmp_path / "nope.onnx"), "--devices", "2"), "nope.onnx")


def test_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    _assert_clean_error(run_cli("optimize", str(path), "--devices", "2"), "corrupt.onnx")


def test_not_onnx(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n")
    _assert_clean_error(run_cli("optimize", str(path), "--devices", "2"), "notes.onnx")


def test_model_failing_the_checker(tmp_path: Path) -> None:
    node = helper.make_node("Relu", ["undefined"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    _assert_clean_error(run_cli("optimize", str(path), "--devices", "2"), "bad.onnx")


def _dynamic_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


def test_dynamic_shape_needs_input_shape(tmp_path: Path) -> None:
    model = _dynamic_model(tmp_path / "dyn.onnx")
    _assert_clean_error(run_cli("optimize", str(model), "--devices", "2"), "'x'", "--input-shape")
    proc = run_cli("optimize", str(model), "--devices", "2", "--input-shape", "x=8x16", "-o", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr
    assert run_cli("check", str(model), str(tmp_path / "p")).returncode == 0


def test_zero_devices(examples: Path) -> None:
    _assert_clean_error(run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "0"), "--devices")


def test_output_directory_that_is_a_file(examples: Path, tmp_path: Path) -> None:
    target = tmp_path / "plan"
    target.write_text("precious")
    _assert_clean_error(run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(target)), "file")
    assert target.read_text() == "precious"


def test_non_plan_directory_is_not_overwritten(examples: Path, tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    _assert_clean_error(run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(target)))
    assert (target / "notes.txt").read_text() == "keep me"


def test_failed_optimize_leaves_no_partial_plan(examples: Path, tmp_path: Path) -> None:
    """A run that dies in the e-graph engine (here: a memory limit nothing fits in) writes nothing, and an
    existing plan at the target stays as it was."""
    target = tmp_path / "plan"
    proc = run_cli(
        "optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(target), "--memory-limit", "0.05"
    )
    _assert_clean_error(proc, "memory")
    assert not target.exists()
    assert not list(tmp_path.glob(".plan*"))
    assert run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(target), "-q").returncode == 0
    before = (target / "plan.json").read_text()
    proc = run_cli(
        "optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(target), "--memory-limit", "0.05"
    )
    assert proc.returncode != 0
    assert (target / "plan.json").read_text() == before
    assert json.loads(before)["mesh"]["sizes"] == [2]


def test_run_errors(examples: Path, tmp_path: Path) -> None:
    _assert_clean_error(run_cli("run", str(tmp_path / "missing")), "missing")
    plan = tmp_path / "plan"
    assert run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "-o", str(plan), "-q").returncode == 0
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros((2, 2), np.float32))
    _assert_clean_error(run_cli("run", str(plan), "--inputs", str(bad)), "'X'", "shape")
    (plan / "device_1.onnx").unlink()
    _assert_clean_error(run_cli("run", str(plan)), "device_1.onnx")


def test_bad_mesh_and_objective(examples: Path) -> None:
    _assert_clean_error(run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "4", "--mesh", "3x2"), "--mesh")
    _assert_clean_error(
        run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "4", "--objective", "fast"),
        "--objective",
    )


@pytest.mark.parametrize("verb", ["optimize", "run", "check"])
def test_help(verb: str) -> None:
    proc = run_cli(verb, "--help")
    assert proc.returncode == 0 and "Usage" in proc.stdout
