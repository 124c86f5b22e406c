"""`check` catches subtly wrong plans, and lowering writes device files that are valid, named and identified.

Faults are injected into real lowered device files (a Clip on a rank's input, one weight moved by 1%); the
plans come from the real pipeline (egglog, cost model, lowering) and run in onnxruntime.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unity_eq import optimize
from unity_eq.cli import main
from unity_eq.cost import ZERO
from unity_eq.errors import InternalError, OptionError
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Graph, Mesh, Shard, TensorType
from unity_eq.ir import Replicate as R
from unity_eq.lower import META_COLLECTIVES, META_COORDS, META_PLAN_HASH, META_RANK, lower, write_plan_dir
from unity_eq.machine import default_machine
from unity_eq.plan import AllGather, Compute, LoadInput, LoadWeight, Plan, PlanTensor, Slice
from unity_eq.runtime import InputDraw, check, run_plan
from unity_eq.runtime.input_ranges import integer_input_ranges


@pytest.fixture(scope="module")
def mlp_plan(examples: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Megatron-style plan of the MLP example on 2 devices (an all-reduce and an all-gather)."""
    out = tmp_path_factory.mktemp("mlp") / "plan"
    result = optimize(examples / "mlp.onnx", devices=2, objective="training", output_dir=out)
    assert result.plan.collectives(), "the fault-injection tests need a sharded plan"
    return out


def _copy(plan: Path, tmp_path: Path) -> Path:
    target = tmp_path / "plan"
    shutil.copytree(plan, target)
    return target


def _edit(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(str(path))
    change(model)
    onnx.save(model, str(path))


def _clip_input(model: onnx.ModelProto) -> None:
    """Clip the model input X at ±6 before any node reads it (a rank that saturates large values)."""
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == "X":
                node.input[i] = "X.clipped"
    # the bounds as Constant nodes: a float initializer that is no slice of a weight fails check's weight
    # comparison before any output is compared, and this fault is about the outputs
    bounds = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.float32(value), name))
        for name, value in (("lo", -6), ("hi", 6))
    ]
    graph.node.insert(0, helper.make_node("Clip", ["X", "lo", "hi"], ["X.clipped"], name="fault"))
    for node in reversed(bounds):
        graph.node.insert(0, node)


def _scale_one_weight(model: onnx.ModelProto) -> None:
    """Move the largest float initializer by 1%."""
    init = max((t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT), key=lambda t: np.prod(t.dims))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.01), init.name))


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_the_unchanged_plan_matches(examples: Path, mlp_plan: Path) -> None:
    assert main(["check", "-q", str(examples / "mlp.onnx"), str(mlp_plan)]) == 0


@pytest.mark.parametrize("fault", [_clip_input, _scale_one_weight], ids=["clip-at-6", "weight-x1.01"])
def test_a_subtly_wrong_rank_fails_check(
    examples: Path, mlp_plan: Path, tmp_path: Path, fault, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    plan = _copy(mlp_plan, tmp_path)
    _edit(plan / "device_1.onnx", fault)
    assert main(["check", "-q", str(examples / "mlp.onnx"), str(plan)]) == 1
    found = capsys.readouterr()
    if fault is _scale_one_weight:  # caught before any output is compared: the weights are compared bit for bit
        assert "differs from the model's slice at index" in found.err
    else:
        assert "MISMATCH" in found.out


def test_one_unit_normal_draw_misses_the_clip_that_the_default_draws_catch(
    examples: Path, mlp_plan: Path, tmp_path: Path
) -> None:
    """Why several scales: at σ=1 a value beyond ±6 is a 2e-9 event, so the old single draw passed."""
    plan = _copy(mlp_plan, tmp_path)
    _edit(plan / "device_1.onnx", _clip_input)
    assert check(examples / "mlp.onnx", plan, draws=[InputDraw("normal", 1.0, 0)]).passed
    result = check(examples / "mlp.onnx", plan)
    assert not result.passed and "σ=1," not in result.worst.inputs
    assert len(result.draws) >= 5


def test_check_reports_the_worst_error_of_every_output(tmp_path: Path) -> None:
    model = _two_output_model(tmp_path)
    optimize(model, devices=2, output_dir=tmp_path / "plan")
    result = check(model, tmp_path / "plan")
    assert [o.name for o in result.outputs] == ["Y", "Z"] and result.passed
    assert all(o.inputs for o in result.outputs)


def _two_output_model(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm"), helper.make_node("Relu", ["Y"], ["Z"], name="act")],
        "two",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 16])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, 16]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [8, 16]),
        ],
        initializer=[w],
    )
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


# ----------------------------------------------------------------------------------------------------------
# Default inputs are valid for the model


def _opt_style_model(tmp_path: Path) -> Path:
    """OPT's positions: cumsum(mask) * mask - 1 + 2 indexes a table of S + 2 rows; token ids index the vocab."""
    rng = np.random.default_rng(1)
    batch, seq, hidden, vocab = 2, 8, 16, 50
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "tokens"),
        numpy_helper.from_array(rng.standard_normal((seq + 2, hidden)).astype(np.float32), "positions"),
        numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "proj"),
        numpy_helper.from_array(np.array(1, np.int64), "axis"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(2, np.int64), "offset"),
    ]
    nodes = [
        helper.make_node("CumSum", ["attention_mask", "axis"], ["cum"], name="cumsum"),
        helper.make_node("Mul", ["cum", "attention_mask"], ["masked"], name="mask.mul"),
        helper.make_node("Sub", ["masked", "one"], ["pos0"], name="pos.sub"),
        helper.make_node("Add", ["pos0", "offset"], ["pos"], name="pos.add"),
        helper.make_node("Gather", ["positions", "pos"], ["pos_emb"], name="embed.positions"),
        helper.make_node("Gather", ["tokens", "input_ids"], ["tok_emb"], name="embed.tokens"),
        helper.make_node("Add", ["tok_emb", "pos_emb"], ["h"], name="embed.add"),
        helper.make_node("MatMul", ["h", "proj"], ["Y"], name="proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "opt_positions",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, seq, hidden])],
        initializer=inits,
    )
    path = tmp_path / "opt.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_integer_ranges_propagate_through_the_mask_arithmetic(tmp_path: Path) -> None:
    graph = load_onnx(_opt_style_model(tmp_path), {})
    ranges = integer_input_ranges(graph)
    assert ranges == {"input_ids": (0, 49), "attention_mask": (0, 1)}


def test_the_mask_range_comes_from_the_graph_not_the_name(tmp_path: Path) -> None:
    """Renamed, the mask still narrows to 0/1 (0-9 would index row 9*8+1 of a 10-row table)."""
    path = _opt_style_model(tmp_path)
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.input[:] = ["flags" if i == "attention_mask" else i for i in node.input]
    model.graph.input[1].name = "flags"
    onnx.save(model, str(path))
    assert integer_input_ranges(load_onnx(path, {}))["flags"] == (0, 1)


def test_an_index_no_input_range_can_fix_is_a_clear_error() -> None:
    graph = Graph(
        "bad",
        {"ids": TensorType((4,), "int64")},
        ["Y"],
        [],
        {"table": np.zeros((3, 2), np.float32), "big": np.array(100, np.int64)},
        {},
        17,
    )
    from unity_eq.ir import Node

    graph.nodes = [
        Node("shift", "Add", ("ids", "big"), ("pos",)),
        Node("lookup", "Gather", ("table", "pos"), ("Y",)),
    ]
    graph.types = {
        "ids": TensorType((4,), "int64"),
        "big": TensorType((), "int64"),
        "pos": TensorType((4,), "int64"),
        "table": TensorType((3, 2), "float32"),
        "Y": TensorType((4, 2), "float32"),
    }
    with pytest.raises(OptionError, match=r"'lookup'.*--inputs"):
        integer_input_ranges(graph)


def test_check_of_an_opt_style_mask_model_runs_the_original(tmp_path: Path) -> None:
    model = _opt_style_model(tmp_path)
    optimize(model, devices=2, output_dir=tmp_path / "plan")
    assert main(["check", "-q", str(model), str(tmp_path / "plan")]) == 0


def test_an_error_of_the_original_model_is_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _opt_style_model(tmp_path)
    optimize(model, devices=2, output_dir=tmp_path / "plan")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_ids=np.full((2, 8), 500, np.int64), attention_mask=np.ones((2, 8), np.int64))
    assert main(["check", "-q", str(model), str(tmp_path / "plan"), "--inputs", str(inputs)]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "original model fails" in lines[0], lines


def test_a_model_the_plan_was_not_made_from_is_exit_2_not_a_mismatch(
    examples: Path, mlp_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The transformer example has the MLP's input and output shapes: without the plan's record of its model
    it ran and "mismatched" (exit 1). The same model saved with its weights as external data, or with other
    weight values, is still the plan's model (the new weights are a mismatch to report, exit 1)."""
    assert main(["check", "-q", str(examples / "transformer.onnx"), str(mlp_plan)]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "is not the model" in lines[0] and "mlp.onnx" in lines[0], lines

    model = onnx.load(examples / "mlp.onnx")
    external = tmp_path / "external" / "mlp.onnx"
    external.parent.mkdir()
    onnx.save(model, external, save_as_external_data=True, location="mlp.onnx.data", size_threshold=0)
    assert main(["check", "-q", str(external), str(mlp_plan)]) == 0
    capsys.readouterr()

    model = onnx.load(examples / "mlp.onnx")  # saving with external data moved the weights out of `model`
    weight = model.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(model, tmp_path / "reweighted.onnx")
    assert main(["check", "-q", str(tmp_path / "reweighted.onnx"), str(mlp_plan)]) == 1


# ----------------------------------------------------------------------------------------------------------
# Lowering: no empty output names, one name one meaning, valid files, identity, source names


def _split_model(tmp_path: Path) -> Path:
    """Only the first output of each Split is used: the plan's Split steps carry omitted ('') outputs."""
    nodes = [
        helper.make_node("Transpose", ["X"], ["t"], name="transpose", perm=[1, 0]),
        helper.make_node("Split", ["t", "s1"], ["a", "b"], name="split.cols", axis=1),
        helper.make_node("Split", ["a", "s2"], ["c", "d"], name="split.rows", axis=0),
        helper.make_node("Relu", ["c"], ["Y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "splits",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6, 6])],
        initializer=[
            helper.make_tensor("s1", TensorProto.INT64, [2], [6, 2]),
            helper.make_tensor("s2", TensorProto.INT64, [2], [6, 2]),
        ],
    )
    path = tmp_path / "split.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_omitted_split_outputs_get_names_and_check_does_not_crash(tmp_path: Path) -> None:
    """onnxruntime crashed (exit 139) on a Split with an output named ''."""
    model = _split_model(tmp_path)
    result = optimize(model, devices=2, output_dir=tmp_path / "plan", generated_rules=False)
    assert any("" in getattr(s, "outputs", ()) for s in result.plan.steps), "the plan should omit an output"
    for rank in range(2):
        device = onnx.load(str(tmp_path / "plan" / f"device_{rank}.onnx"))
        assert all(out for node in device.graph.node for out in node.output)
    proc = subprocess.run(
        [sys.executable, "-m", "unity_eq.cli", "check", "-q", str(model), str(tmp_path / "plan")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def _shared_weight_plan() -> tuple[Plan, Graph, np.ndarray]:
    """One weight W[4] read twice: sliced ([S(0)]) by a Mul on X's column shard, and whole by a later Mul."""
    mesh = Mesh(("x",), (2,))
    w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    tensors = {
        "X": PlanTensor("X", (4, 4), "float32", (R(),), "X", "X"),
        "W": PlanTensor("W", (4,), "float32", (R(),), "W", "W"),
        "Xc": PlanTensor("Xc", (4, 4), "float32", (Shard(1),), None, "X"),
        "Ws": PlanTensor("Ws", (4,), "float32", (Shard(0),), None, "W"),
        "a": PlanTensor("a", (4, 4), "float32", (Shard(1),), None, "a"),
        "g": PlanTensor("g", (4, 4), "float32", (R(),), "a", "a"),
        "b": PlanTensor("b", (4, 4), "float32", (R(),), "Y", "Y"),
    }
    steps = [
        LoadInput("X", "X"),
        LoadWeight("W", "W"),
        Slice("Xc", "X", 1, "x"),
        Slice("Ws", "W", 0, "x"),
        Compute(("a",), "Mul", ("Xc", "Ws")),
        AllGather("g", "a", 1, "x"),
        Compute(("b",), "Mul", ("g", "W")),
    ]
    plan = Plan("shared", mesh, default_machine(2), "inference", tensors, steps, ["X"], {"Y": "b"}, ZERO)
    types = {"X": TensorType((4, 4), "float32"), "W": TensorType((4,), "float32"), "Y": TensorType((4, 4), "float32")}
    types |= {"a": TensorType((4, 4), "float32")}
    from unity_eq.ir import Node

    nodes = [Node("first.mul", "Mul", ("X", "W"), ("a",)), Node("second.mul", "Mul", ("a", "W"), ("Y",))]
    graph = Graph("shared", {"X": types["X"]}, ["Y"], nodes, {"W": w}, types, 17)
    return plan, graph, w


def test_a_weight_sliced_for_one_consumer_and_whole_for_another_gets_two_names(tmp_path: Path) -> None:
    plan, graph, w = _shared_weight_plan()
    write_plan_dir(lower(plan, graph), tmp_path / "plan")
    device = onnx.load(str(tmp_path / "plan" / "device_1.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in device.graph.initializer}
    assert inits["W"].tolist() == w.tolist() and inits["W[S(0)]"].tolist() == w[2:].tolist()
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(run_plan(tmp_path / "plan", {"X": x})["Y"], x * w * w)


def test_optimize_refuses_to_write_a_device_file_that_does_not_load(tmp_path: Path) -> None:
    plan, graph, _ = _shared_weight_plan()
    broken = [
        Compute(("b",), "Transpose", ("g",), {"perm": [0, 0]}) if isinstance(s, Compute) and s.outputs == ("b",) else s
        for s in plan.steps
    ]
    plan.steps[:] = broken
    with pytest.raises(InternalError, match=r"device_0\.onnx: the lowered device model is invalid \(onnx"):
        write_plan_dir(lower(plan, graph), tmp_path / "plan")
    assert not (tmp_path / "plan").exists() and not list(tmp_path.iterdir())


def test_device_files_say_who_they_are(mlp_plan: Path) -> None:
    meta = json.loads((mlp_plan / "plan.json").read_text())
    for rank in range(2):
        props = {p.key: p.value for p in onnx.load(str(mlp_plan / f"device_{rank}.onnx")).metadata_props}
        assert props[META_RANK] == str(rank) and props[META_PLAN_HASH] == meta["plan_hash"]
        assert json.loads(props[META_COORDS]) == dict(
            zip(meta["mesh"]["axes"], meta["mesh"]["ranks"][rank]["coords"], strict=True)
        )
        cuts = json.loads(props[META_COLLECTIVES])
        assert [c["src"] for c in cuts] == [c["src"] for c in meta["collectives"]]
        assert all("mesh axis x" in c["what"] and "ranks [0, 1]" in c["what"] for c in cuts)


def test_run_refuses_swapped_device_files(mlp_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _copy(mlp_plan, tmp_path)
    (plan / "device_0.onnx").rename(plan / "tmp.onnx")
    (plan / "device_1.onnx").rename(plan / "device_0.onnx")
    (plan / "tmp.onnx").rename(plan / "device_1.onnx")
    assert main(["run", str(plan)]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "device file of rank 1, expected rank 0" in lines[0], lines


def test_run_refuses_a_device_file_of_another_plan(
    examples: Path, mlp_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    optimize(examples / "mlp.onnx", devices=2, objective="inference", output_dir=other)
    plan = _copy(mlp_plan, tmp_path)
    shutil.copy(other / "device_1.onnx", plan / "device_1.onnx")
    assert main(["run", str(plan)]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "belongs to another plan" in lines[0], lines


def test_device_files_keep_the_source_node_names(examples: Path, tmp_path: Path) -> None:
    optimize(examples / "transformer.onnx", devices=2, mesh="2", output_dir=tmp_path / "plan")
    source = {n.name for n in onnx.load(str(examples / "transformer.onnx")).graph.node}
    device = onnx.load(str(tmp_path / "plan" / "device_0.onnx"))
    names = [n.name for n in device.graph.node]
    assert len(set(names)) == len(names)
    kept = [n for n in names if n.split("/")[0] in source]
    assert len(kept) >= 0.8 * len(names), names
    cut_inputs = [i for i in device.graph.input if i.doc_string.startswith("result of collective")]
    assert len(cut_inputs) == len(json.loads((tmp_path / "plan" / "plan.json").read_text())["collectives"])


def test_optimize_check_runs_the_numeric_check(
    examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["optimize", str(examples / "mlp.onnx"), "--devices", "2", "-q", "--check", "-o", str(tmp_path / "p")])
    assert code == 0
    assert "match: 1 output(s) over 6 input sets" in capsys.readouterr().out
