"""Measured profiles: what `profile` measures (every compute e-node's op on its local shapes), the table
format, and `optimize --profile` pricing ops with measured times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unity_eq import optimize
from unity_eq.cost import CostModel, OpInstance
from unity_eq.egraph import encode, parse_serialized, saturate
from unity_eq.errors import OptionError
from unity_eq.extract import node_costs
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Mesh
from unity_eq.machine import default_machine
from unity_eq.ops.registry import ONNX_NAMESAKES
from unity_eq.profile import calibrated_machine, op_instances, profile_model
from unity_eq.profile_table import PROFILE_FORMAT_VERSION, ProfileError, ProfileTable, load_profile
from unity_eq.rulefile.manifest import load_rule_files

FAST = {"warmup": 1, "repeats": 2, "min_time": 0.0, "threads": 1}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """This checkout's CLI (``python -m unity_eq.cli``), whatever ``unity-eq`` is first on PATH."""
    command = [sys.executable, "-m", "unity_eq.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def mlp_table(examples: Path) -> ProfileTable:
    return profile_model(examples / "mlp.onnx", devices=2, **FAST)


def _egraph(model: Path, mesh: Mesh):  # type: ignore[no-untyped-def]
    graph = load_onnx(model)
    encoding = encode(graph, mesh)
    data = parse_serialized(saturate(load_rule_files(), encoding).serialized)
    return graph, encoding, data


def test_profile_measures_every_op_the_cost_model_prices(examples: Path, mlp_table: ProfileTable) -> None:
    """Every call the extractor makes to CostModel.compute finds its entry: the keys are the same."""
    mesh = Mesh(("x",), (2,))
    _, _, data = _egraph(examples / "mlp.onnx", mesh)
    model = CostModel(default_machine(2), mesh, profile=mlp_table)
    node_costs(data, model)
    assert mlp_table.misses == 0 and mlp_table.hits > 0
    ops = {e["op"] for e in mlp_table.entries}
    assert ops == {"MatMul", "Add", "Relu"}
    shapes = {tuple(e["key"]["in_shapes"][0]) for e in mlp_table.entries if e["op"] == "MatMul"}
    assert (8, 128, 256) in shapes and (4, 128, 256) in shapes  # replicated and batch-sharded
    assert all(e["median_s"] > 0 and e["repeats"] >= 2 and e["roofline_s"] > 0 for e in mlp_table.entries)


def test_table_format(mlp_table: ProfileTable, tmp_path: Path) -> None:
    path = mlp_table.save(tmp_path / "t.json")
    data = json.loads(path.read_text())
    assert data["kind"] == "unity-eq-profile" and data["format_version"] == PROFILE_FORMAT_VERSION
    assert data["device"]["provider"] == "CPUExecutionProvider" and data["device"]["threads"] >= 1
    cal = data["calibration"]
    assert cal["peak_flops"]["float32"] > 1e8 and cal["memory_bandwidth"] > 1e8 and cal["launch_overhead_s"] > 0
    # fused attention's own efficiency: ONNX's Attention op in onnxruntime, forward
    attention = cal["details"]["attention"]
    assert attention["passes"] == "forward" and 0 < attention["efficiency"] <= 1
    assert attention["efficiency"] == pytest.approx(
        min(1.0, attention["flops"] / attention["min_s"] / cal["peak_flops"]["float32"])
    )
    entry = next(e for e in data["entries"] if e["op"] == "MatMul")
    assert {"op", "attrs", "inputs", "key", "median_s", "min_s", "repeats", "roofline_s"} <= set(entry)
    assert [i["kind"] for i in entry["inputs"]] == ["activation", "weight"]
    assert 0 <= data["summary"]["median_relative_error"] < 100
    # the backward, timed in torch on the same device: every op of the MLP is built there
    assert data["backward"]["framework"] == "torch" and data["backward"]["device"] == "cpu"
    for e in data["entries"]:
        assert e["torch_forward_backward_s"] > 0 and e["backward_s"] >= 0 and e["roofline_backward_s"] > 0, e["op"]
    # an error is relative to a positive measured backward (an Add of same-shape operands may measure 0: its
    # gradients are the output's gradient itself)
    assert data["summary"]["backward_entries"] == sum(1 for e in data["entries"] if e["backward_s"] > 0) > 0
    again = load_profile(path)
    assert again.entries == mlp_table.entries and again.calibration is not None


def test_lookup_by_attributes() -> None:
    def entry(perm: list[int], seconds: float) -> dict[str, object]:
        key = {"in_shapes": [[4, 4]], "out_shape": [4, 4], "dtype": "float32"}
        return {"op": "Transpose", "attrs": {"perm": perm}, "key": key, "median_s": seconds}

    table = ProfileTable({}, [entry([1, 0], 2e-6), entry([0, 1], 1e-6)])
    assert table.lookup("Transpose", [(4, 4)], (4, 4), "float32") == 2e-6  # attributes unknown: the slowest
    assert table.lookup("Transpose", [(4, 4)], (4, 4), "float32", {"perm": (0, 1)}) == 1e-6
    assert table.lookup("Transpose", [(4, 8)], (8, 4), "float32") is None
    assert (table.hits, table.misses) == (2, 1)


def test_measured_times_drive_the_choice(examples: Path) -> None:
    """A table saying every sharded op is slow (and replicated ones free) makes the plan replicated."""
    mesh = Mesh(("x",), (4,))
    graph, encoding, data = _egraph(examples / "mlp.onnx", mesh)
    instances, _ = op_instances(data, encoding, graph, mesh)
    full = {tuple(t.shape) for t in graph.types.values()}

    def seconds(shapes: tuple[tuple[int, ...], ...]) -> float:
        return 1e-9 if all(s in full for s in shapes) else 1.0

    entries = [
        {
            "op": i.op,
            "attrs": {},
            "key": {"in_shapes": [list(s) for s in i.in_shapes], "out_shape": list(i.out_shape), "dtype": i.dtype},
            "median_s": seconds((*i.in_shapes, i.out_shape)),
        }
        for i in instances
    ]
    table = ProfileTable({"device": {"description": "made up"}}, entries)
    baseline = optimize(examples / "mlp.onnx", devices=4).plan
    assert not baseline.is_replicated()
    result = optimize(examples / "mlp.onnx", devices=4, profile=table)
    assert result.plan.is_replicated() and not result.plan.collectives()
    assert result.plan.stats.profile is not None and result.plan.stats.profile.measured > 0


def test_calibrated_machine_predicts_with_the_calibration(mlp_table: ProfileTable) -> None:
    cal = mlp_table.calibration
    assert cal is not None
    machine = calibrated_machine(cal, 2)
    assert machine.device_count == 2 and machine.efficiency == 1.0
    # fused attention at the efficiency the calibration measured, every other class at 1
    measured = cal.details["attention"]["efficiency"]
    assert machine.efficiency_for(machine.devices[0], "attention") == measured
    assert machine.efficiency_for(machine.devices[0], "gemm") == 1.0
    model = CostModel(machine, Mesh(("x",), (2,)))
    flops = 2.0 * 64 * 64 * 64
    got = model.compute(
        OpInstance("MatMul", ((64, 64), (64, 64)), 2 * 64 * 64 * 4, (64, 64), 64 * 64 * 4, "float32")
    ).compute
    expected = max(flops / cal.peak_flops, 3 * 64 * 64 * 4 / cal.memory_bandwidth) + cal.launch_overhead_s
    assert got == pytest.approx(expected)


def test_torch_ops_compute_what_onnxruntime_computes(examples: Path) -> None:
    """The torch form of each profiled op of the transformer (the backward's subject) gives onnxruntime's
    forward values: a wrong attribute (Transpose's perm, Softmax's axis, Split's sizes) would time another op."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from unity_eq.profile.backward import torch_function
    from unity_eq.profile.models import single_op_model

    mesh = Mesh(("x",), (2,))
    graph, encoding, data = _egraph(examples / "transformer.onnx", mesh)
    instances, weights = op_instances(data, encoding, graph, mesh)
    checked: set[str] = set()
    for instance in instances:
        if instance.op in checked or torch_function(instance) is None or instance.op in ONNX_NAMESAKES:
            continue  # a namesake term has no one-node ONNX model to compare with (test_attention.py checks it)
        model, feeds = single_op_model(instance, weights.get(instance, {}), np.random.default_rng(0))
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)[instance.output_index]
        values = iter(feeds.values())
        args = []
        for position, spec in enumerate(instance.inputs):
            if spec.kind == "activation":
                args.append(torch.from_numpy(next(values)))
            elif spec.kind == "weight":
                init = next(i for i in model.graph.initializer if i.name == f"in{position}")
                args.append(torch.from_numpy(np.array(onnx_numpy(init))))
        got = torch_function(instance)(*args)  # type: ignore[misc]
        got = got[instance.output_index] if isinstance(got, tuple | list) else got
        np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-4, atol=1e-5, err_msg=instance.op)
        checked.add(instance.op)
    assert {"MatMul", "Transpose", "Softmax", "Split", "LayerNormalization", "Reshape", "Add", "Mul"} <= checked


def onnx_numpy(tensor: object) -> object:
    from onnx import numpy_helper

    return numpy_helper.to_array(tensor)  # type: ignore[arg-type]


def test_profile_on_cuda_measures_forward_and_backward_on_the_gpu(examples: Path) -> None:
    """On a machine with CUDA (onnxruntime-gpu and torch's CUDA build): both passes on the GPU."""
    import torch

    from unity_eq.runtime import cuda_problem

    if cuda_problem(0) is not None or not torch.cuda.is_available():
        pytest.skip("needs CUDA in onnxruntime and in torch")
    table = profile_model(examples / "mlp.onnx", devices=2, device="cuda", warmup=1, repeats=3, min_time=0.0)
    assert table.meta["device"]["provider"] == "CUDAExecutionProvider"
    assert table.meta["backward"]["device"] == "cuda:0"
    assert all(e["median_s"] > 0 and e["backward_s"] >= 0 for e in table.entries)


@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "not found"), ("{", "unreadable"), ('{"kind": "other"}', "not a unity-eq profile"),
     ('{"kind": "unity-eq-profile", "format_version": 99}', "format version 99")],
)  # fmt: skip
def test_bad_tables(tmp_path: Path, content: str | None, needle: str) -> None:
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ProfileError, match=needle):
        load_profile(path)


def test_profile_cli(examples: Path, tmp_path: Path) -> None:
    table = tmp_path / "mlp.json"
    proc = run_cli(
        "profile", str(examples / "mlp.onnx"), "--mesh", "2", "-o", str(table),
        "--warmup", "1", "--repeats", "2", "--min-time", "0", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "median relative error" in proc.stdout and "GFLOP/s" in proc.stdout
    assert json.loads(table.read_text())["mesh"] == {"axes": ["x"], "sizes": [2]}
    plan = tmp_path / "plan"
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "--profile", str(table), "-o", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "op prices measured" in proc.stderr
    assert run_cli("check", str(examples / "mlp.onnx"), str(plan)).returncode == 0


def test_profile_cli_errors(examples: Path, tmp_path: Path) -> None:
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "--profile", str(tmp_path / "no.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert next(line for line in proc.stderr.splitlines() if line.startswith("error:")).count("not found") == 1
    proc = run_cli("profile", str(examples / "mlp.onnx"), "-o", str(tmp_path / "t.json"))
    assert proc.returncode == 2 and "--devices N" in proc.stderr and "Traceback" not in proc.stderr


def test_profile_on_cuda_falls_back_to_the_cpu_with_one_message(examples: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    from unity_eq.runtime import cuda_problem

    if cuda_problem(0) is None or torch.cuda.is_available():
        pytest.skip("this machine has a usable CUDA device (in onnxruntime, or in torch: the next test)")
    table = tmp_path / "t.json"
    proc = run_cli(
        "profile", str(examples / "mlp.onnx"), "--devices", "2", "--device", "cuda", "-o", str(table),
        "--warmup", "0", "--repeats", "1", "--min-time", "0", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        next(line for line in proc.stderr.splitlines() if "running on the CPU" in line)
    ]
    assert json.loads(table.read_text())["device"]["provider"] == "CPUExecutionProvider"


def test_profile_auto_times_in_torch_where_only_torch_has_cuda(examples: Path) -> None:
    """onnxruntime's CPU build beside torch's CUDA build (the lent GPU machines): every op forward and backward
    in torch on the GPU, with one note that says so."""
    import torch

    from unity_eq.runtime import cuda_problem

    if cuda_problem(0) is None or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and onnxruntime without it")
    notes: list[str] = []
    table = profile_model(
        examples / "mlp.onnx", devices=2, device="cuda", warmup=1, repeats=3, min_time=0.0, progress=notes.append
    )
    assert table.meta["device"]["framework"] == "torch" and table.meta["device"]["provider"] == "torch:cuda:0"
    assert table.meta["backward"]["device"] == "cuda:0"
    assert [n for n in notes if "onnxruntime has no CUDA here" in n]
    assert not table.skipped and all(e["median_s"] > 0 and e["backward_s"] >= 0 for e in table.entries)


def test_profile_framework_torch_times_every_op_and_calibrates_in_torch(examples: Path) -> None:
    """`--framework torch` on the CPU: the same ops as onnxruntime's run, each timed in torch, the calibration
    too (so the roofline and the ops are measured by one framework); the transformer's fused Attention is timed
    as the torch backend runs it (scaled_dot_product_attention), not skipped."""
    pytest.importorskip("torch")
    ort_table = profile_model(examples / "mlp.onnx", devices=2, warmup=0, repeats=1, min_time=0.0, backward=False)
    table = profile_model(
        examples / "mlp.onnx", devices=2, framework="torch", warmup=0, repeats=1, min_time=0.0, backward=False
    )
    assert table.meta["device"]["framework"] == "torch" and table.meta["device"]["provider"] == "torch:cpu"
    assert "PyTorch" in table.meta["calibration"]["device"] and table.meta["calibration"]["peak_flops"]["float32"] > 0
    timed = table.meta["calibration"]["details"]["attention"]  # scaled_dot_product_attention, as train runs it
    assert timed["passes"] == "forward and backward" and 0 < timed["efficiency"] <= 1

    def keys(t: ProfileTable) -> list[tuple[str, str]]:
        return sorted((e["op"], json.dumps(e["key"])) for e in t.entries)

    assert keys(table) == keys(ort_table) and not table.skipped
    attention = profile_model(
        examples / "transformer.onnx", devices=2, framework="torch", warmup=0, repeats=1, min_time=0.0
    )
    fused = [e for e in attention.entries if e["op"] == "Attention"]
    assert fused and all(e["median_s"] > 0 and e["backward_s"] is not None for e in fused)
    with pytest.raises(OptionError, match="expected auto, onnxruntime or torch"):
        profile_model(examples / "mlp.onnx", devices=2, framework="tensorrt")
