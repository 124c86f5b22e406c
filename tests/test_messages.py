"""Messages that say what happened: ``check`` of a pipeline plan made with ``--batch`` from a model exported
at its microbatch, and ``explain``'s pictures naming `-o` only when the user passed it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from test_stages import MACHINE_TOML, _layered_model

from unity_eq.runtime.checker import run_original
from unity_eq.runtime.pipeline import load_pipeline_dir, run_pipeline


@pytest.fixture(scope="module")
def static_pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A model exported at batch 2 (static), planned as a pipeline of `--batch 4`: 2 microbatches of 2."""
    tmp = tmp_path_factory.mktemp("static")
    model = onnx.load(_layered_model(tmp / "layers.onnx", layers=2))
    model.ir_version = 10
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 2
    path = tmp / "static.onnx"
    onnx.save(model, path)
    machine = tmp / "tiny.toml"
    machine.write_text(MACHINE_TOML.format(memory=80))
    plan = tmp / "plan"
    proc = run_cli(
        "optimize", str(path), "--machine", str(machine), "--devices", "2", "--pipeline", "--batch", "4",
        "--stages", "2", "--tensor", "1", "-o", str(plan), "--no-generated-rules", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return path, plan


def test_check_runs_a_static_batch_model_a_microbatch_at_a_time(static_pipeline: tuple[Path, Path]) -> None:
    """Before: "the original model fails on normal σ=1, seed 0: … Got invalid dimensions for input: X" (the
    plan takes the 4 samples of `--batch`, the model 2). The original now runs on chunks of its own batch."""
    model, plan = static_pipeline
    proc = run_cli("check", str(model), str(plan), "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok Y" in proc.stdout
    x = np.random.default_rng(3).standard_normal((4, 8, 32)).astype(np.float32)
    got = run_pipeline(load_pipeline_dir(plan), {"X": x})["Y"]
    halves = [run_original(model, {"X": x[i : i + 2]}, ["Y"])["Y"] for i in (0, 2)]
    np.testing.assert_allclose(got, np.concatenate(halves), rtol=1e-5, atol=1e-6)
    # run_original (check's reference) takes the whole batch now, joined in the chunks' order
    np.testing.assert_array_equal(run_original(model, {"X": x}, ["Y"])["Y"], np.concatenate(halves))


@pytest.mark.parametrize("fmt", ["svg", "html"])
def test_a_picture_s_default_output_is_not_called_dash_o(static_pipeline: tuple[Path, Path], fmt: str) -> None:
    _, plan = static_pipeline
    (plan / f"plan.{fmt}").mkdir()
    try:
        proc = run_cli("explain", str(plan), "--format", fmt)
    finally:
        (plan / f"plan.{fmt}").rmdir()
    assert proc.returncode == 2
    assert "`-o`" not in proc.stderr.replace("`-o FILE`", "")
    assert "default output is a folder; pass `-o FILE`" in proc.stderr
