"""Every dtype lowers: bfloat16 and float16 models (weights inline or external) are optimized, run and checked.

onnxruntime's CPU provider has no bfloat16 arithmetic (MatMul, Add, Mul, Relu, LayerNormalization: no kernel),
only data movement and Cast; so the bfloat16 models here keep their weights, inputs, outputs and the activations
between layers in bfloat16 and compute in float32 (each layer casts in and out), as a bfloat16 checkpoint run on
a CPU would. A model with bfloat16 arithmetic lowers too (its device files are valid ONNX; CUDA runs them), and
``run``/``check`` on the CPU say which kernel is missing in one line."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper
from test_stages import MACHINE_TOML

from unity_eq.lower.record import plan_hash

BF16, F16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT
NP = {BF16: ml_dtypes.bfloat16, F16: np.float16}


def _layers(
    path: Path,
    dtype: int,
    layers: int = 2,
    hidden: int = 32,
    batch: int | str = 4,
    external: bool = False,
    arithmetic: bool = False,
) -> Path:
    """Pre-LN MLP layers over X [batch, 8, hidden] of ``dtype``: weights of ``dtype``; each layer casts its input
    and weights to float32, computes, and casts its output back (``arithmetic``: computes in ``dtype`` instead)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def weight(name: str, *shape: int) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(NP[dtype]), name))
        if arithmetic:
            return name
        nodes.append(helper.make_node("Cast", [name], [f"{name}.f"], to=F32))
        return f"{name}.f"

    x = "X"
    for k in range(layers):
        p = f"l{k}"
        if arithmetic:
            h = x
        else:
            nodes.append(helper.make_node("Cast", [x], [f"{p}.in"], to=F32))
            h = f"{p}.in"
        norm = [h, weight(f"{p}.g", hidden), weight(f"{p}.b", hidden)]
        nodes.append(helper.make_node("LayerNormalization", norm, [f"{p}.ln"]))
        nodes.append(helper.make_node("MatMul", [f"{p}.ln", weight(f"{p}.w1", hidden, 2 * hidden)], [f"{p}.up"]))
        nodes.append(helper.make_node("Relu", [f"{p}.up"], [f"{p}.act"]))
        nodes.append(helper.make_node("MatMul", [f"{p}.act", weight(f"{p}.w2", 2 * hidden, hidden)], [f"{p}.down"]))
        nodes.append(helper.make_node("Mul", [f"{p}.down", weight(f"{p}.s", hidden)], [f"{p}.scaled"]))
        nodes.append(helper.make_node("Add", [h, f"{p}.scaled"], [f"{p}.sum"]))
        if arithmetic:
            x = f"{p}.sum"
        else:
            nodes.append(helper.make_node("Cast", [f"{p}.sum"], [f"{p}.out"], to=dtype))
            x = f"{p}.out"
    nodes.append(helper.make_node("Identity", [x], ["Y"]))
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info("X", dtype, [batch, 8, hidden])],
        [helper.make_tensor_value_info("Y", dtype, [batch, 8, hidden])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    if external:
        onnx.save(model, path, save_as_external_data=True, location=f"{path.name}.data", size_threshold=0)
    else:
        onnx.save(model, path)
    return path


def _optimize(model: Path, plan: Path, *options: str) -> None:
    proc = run_cli("optimize", str(model), *options, "-o", str(plan), "--no-generated-rules", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def _check_and_run(model: Path, plan: Path, dtype: str) -> str:
    """``check`` passes and ``run`` prints the output in the model's dtype; returns check's report."""
    checked = run_cli("check", str(model), str(plan), "-q")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    ran = run_cli("run", str(plan), "-q")
    assert ran.returncode == 0, ran.stderr
    assert f"Y: {dtype}[4, 8," in ran.stdout
    return checked.stdout


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_a_16_bit_model_with_inline_weights_is_optimized_run_and_checked_on_2_devices(
    tmp_path: Path, dtype: int
) -> None:
    """Before: every bfloat16 model failed to lower (``plan_hash``: "cannot include dtype 'E' in a buffer"), and
    ``check``/``run`` could not feed bfloat16 inputs to onnxruntime. float16 computes natively on the CPU."""
    model = _layers(tmp_path / "m.onnx", dtype, arithmetic=dtype == F16)
    _optimize(model, tmp_path / "plan", "--devices", "2")
    name = "bfloat16" if dtype == BF16 else "float16"
    report = _check_and_run(model, tmp_path / "plan", name)
    # the tolerance is the output dtype's (10 units of its precision), and the report says which
    assert f"(tolerance {10 * ml_dtypes.finfo(NP[dtype]).eps:.3g})" in report
    if dtype == BF16:  # numpy saves bfloat16 as raw 2-byte values (V2); they are read back as bfloat16
        ran = run_cli("run", str(tmp_path / "plan"), "--outputs", str(tmp_path / "out.npz"), "-q")
        assert ran.returncode == 0, ran.stderr
        saved = np.load(tmp_path / "out.npz")["Y"]
        assert saved.dtype == np.dtype("V2")
        np.savez(tmp_path / "in.npz", X=saved)
        again = run_cli("check", str(model), str(tmp_path / "plan"), "--inputs", str(tmp_path / "in.npz"), "-q")
        assert again.returncode == 0, again.stdout + again.stderr


def test_external_bfloat16_weights_stream_into_a_data_file_that_runs(tmp_path: Path) -> None:
    """External source weights, and more than 16 MiB on the one device: the device file's weights are streamed
    to ``device_0.onnx.data`` (bfloat16 through onnx's layout), whose header names the plan. (float16 takes
    numpy's plain path, as float32 does.)"""
    model = _layers(tmp_path / "m.onnx", BF16, hidden=1024, external=True)
    plan = tmp_path / "plan"
    _optimize(model, plan, "--devices", "1")
    data = plan / "device_0.onnx.data"
    assert data.exists() and data.stat().st_size > 16 << 20
    assert data.read_bytes()[:16] == b"unity-eq weights"
    _check_and_run(model, plan, "bfloat16")


def test_bfloat16_arithmetic_lowers_and_the_cpu_says_which_kernel_it_lacks(tmp_path: Path) -> None:
    """A model that multiplies in bfloat16 is valid ONNX that onnxruntime's CPU provider cannot run (CUDA can):
    ``optimize`` writes the plan, ``run`` and ``check`` on the CPU each say so in one ``error:`` line."""
    model = _layers(tmp_path / "m.onnx", BF16, layers=1, arithmetic=True)
    plan = tmp_path / "plan"
    _optimize(model, plan, "--devices", "1")
    assert (plan / "device_0.onnx").exists()
    for args in (("run", str(plan)), ("check", str(model), str(plan))):
        proc = run_cli(*args, "-q")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
        assert "CPU provider has no bfloat16 kernel for" in lines[0]


def test_a_bfloat16_pipeline_passes_bfloat16_activations_between_stages(tmp_path: Path) -> None:
    """Exported at batch 2 (static: the pieces are priced at that microbatch only), run as 2 microbatches."""
    model = _layers(tmp_path / "m.onnx", BF16, batch=2)
    machine = tmp_path / "tiny.toml"
    machine.write_text(MACHINE_TOML.format(memory=80))
    plan = tmp_path / "plan"
    _optimize(
        model, plan, "--machine", str(machine), "--devices", "2", "--pipeline", "--batch", "4", "--stages", "2",
        "--tensor", "1",
    )  # fmt: skip
    stage1 = onnx.load(plan / "stage1" / "device_0.onnx", load_external_data=False)
    assert stage1.graph.input[0].type.tensor_type.elem_type == BF16  # what stage 0 sends
    _check_and_run(model, plan, "bfloat16")


def test_plan_hash_reads_the_bytes_of_every_dtype() -> None:
    """The weights' bytes, whatever their type: numpy refuses a buffer of ml_dtypes' types (bfloat16 'E')."""
    from unity_eq.cost import Cost, Objective
    from unity_eq.ir import Graph, Mesh
    from unity_eq.machine import default_machine
    from unity_eq.plan import Plan

    plan = Plan("g", Mesh.parse("1", 1), default_machine(1), Objective("inference"), {}, [], [], {}, Cost())
    for dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.int4, np.float16, np.bool_):
        hashes = set()
        for start in (0, 1):
            values = (np.arange(6).reshape(2, 3) + start).astype(dtype)
            hashes.add(plan_hash(plan, Graph("g", {}, [], [], {"w": values}, {}, 18)))
        assert len(hashes) == 2, dtype  # the values count, not only the name, dtype and shape


def test_float_inputs_for_an_integer_input_are_refused_not_cast(tmp_path: Path) -> None:
    """Before: 0.7 became token 0 without a word (``astype``). Now one ``error:`` line names the input, the
    model's dtype and the file's; integer values of another width are still accepted."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "ids"], ["Y"])], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 8])], [w],
    )  # fmt: skip
    model = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), model)
    plan = tmp_path / "plan"
    _optimize(model, plan, "--devices", "1")
    np.savez(tmp_path / "float.npz", ids=np.array([0.7, 1.2, 3.0, 4.0], np.float32))
    np.savez(tmp_path / "int.npz", ids=np.array([0, 1, 3, 4], np.int32))
    for command in (("run", str(plan)), ("check", str(model), str(plan))):
        proc = run_cli(*command, "--inputs", str(tmp_path / "float.npz"), "-q")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines == [
            "error: inputs: 'ids' is int64 in the model, the inputs file gives float32; refusing to cast floats to "
            "int64. Save it as int64 (numpy: array.astype(np.int64))."
        ], proc.stderr
        assert run_cli(*command, "--inputs", str(tmp_path / "int.npz"), "-q").returncode == 0


def test_bfloat16_weights_are_parameters_and_float8_ones_are_not() -> None:
    """bfloat16 is trained (numpy calls it no float: ml_dtypes' kind is V), float8 is a quantized weight, stored
    and read, not trained; names resolve through ml_dtypes only for its element types."""
    import pytest

    from unity_eq.dtypes import as_dtype, is_float
    from unity_eq.ir import is_parameter_type

    assert is_parameter_type("bfloat16", 2) and is_parameter_type(as_dtype("bfloat16"), 1)
    assert not is_parameter_type("float8_e4m3fn", 2) and is_float("float8_e4m3fn")
    assert not is_parameter_type("bfloat16", 0) and not is_parameter_type("int64", 2)
    with pytest.raises(TypeError):
        as_dtype("finfo")
