"""Lowering and running pipeline plans: ``optimize --pipeline`` writes a plan directory per stage, ``run`` and
``check`` run them microbatch by microbatch (real egglog, lowering and onnxruntime), ``explain`` still reads it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from test_stages import MACHINE_TOML, _layered_model

from unity_eq.planfile.pipeline import read_pipeline_record
from unity_eq.runtime.checker import run_original
from unity_eq.runtime.pipeline import load_pipeline_dir, run_pipeline


def _model(tmp: Path) -> Path:
    """The layered model wide enough that each stage's plan on 2 devices shards (it has a collective), saved
    at an IR version onnxruntime reads (check runs the original)."""
    path = _layered_model(tmp / "layers.onnx", hidden=256, seq=64)
    model = onnx.load(path)
    model.ir_version = 10
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("pipeline")
    model = _model(tmp)
    machine = tmp / "tiny.toml"
    machine.write_text(MACHINE_TOML.format(memory=80))  # 2 devices a node, 2 nodes
    plan = tmp / "plan"
    proc = run_cli(
        "optimize", str(model), "--machine", str(machine), "--nodes", "2", "--pipeline", "--batch", "8",
        "--stages", "2", "--tensor", "2", "--microbatches", "2", "-o", str(plan), "--no-generated-rules", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return model, plan


def test_each_stage_is_a_plan_directory_of_its_tensor_group(lowered: tuple[Path, Path]) -> None:
    _, plan = lowered
    record = read_pipeline_record(plan / "plan.json")
    c = record.chosen
    assert (c.stages, c.tensor, c.data, c.microbatches, c.microbatch) == (2, 2, 1, 2, 4)
    assert record.lowered and [s.directory for s in record.stages] == ["stage0", "stage1"]
    # ranks: the tensor group fastest, then the stages (d = 1): stage 0 on 0-1, stage 1 on 2-3
    assert [s.replicas for s in record.stages] == [((0, 1),), ((2, 3),)]
    for s in range(len(record.stages)):
        meta = json.loads((plan / f"stage{s}" / "plan.json").read_text())
        assert meta["mesh"]["sizes"] == [2] and meta["files"] == ["device_0.onnx", "device_1.onnx"]
        assert meta["collectives"], "a stage on 2 devices of this width shards, so it has a collective"
        # stage 0 reads the model input at the microbatch, stage 1 what stage 0 sends
        expected_input = "X" if s == 0 else record.stages[0].sends
        assert list(meta["model"]["inputs"]) == [expected_input]
        assert meta["model"]["inputs"][expected_input]["shape"] == [4, 64, 256]


def test_check_and_run_match_onnxruntime_on_the_original(lowered: tuple[Path, Path]) -> None:
    model, plan = lowered
    proc = run_cli("check", str(model), str(plan), "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok Y" in proc.stdout
    # the Python runtime on a batch whose samples differ: the microbatches go back in their order
    x = np.random.default_rng(1).standard_normal((8, 64, 256)).astype(np.float32)
    got = run_pipeline(load_pipeline_dir(plan), {"X": x})
    expected = run_original(model, {"X": x}, ["Y"])
    np.testing.assert_allclose(got["Y"], expected["Y"], rtol=1e-4, atol=1e-5)
    ran = run_cli("run", str(plan), "-q")
    assert ran.returncode == 0, ran.stderr
    assert "Y: float32[8, 64, 256]" in ran.stdout


def test_explain_reads_the_lowered_plan(lowered: tuple[Path, Path]) -> None:
    _, plan = lowered
    text = run_cli("explain", str(plan))
    assert text.returncode == 0, text.stderr
    assert "lowered: one plan directory per stage (stage0/, stage1/)" in text.stdout


def test_under_mpiexec_4_ranks_run_2_stages_of_2_way_tensor_parallel(
    lowered: tuple[Path, Path], tmp_path: Path
) -> None:
    """One process per rank: stage 0 on ranks 0-1, stage 1 on ranks 2-3, each stage's collectives inside its
    tensor group, the activation sent from rank k of stage 0 to rank k of stage 1 microbatch by microbatch; rank 0
    writes the outputs, which match onnxruntime on the original model and the local backend."""
    from test_mpi import unity_eq

    model, plan = lowered
    x = np.random.default_rng(2).standard_normal((8, 64, 256)).astype(np.float32)
    np.savez(tmp_path / "in.npz", X=x)
    proc, _ = unity_eq(
        4, "run", str(plan), "--backend", "mpi", "--inputs", str(tmp_path / "in.npz"), "--outputs",
        str(tmp_path / "out.npz"), "-q", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = np.load(tmp_path / "out.npz")["Y"]
    np.testing.assert_allclose(got, run_original(model, {"X": x}, ["Y"])["Y"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, run_pipeline(load_pipeline_dir(plan), {"X": x})["Y"], rtol=1e-6, atol=1e-7)
    wrong, _ = unity_eq(2, "run", str(plan), "--backend", "mpi", "-q", timeout=300)
    assert wrong.returncode != 0
    assert "mpiexec started 2 process(es), the pipeline plan" in wrong.stdout + wrong.stderr
    assert "Traceback" not in wrong.stdout + wrong.stderr


def test_stage_directories_belong_to_the_plan(lowered: tuple[Path, Path]) -> None:
    # plan.json's manifest lists every stage's files: a later optimize into the same folder replaces them,
    # instead of keeping them as the user's files
    _, plan = lowered
    written = read_pipeline_record(plan / "plan.json").written
    assert {"plan.json", "stage0/plan.json", "stage0/device_0.onnx", "stage1/device_1.onnx"} <= set(written)


def test_forced_configurations_that_cannot_be_say_so(tmp_path: Path) -> None:
    model = _layered_model(tmp_path / "layers.onnx", layers=2)
    base = ["optimize", str(model), "--devices", "2", "--pipeline", "--batch", "4", "--no-generated-rules", "-q"]
    proc = run_cli(*base, "--tensor", "3", "--plan-only")
    assert proc.returncode == 2 and "`--tensor` 3: a tensor group stays inside a node" in proc.stderr
    proc = run_cli(*base, "--stages", "2", "--microbatches", "3", "--plan-only", "-o", str(tmp_path / "p"))
    assert proc.returncode == 2 and "`--stages 2`, `--microbatches 3`: no configuration" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("optimize", str(model), "--devices", "2", "--stages", "2")
    assert proc.returncode == 2 and "pass it with `--pipeline`" in proc.stderr


def test_absent_weights_are_refused_before_the_search(tmp_path: Path) -> None:
    model = onnx.load(_layered_model(tmp_path / "source.onnx", layers=2))
    path = tmp_path / "layers.onnx"
    onnx.save(model, path, save_as_external_data=True, location="layers.data", size_threshold=0)
    (tmp_path / "layers.data").unlink()  # weightless: planned from dtypes and shapes, never lowered
    plan = tmp_path / "plan"
    proc = run_cli(
        "optimize", str(path), "--devices", "2", "--pipeline", "--batch", "4", "-o", str(plan), "--no-generated-rules"
    )
    assert proc.returncode == 2, proc.stderr
    assert "has no data" in proc.stderr and "`--plan-only`" in proc.stderr and "Traceback" not in proc.stderr
    assert not plan.exists()


def _copy_plan(plan: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "plan"
    shutil.copytree(plan, target)
    return target


def test_a_stage_from_another_plan_is_refused(lowered: tuple[Path, Path], tmp_path: Path) -> None:
    """A ``stage0/`` copied from another pipeline plan of the same architecture (other weights, a plan
    consistent in itself) once ran with exit 0 and outputs off by 114 %: plan.json now records each stage's
    plan hash, and run and check refuse the stranger, naming the stage."""
    model, plan = lowered
    copy = _copy_plan(plan, tmp_path)
    stage = copy / "stage0"
    foreign = "f" * 32  # another plan: its plan.json and its device files agree with each other
    meta = json.loads((stage / "plan.json").read_text())
    meta["plan_hash"] = foreign
    (stage / "plan.json").write_text(json.dumps(meta))
    for device in stage.glob("device_*.onnx"):
        proto = onnx.load(str(device))
        for prop in proto.metadata_props:
            if prop.key == "unity_eq.plan_hash":
                prop.value = foreign
        weight = next(t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims)
        array = onnx.numpy_helper.to_array(weight) * 2
        weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
        onnx.save(proto, str(device))
    for args in (("run", str(copy), "-q"), ("check", str(model), str(copy), "-q")):
        proc = run_cli(*args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "stage 0 (stage0/) belongs to another plan" in proc.stderr and "Traceback" not in proc.stderr


def test_a_stage_list_edited_in_plan_json_is_refused(lowered: tuple[Path, Path], tmp_path: Path) -> None:
    """Deleting the last entry of ``stages`` once made run exit 0 writing stage 0's activation as the model's
    output (local and MPI); now the stage count of the chosen configuration is checked, and the ends."""
    from test_mpi import unity_eq

    _, plan = lowered
    copy = _copy_plan(plan, tmp_path)
    meta = json.loads((copy / "plan.json").read_text())
    good = json.dumps(meta)
    meta["stages"].pop()
    (copy / "plan.json").write_text(json.dumps(meta))
    proc = run_cli("run", str(copy), "-q", "--outputs", str(tmp_path / "out.npz"))
    assert proc.returncode == 2 and "stage 1 is missing" in proc.stderr, proc.stderr
    assert not (tmp_path / "out.npz").exists()
    mpi, _ = unity_eq(2, "run", str(copy), "--backend", "mpi", "-q", timeout=300)
    assert mpi.returncode != 0 and "stage 1 is missing" in mpi.stdout + mpi.stderr
    assert "Traceback" not in mpi.stdout + mpi.stderr
    meta["chosen"]["stages"] = 1  # the count made to agree: stage 0 still sends an activation, not the outputs
    (copy / "plan.json").write_text(json.dumps(meta))
    proc = run_cli("run", str(copy), "-q")
    assert (
        proc.returncode == 2
        and "makes the activation" in proc.stderr
        and "the last stage makes the model outputs" in proc.stderr
    ), proc.stderr
    meta = json.loads(good)
    meta["stages"][1]["plan_hash"] = meta["stages"][0]["plan_hash"]
    (copy / "plan.json").write_text(json.dumps(meta))
    proc = run_cli("run", str(copy), "-q")
    assert proc.returncode == 2 and "stage 1 (stage1/) belongs to another plan" in proc.stderr, proc.stderr
    # the microbatch edited (with the count, so the batch still divides): onnxruntime's multi-line shape error,
    # or a message blaming the inputs, before; now one line naming stage 0 and `chosen.microbatch`
    meta = json.loads(good)
    meta["chosen"]["microbatch"] //= 2
    meta["chosen"]["microbatches"] *= 2
    (copy / "plan.json").write_text(json.dumps(meta))
    proc = run_cli("run", str(copy), "-q")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "`chosen.microbatch` is 2" in errors[0], proc.stderr


def test_outputs_may_not_overwrite_the_plan(lowered: tuple[Path, Path]) -> None:
    model, plan = lowered
    before = (plan / "plan.json").read_bytes()
    for target in (plan / "plan.json", plan / "stage1" / "device_0.onnx", model):
        proc = run_cli("run", str(plan), "-q", "--outputs", str(target))
        assert proc.returncode == 2 and "would destroy" in proc.stderr, proc.stderr
    assert (plan / "plan.json").read_bytes() == before


def test_run_and_check_of_a_pipeline_on_cuda_say_once_that_the_cpu_runs_it(lowered: tuple[Path, Path]) -> None:
    """`--device cuda` where onnxruntime cannot use CUDA: `run` and `check` of a pipeline plan say so in one
    line and run on the CPU (issue 26's audit: the pipeline path fell back silently, as `check` of any plan)."""
    from unity_eq import runtime

    if runtime.cuda_problem(0) is None:
        pytest.skip("this machine has a usable CUDA device")
    model, plan = lowered
    for args in (("run", str(plan)), ("check", str(model), str(plan))):
        proc = run_cli(*args, "--device", "cuda")
        assert proc.returncode == 0, proc.stderr
        cuda = [line for line in proc.stderr.splitlines() if "CUDA" in line]
        assert len(cuda) == 1 and cuda[0].endswith("running on the CPU"), (args[0], proc.stderr)
