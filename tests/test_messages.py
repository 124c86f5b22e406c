"""Messages and pictures that say what happened: ``check`` of a pipeline plan made with ``--batch`` from a model
exported at its microbatch; ``explain``'s pictures naming `-o` only when the user passed it; the pipeline picture
showing what runs where (the stage list) as well as when (a time axis, microbatch numbers), and naming ops by
their ONNX node names."""

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
    for i, node in enumerate(model.graph.node):  # as an exporter names them (the layered model's are unnamed)
        node.name = f"/model/layers.{i // 8}/{node.op_type}_{i % 8}"
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


def test_the_pipeline_picture_shows_the_stages_a_time_axis_and_microbatches(
    static_pipeline: tuple[Path, Path], tmp_path: Path
) -> None:
    """Before: one grey row per stage with unlabelled boxes and a total time in the title; nothing said which
    pieces, ranks, memory or directory a stage has, nor where in time a box is."""
    import xml.etree.ElementTree as ET

    _, plan = static_pipeline
    proc = run_cli("explain", str(plan), "--format", "svg", "-o", str(tmp_path / "p.svg"))
    assert proc.returncode == 0, proc.stderr
    svg = ET.parse(tmp_path / "p.svg").getroot()  # well-formed
    texts = ["".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    ns = "{http://www.w3.org/2000/svg}"
    hover = [t.find(f"{ns}title") for t in svg.iter(f"{ns}text")]
    shown = [  # what is drawn, without the hover titles
        (h.tail if h is not None else t.text) or "" for t, h in zip(svg.iter(f"{ns}text"), hover, strict=True)
    ]
    for heading in ("pieces: ONNX nodes", "ranks", "time / microbatch", "memory / device", "directory"):
        assert heading in shown
    assert "stage0/" in shown and "stage1/" in shown
    assert any("/model/layers.0/LayerNormalization_0" in t for t in texts)  # the stage's first ONNX node
    # the time axis: round ticks from 0, and its unit
    assert any(t.startswith("time from the step's start (") for t in shown)
    ticks = [t for t in shown if t.replace(".", "").isdigit()]
    assert "0" in ticks and len(ticks) >= 2 + 5  # microbatch numbers 0 and 1 in the boxes, and 5+ ticks
    boxes = [
        r
        for r in svg.iter("{http://www.w3.org/2000/svg}rect")
        if r.find("{http://www.w3.org/2000/svg}title") is not None
    ]
    assert len(boxes) == 4  # 2 stages × 2 microbatches, forward only (inference)
    titles = sorted(r.find("{http://www.w3.org/2000/svg}title").text or "" for r in boxes)  # type: ignore[union-attr]
    assert titles[0].startswith("stage 0, microbatch 0 forward: 0 µs to")


def test_stage_pages_name_ops_by_their_onnx_nodes(static_pipeline: tuple[Path, Path], tmp_path: Path) -> None:
    """The pipeline page lists each stage's ops under their ONNX node names, and a stage's own report (its plan
    directory is an SPMD plan) carries them too: before, plan.json had no node names, only tensors."""
    import json

    _, plan = static_pipeline
    proc = run_cli("explain", str(plan), "--format", "html", "-o", str(tmp_path / "p.html"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "p.html").read_text()
    assert "<td>/model/layers.0/MatMul_1</td>" in page and "<td>/model/layers.1/MatMul_1</td>" in page
    report = run_cli("explain", str(plan / "stage1"), "--json")
    assert report.returncode == 0, report.stderr
    nodes = {op["output"]: op["node"] for op in json.loads(report.stdout)["ops"]}
    assert nodes["l1.up"] == "/model/layers.1/MatMul_1"
