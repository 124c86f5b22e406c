"""A wrong or tampered plan never runs silently: a plan replaces only the files it wrote, `--outputs` never
overwrites the plan or its model, a collective's groups are its axis's, integer outputs are compared exactly,
and `check` draws inputs for models whose index tables are constants (real optimize, lowering, onnxruntime)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from unity_eq import check, optimize
from unity_eq.errors import PlanError
from unity_eq.runtime import compare_outputs, load_plan_dir


@pytest.fixture(scope="module")
def mlp_plan(examples: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP example sharded on 2 devices (it has collectives)."""
    out = tmp_path_factory.mktemp("mlp") / "plan"
    result = optimize(examples / "mlp.onnx", devices=2, objective="training", output_dir=out)
    assert result.plan.collectives()
    return out


def test_reoptimizing_keeps_files_that_only_look_like_the_plans(examples: Path, tmp_path: Path) -> None:
    """Ownership once went by name pattern: a model named device_9.onnx and stage7/notes.txt were deleted."""
    plan = tmp_path / "plan"
    model = tmp_path / "model.onnx"
    shutil.copy(examples / "mlp.onnx", model)
    args = ["optimize", str(model), "-q", "-o", str(plan)]
    assert run_cli(*args, "--devices", "2").returncode == 0
    assert set(json.loads((plan / "plan.json").read_text())["written"]) == {
        "plan.json",
        "device_0.onnx",
        "device_1.onnx",
    }
    shutil.copy(model, plan / "device_9.onnx")
    (plan / "stage7").mkdir()
    (plan / "stage7" / "notes.txt").write_text("mine")
    proc = run_cli(*args, "--devices", "4")
    assert proc.returncode == 0, proc.stderr
    assert (plan / "device_9.onnx").read_bytes() == model.read_bytes()
    assert (plan / "stage7" / "notes.txt").read_text() == "mine"
    assert len(list(plan.glob("device_[0-3].onnx"))) == 4
    # a file of the user's where the new plan writes one: refused, the user's file and the plan untouched
    for rank in (1, 2, 3):
        (plan / f"device_{rank}.onnx").unlink()
    (plan / "device_1.onnx").write_text("mine too")
    meta = json.loads((plan / "plan.json").read_text())
    meta["written"] = [name for name in meta["written"] if name not in {f"device_{r}.onnx" for r in (1, 2, 3)}]
    (plan / "plan.json").write_text(json.dumps(meta))
    proc = run_cli(*args, "--devices", "2")
    assert proc.returncode == 2 and "not a file of a unity-eq plan in this folder" in proc.stderr, proc.stderr
    assert (plan / "device_1.onnx").read_text() == "mine too"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_outputs_may_not_overwrite_the_plan_or_its_model(examples: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    model = tmp_path / "mlp.onnx"
    shutil.copy(examples / "mlp.onnx", model)
    optimize(model, devices=2, output_dir=plan)
    before = {p.name: p.read_bytes() for p in (plan / "plan.json", plan / "device_1.onnx", model)}
    for target in (plan / "plan.json", plan / "device_1.onnx", model):
        proc = run_cli("run", str(plan), "-q", "--outputs", str(target))
        assert proc.returncode == 2 and "would destroy" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in (plan / "plan.json", plan / "device_1.onnx", model)} == before
    proc = run_cli("run", str(plan), "-q", "--outputs", str(plan / "out.npz"))  # the user's own file: fine
    assert proc.returncode == 0, proc.stderr
    # `explain -o` and `train --save` neither (issue 26's audit: each overwrote them with exit 0)
    for target in (plan / "plan.json", plan / "device_1.onnx", model):
        for args in (("explain", str(plan), "--format", "html", "-o", str(target)),
                     ("explain", str(plan), "--json", "-o", str(target)),
                     ("train", str(plan), "--steps", "1", "--save", str(target))):  # fmt: skip
            proc = run_cli(*args)
            assert proc.returncode == 2 and "would destroy" in proc.stderr, (args, proc.stderr)
    assert {p.name: p.read_bytes() for p in (plan / "plan.json", plan / "device_1.onnx", model)} == before


def test_a_folder_with_another_tools_plan_json_is_the_users(examples: Path, tmp_path: Path) -> None:
    """A plan.json that is not unity-eq's (unreadable, or another tool's JSON) owns nothing: `optimize -o`
    there refuses to write over the user's files instead of replacing them (issue 26's audit)."""
    plan = tmp_path / "plan"
    plan.mkdir()
    (plan / "device_0.onnx").write_text("my own model")
    for foreign in ("not json", json.dumps({"some": "other tool config"})):
        (plan / "plan.json").write_text(foreign)
        proc = run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "2", "-q", "-o", str(plan))
        assert proc.returncode == 2 and "not a file of a unity-eq plan" in proc.stderr, proc.stderr
        assert (plan / "plan.json").read_text() == foreign
        assert (plan / "device_0.onnx").read_text() == "my own model"
    assert sorted(p.name for p in plan.iterdir()) == ["device_0.onnx", "plan.json"]


def test_a_collective_moved_to_another_axis_with_its_groups_is_refused(examples: Path, tmp_path: Path) -> None:
    """plan.json edited to run a collective on the other axis of a 2 x 2 mesh, with that axis's groups (so the
    two agree): `run` ran it with exit 0 and a wrong answer (issue 26's audit). The device files' metadata
    says which collectives lowering wrote; `run` compares."""
    plan = tmp_path / "plan"
    optimize(examples / "mlp.onnx", devices=4, mesh="2x2", objective="training", output_dir=plan)
    meta = json.loads((plan / "plan.json").read_text())
    first = meta["collectives"][0]
    other = next(axis for axis in ("x", "y") if axis != first["axis"])
    # the mesh's axes (x, y), rank = 2·x + y: x's groups hold ranks 2 apart, y's neighbours
    first["axis"], first["groups"] = other, [[0, 2], [1, 3]] if other == "x" else [[0, 1], [2, 3]]
    (plan / "plan.json").write_text(json.dumps(meta))
    proc = run_cli("run", str(plan), "-q")
    assert proc.returncode == 2 and "plan.json was edited" in proc.stderr, proc.stderr
    assert f"axis '{other}' where it has '{'xy'.replace(other, '')}'" in proc.stderr, proc.stderr


def test_a_collective_whose_groups_are_not_its_axis_is_refused(mlp_plan: Path, tmp_path: Path) -> None:
    """`check` ran the collectives of plan.json's groups whatever its axis said."""
    copy = tmp_path / "plan"
    shutil.copytree(mlp_plan, copy)
    meta = json.loads((copy / "plan.json").read_text())
    meta["collectives"][0]["groups"] = [[0], [1]]
    (copy / "plan.json").write_text(json.dumps(meta))
    with pytest.raises(PlanError, match=r"'collectives\[0\]\.groups': the groups of mesh axis .* disagree"):
        load_plan_dir(copy)
    meta["collectives"][0]["axis"] = "nowhere"
    (copy / "plan.json").write_text(json.dumps(meta))
    with pytest.raises(PlanError, match=r"'collectives\[0\]\.axis': expected a mesh axis"):
        load_plan_dir(copy)


def test_integer_outputs_are_compared_exactly() -> None:
    """Through float64, two int64 above 2**53 that differ by 1 compared equal: a plan off by one passed."""
    expected = np.array([2**60 + 1, 7], np.int64)
    result = compare_outputs({"n": expected}, {"n": np.array([2**60, 7], np.int64)})
    assert not result.passed
    assert "expected 1152921504606846977, got 1152921504606846976" in result.describe()
    assert not compare_outputs({"n": expected}, {"n": expected.astype(np.float64)}).passed  # another dtype
    assert compare_outputs({"n": expected}, {"n": expected.copy()}).passed


def test_check_draws_inputs_for_a_bert_with_a_constant_index_table(tmp_path: Path) -> None:
    """The dynamo export of a BERT with an attention mask gathers (GatherND) with a constant index table;
    `check` refused to draw inputs ("they depend on []"): such indices are computed, not narrowed."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.models import _hf

    model = _hf("bert", 1, 32, 2, batch=2, seq=8, mask=True)(tmp_path)
    plan = tmp_path / "plan"
    optimize(model, devices=2, mesh="2", output_dir=plan)
    result = check(model, plan)
    assert result.passed, result.describe()
    assert len(result.draws) > 1


def test_check_compares_every_weight_bit_for_bit(mlp_plan: Path, examples: Path, tmp_path: Path) -> None:
    """One element of one weight moved to the next float32 (far below any tolerance) once passed `check`;
    every device's weights are now compared with the model's slices, byte for byte."""
    import onnx
    from onnx import numpy_helper

    from unity_eq.errors import CheckFailed
    from unity_eq.weightfile import META_WEIGHTS

    copy = tmp_path / "plan"
    shutil.copytree(mlp_plan, copy)
    path = copy / "device_1.onnx"
    model = onnx.load(str(path))
    named = json.loads({p.key: p.value for p in model.metadata_props}[META_WEIGHTS])
    tensor = next(t for t in model.graph.initializer if t.name in named and len(t.dims) == 2)
    array = numpy_helper.to_array(tensor).copy()
    array[1, 2] = np.nextafter(array[1, 2], np.float32(np.inf))
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    onnx.save(model, str(path))
    assert check(examples / "mlp.onnx", mlp_plan).passed  # the plan as written: every weight matches
    name = re.escape(tensor.name)
    with pytest.raises(CheckFailed, match=rf"device_1\.onnx: weight '{name}' .* differs .* at index \[1, 2\]"):
        check(examples / "mlp.onnx", copy)
    proc = run_cli("check", str(examples / "mlp.onnx"), str(copy), "-q")
    assert proc.returncode == 1 and "differs from the model's slice at index [1, 2]" in proc.stderr + proc.stdout


def test_check_draws_inputs_for_a_pipeline_of_a_static_batch_export(tmp_path: Path) -> None:
    """A GPT-2 exported with a static batch of 2 (the TorchScript exporter), planned as a pipeline of batch 6
    (`--batch`): `check` without `--inputs` drew its integer ranges from the model loaded at the plan's batch,
    which the static model refuses, and exited 2 naming an `--input-shape` the user never passed (issue 26's
    audit). It now checks, running the original in passes of its own batch."""
    pytest.importorskip("transformers")
    from model_zoo import export_masked_transformer

    model = export_masked_transformer("gpt2", tmp_path / "gpt2.onnx", layers=2, dynamo=False)
    plan = tmp_path / "plan"
    made = run_cli("optimize", str(model), "--devices", "2", "--pipeline", "--stages", "2", "--batch", "6",
                   "-q", "-o", str(plan))  # fmt: skip
    assert made.returncode == 0, made.stderr
    checked = run_cli("check", str(model), str(plan), "-q")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "input-shape" not in checked.stderr
