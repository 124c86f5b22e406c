"""Weightless planning: a model is planned from its weights' dtypes and shapes alone.

Absent external data (no file, a file cut short, a ModelProto passed without its data) plans; lowering and
`check` refuse it with one line; `optimize --plan-only` writes plan.json alone, which `explain` reads and
`run`/`check` refuse; external bfloat16 weights are memory-mapped, not read; initializers that are also graph
inputs (IR 3 style) are weights. Models are built here with onnx.helper, their data written with onnx's
helpers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from unity_eq.driver import optimize
from unity_eq.errors import ModelError, OptionError
from unity_eq.frontends.onnx import load_onnx
from unity_eq.lower import lower, write_plan_dir

HIDDEN = 64


def _mlp(dtype: int = TensorProto.FLOAT, weights_as_inputs: bool = False) -> onnx.ModelProto:
    """``x @ w1 → Relu → @ w2ᵀ`` (the transpose of a weight is folded at load), weights of ``dtype``.
    ``weights_as_inputs`` also lists the weights as graph inputs, as IR 3 exporters did."""
    rng = np.random.default_rng(0)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    w1 = numpy_helper.from_array(rng.standard_normal((HIDDEN, 4 * HIDDEN)).astype(np_dtype), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((HIDDEN, 4 * HIDDEN)).astype(np_dtype), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]),
        helper.make_node("MatMul", ["r", "w2t"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", dtype, [8, HIDDEN])]
    if weights_as_inputs:
        inputs += [helper.make_tensor_value_info(w.name, dtype, list(w.dims)) for w in (w1, w2)]
    graph = helper.make_graph(nodes, "mlp", inputs, [helper.make_tensor_value_info("y", dtype, [8, HIDDEN])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _save_external(model: onnx.ModelProto, folder: Path) -> Path:
    """Save ``model`` with every weight in ``model.data`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="model.data", size_threshold=0)
    return path


def _is_shape_only(array: np.ndarray) -> bool:
    return all(s == 0 for s in array.strides)


def _assert_one_error(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------------------------------ absent data


def test_a_file_cut_short_plans_the_weights_past_its_end_shape_only(tmp_path: Path) -> None:
    path = _save_external(_mlp(), tmp_path)
    data = tmp_path / "model.data"
    w1_bytes = HIDDEN * 4 * HIDDEN * 4  # w1 is written first
    with data.open("r+b") as f:
        f.truncate(w1_bytes)
    graph = load_onnx(path)
    assert not _is_shape_only(graph.initializers["w1"])
    assert set(graph.missing_weights) == {"w2t"}  # w2 is gone: folded into its transpose, shape-only too
    assert _is_shape_only(graph.initializers["w2t"]) and graph.initializers["w2t"].shape == (4 * HIDDEN, HIDDEN)
    assert "'w2', whose data is missing" in graph.missing_weights["w2t"]
    assert f"past the end of 'model.data' ({w1_bytes} bytes)" in graph.missing_weights["w2t"]


def test_absent_data_plans_as_the_data_would(tmp_path: Path) -> None:
    """The plan of a model without its data is the plan of the model with it: only shapes are priced."""
    path = _save_external(_mlp(), tmp_path)
    with_data = optimize(path, devices=2, objective="training")
    (tmp_path / "model.data").unlink()
    without = optimize(path, devices=2, objective="training")
    assert str(without.plan.mesh) == str(with_data.plan.mesh)
    assert without.plan.cost.total == pytest.approx(with_data.plan.cost.total)
    assert without.plan.report.memory == with_data.plan.report.memory


def test_lowering_refuses_absent_data_before_writing(tmp_path: Path) -> None:
    path = _save_external(_mlp(), tmp_path / "m")
    (tmp_path / "m" / "model.data").unlink()
    with pytest.raises(ModelError, match=r"weight 'w1' has no data \(external data file 'model.data' not found"):
        optimize(path, devices=2, output_dir=tmp_path / "plan")
    assert not (tmp_path / "plan").exists()
    planned = optimize(path, devices=2, mesh="2")  # the API's own lowering refuses it too
    with pytest.raises(ModelError, match=r"weight 'w1' has no data"):
        lower(planned.plan, planned.graph)
    with pytest.raises(ModelError, match=r"weight 'w1' has no data"):
        write_plan_dir(lower(planned.plan, planned.graph, plan_only=True), tmp_path / "plan")
    assert not (tmp_path / "plan").exists()


# ------------------------------------------------------------------------------------------ plan-only


def test_plan_only_api_writes_plan_json_alone(tmp_path: Path) -> None:
    path = _save_external(_mlp(), tmp_path / "m")
    (tmp_path / "m" / "model.data").unlink()
    result = optimize(path, devices=2, output_dir=tmp_path / "plan", plan_only=True)
    assert result.plan_dir == (tmp_path / "plan").resolve()
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["plan.json"]
    meta = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert meta["plan_only"] is True
    assert meta["files"] == ["device_0.onnx", "device_1.onnx"]  # what a full optimize writes
    assert meta["memory"]["weight_bytes_per_rank"] == []


def test_plan_only_cli_explain_and_refusals(tmp_path: Path) -> None:
    path = _save_external(_mlp(), tmp_path / "m")
    (tmp_path / "m" / "model.data").unlink()
    plan = tmp_path / "plan"
    proc = run_cli("optimize", str(path), "-n", "2", "--mesh", "2", "-q", "-o", str(plan))
    _assert_one_error(proc, "weight 'w1' has no data", "`--plan-only`")
    assert not plan.exists()

    proc = run_cli("optimize", str(path), "-n", "2", "--mesh", "2", "-q", "-o", str(plan), "--plan-only")
    assert proc.returncode == 0, proc.stderr
    assert "plan.json only" in proc.stdout
    assert [p.name for p in plan.iterdir()] == ["plan.json"]

    proc = run_cli("explain", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "plan only: `optimize --plan-only` wrote plan.json alone" in proc.stdout
    proc = run_cli("explain", str(plan), "--format", "svg", "-o", str(tmp_path / "plan.svg"))
    assert proc.returncode == 0, proc.stderr
    if shutil.which("dot"):
        assert (tmp_path / "plan.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    else:  # a fresh machine without graphviz (the README's test command): the DOT text, and how to draw it
        assert "digraph plan {" in (tmp_path / "plan.dot").read_text()
        assert "`dot` program was not found" in proc.stderr

    for verb in (["run", str(plan)], ["check", str(path), str(plan)]):
        _assert_one_error(run_cli(*verb), "plan-only plan", "has no device files", "without `--plan-only`")


def test_check_refuses_a_model_whose_data_is_absent(tmp_path: Path) -> None:
    path = _save_external(_mlp(), tmp_path / "m")
    plan = tmp_path / "plan"
    optimize(path, devices=2, mesh="2", output_dir=plan)
    (tmp_path / "m" / "model.data").unlink()
    _assert_one_error(run_cli("check", str(path), str(plan)), "weight 'w1' has no data", "`check` runs the original")


# ------------------------------------------------------------------------------------------ dtypes, protos


def test_bfloat16_external_data_is_memory_mapped(tmp_path: Path) -> None:
    model = _mlp(TensorProto.BFLOAT16)
    expected = numpy_helper.to_array(model.graph.initializer[0])
    graph = load_onnx(_save_external(model, tmp_path))
    w1 = graph.initializers["w1"]
    assert isinstance(w1, np.memmap) and w1.dtype == ml_dtypes.bfloat16  # mapped, not read
    np.testing.assert_array_equal(w1, expected)
    assert graph.types["w1"].dtype == "bfloat16" and not graph.missing_weights


def test_an_in_memory_model_is_planned_and_left_unchanged(tmp_path: Path) -> None:
    model = _mlp()
    before = model.SerializeToString()
    from_memory = optimize(model, devices=2, mesh="2", output_dir=tmp_path / "plan")
    assert model.SerializeToString() == before
    from_file = optimize(_save_external(_mlp(), tmp_path / "m"), devices=2, mesh="2")
    assert from_memory.plan.cost.total == pytest.approx(from_file.plan.cost.total)
    assert (tmp_path / "plan" / "device_1.onnx").exists()


def test_an_in_memory_model_without_its_external_data_plans_shape_only(tmp_path: Path) -> None:
    path = _save_external(_mlp(), tmp_path)
    model = onnx.load(path, load_external_data=False)
    graph = load_onnx(model)
    assert set(graph.missing_weights) == {"w1", "w2t"}
    assert "passed in memory" in graph.missing_weights["w1"]
    with pytest.raises(ModelError, match=r"'mlp' \(in memory\): not an ONNX model"):
        model.ClearField("opset_import")
        load_onnx(model)


# ------------------------------------------------------------------------------------------ weights as inputs


def test_initializers_listed_as_graph_inputs_are_weights(tmp_path: Path) -> None:
    """IR 3 exporters list every weight as a graph input too: still weights (optimizer state, gradient
    all-reduce), not activations; the model's only input is x."""
    old_style = optimize(_mlp(weights_as_inputs=True), devices=2, mesh="2", objective="training")
    assert list(old_style.graph.inputs) == ["x"] and {"w1", "w2t"} <= set(old_style.graph.initializers)
    plain = optimize(_mlp(), devices=2, mesh="2", objective="training")
    memory, expected = old_style.plan.report.memory, plain.plan.report.memory
    assert memory is not None and memory.weight_state_bytes > 0
    assert memory == expected


def _parameters_as_inputs() -> onnx.ModelProto:
    """The MLP exported with its parameters as graph inputs and no initializers (``export_params=False``)."""
    model = _mlp(weights_as_inputs=True)
    del model.graph.initializer[:]
    return model


def test_weight_inputs_are_planned_as_weights(tmp_path: Path) -> None:
    """Without `--weight-input` parameters given as inputs are activations: no optimizer state. Declared,
    they are priced as the same model's initializers are, and only a plan-only plan is made of them."""
    as_inputs = optimize(_parameters_as_inputs(), devices=2, mesh="2", objective="training")
    memory = as_inputs.plan.report.memory
    assert memory is not None and memory.weight_state_bytes == 0
    declared = optimize(_parameters_as_inputs(), devices=2, mesh="2", objective="training", weight_inputs=["w1", "w2"])
    initializers = optimize(_mlp(), devices=2, mesh="2", objective="training")
    assert list(declared.graph.inputs) == ["x"]
    assert declared.plan.report.memory == initializers.plan.report.memory
    assert declared.plan.cost.total == pytest.approx(initializers.plan.cost.total)
    with pytest.raises(ModelError, match=r"weight 'w1' has no data \(a model input declared a weight by"):
        optimize(_parameters_as_inputs(), devices=2, weight_inputs=["w1", "w2"], output_dir=tmp_path / "plan")


def test_weight_input_must_name_a_model_input() -> None:
    with pytest.raises(OptionError, match=r"`--weight-input w3`: the model has no input 'w3'; its inputs are"):
        load_onnx(_parameters_as_inputs(), weight_inputs=["w3"])


def test_a_pytorch_model_on_the_meta_device_is_planned_without_weights(tmp_path: Path) -> None:
    import torch

    from unity_eq.frontends.torch_meta import ABSENT_SUFFIX, export_meta

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(512, 2048)
            self.down = torch.nn.Linear(2048, 512)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(x)))

    with torch.device("meta"):
        module = Mlp()
    path = export_meta(module, (torch.empty(4, 16, 512, device="meta"),), tmp_path / "mlp.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]  # no weight bytes anywhere
    model = onnx.load(path, load_external_data=False)
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"mlp.onnx" + ABSENT_SUFFIX}
    graph = load_onnx(path)
    # the weights keep their real shapes: 512·2048 + 2048 + 2048·512 + 512 float32 elements, none in memory
    assert sum(w.size * w.itemsize for w in graph.initializers.values()) == (512 * 2048 + 2048 + 2048 * 512 + 512) * 4
    assert set(graph.missing_weights) == set(graph.initializers)
    assert all(0 in w.strides or w.size <= 1 for w in graph.initializers.values())
    result = optimize(path, devices=4, plan_only=True, output_dir=tmp_path / "plan", objective="training")
    assert result.plan.report.memory is not None and result.plan.report.memory.fits
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["plan.json"]
    with pytest.raises(ModelError, match=r"absent|missing"):
        optimize(path, devices=4, output_dir=tmp_path / "lowered")
