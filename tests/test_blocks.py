"""Block-by-block optimization: splitting at bottleneck tensors, reuse of repeated blocks, DP over boundary
placements, stitched plans that run and check, and the ILP option end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unity_eq import check, optimize
from unity_eq.blocks import boundary_keys, saturate_pieces
from unity_eq.egraph import Limits
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Mesh
from unity_eq.rulefile.manifest import load_rule_files
from unity_eq.split import split_graph

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from benchmarks.models import _hf  # noqa: E402


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Small BERTs (hidden 128) of 2 and 4 layers exported from PyTorch."""
    out = tmp_path_factory.mktemp("bert")
    return {layers: _hf("bert", layers, 128, 4)(out) for layers in (2, 4)}


def test_split_finds_repeated_layers(bert: dict[int, Path]) -> None:
    small, deep = (split_graph(load_onnx(bert[n])) for n in (2, 4))
    assert small is not None and deep is not None
    # Two more layers add pieces, not distinct pieces: the work is that of the distinct ones.
    assert len(deep.pieces) > len(small.pieces)
    assert set(deep.distinct) == set(small.distinct)
    assert max(deep.to_record().copies) >= 3
    for piece in deep.pieces[1:]:
        assert piece.stream_in is not None


def test_distinct_pieces_are_saturated_once(bert: dict[int, Path]) -> None:
    mesh = Mesh(("x",), (2,))
    sizes = []
    for n in (2, 4):
        split = split_graph(load_onnx(bert[n]))
        assert split is not None
        sizes.append(saturate_pieces(split, mesh, load_rule_files(), Limits()).total.enodes)
    assert sizes[0] == sizes[1]


def test_boundary_placements() -> None:
    keys = boundary_keys((8, 128, 256), Mesh(("x", "y"), (2, 4)))
    assert ("R", "R") in keys and ("S(0)", "S(2)") in keys
    assert ("S(1)", "S(1)") not in keys  # one dimension is sharded by one axis at most
    assert boundary_keys((3, 5), Mesh(("x",), (2,))) == [("R",)]


@pytest.mark.parametrize("objective", ["inference", "training"])
def test_block_plan_checks_and_is_no_worse_than_whole(bert: dict[int, Path], tmp_path: Path, objective: str) -> None:
    model = bert[4]
    blocked = optimize(
        model, machine="h100x8", mesh="2x2x2", objective=objective, blocks="on", output_dir=tmp_path / "b"
    )
    whole = optimize(model, machine="h100x8", mesh="2x2x2", objective=objective, blocks="off")
    assert blocked.plan.validate() == []
    assert blocked.plan.cost.total <= whole.plan.cost.total * 1.01
    meta = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert meta["blocks"]["pieces"] > meta["blocks"]["distinct"]
    outcome = check(model, tmp_path / "b")
    assert outcome.passed, outcome.describe()


def test_auto_uses_blocks_only_for_large_models(examples: Path) -> None:
    result = optimize(examples / "transformer.onnx", devices=2, mesh="2")
    assert result.search is not None and result.search.split is None


def test_blocks_option_is_validated(examples: Path) -> None:
    from unity_eq.errors import OptionError

    with pytest.raises(OptionError, match="--blocks"):
        optimize(examples / "mlp.onnx", devices=2, blocks="sometimes")
    with pytest.raises(OptionError, match="--extractor"):
        optimize(examples / "mlp.onnx", devices=2, extractor="exact")
    with pytest.raises(OptionError, match="--ilp-time-limit"):
        optimize(examples / "mlp.onnx", devices=2, extractor="ilp", ilp_time_limit=0)


def test_bad_extractor_options_exit_with_one_line(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unity_eq.cli import main as cli_main

    model = str(examples / "mlp.onnx")
    assert cli_main(["optimize", model, "--devices", "2", "--extractor", "exact", "-q"]) == 2
    assert "error: `--extractor`: expected greedy, differentiable or ilp" in capsys.readouterr().err
    assert cli_main(["optimize", model, "--devices", "2", "--extractor", "ilp", "--ilp-time-limit", "-1", "-q"]) == 2
    assert "error: `--ilp-time-limit` must be positive" in capsys.readouterr().err


def test_ilp_extractor_in_the_pipeline(examples: Path, tmp_path: Path) -> None:
    result = optimize(
        examples / "mlp.onnx", devices=4, mesh="4", objective="training", extractor="ilp", output_dir=tmp_path / "p"
    )
    report = json.loads((tmp_path / "p" / "plan.json").read_text())["extraction"]["ilp"]
    assert report["all_optimal"] and report["ilp_total_s"] <= report["greedy_total_s"] * (1 + 1e-9)
    assert result.plan.cost.total == pytest.approx(min(report["ilp_total_s"], report["greedy_total_s"]))
    assert check(examples / "mlp.onnx", tmp_path / "p").passed


def test_ilp_with_blocks(bert: dict[int, Path]) -> None:
    result = optimize(bert[2], devices=2, mesh="2", blocks="on", extractor="ilp", ilp_time_limit=20)
    extraction = result.plan.report.extraction
    report = extraction.ilp if extraction else None
    assert report is not None and report.programs and report.ilp_total_s <= report.greedy_total_s * (1 + 1e-9)
    assert extraction is not None and extraction.differentiable is not None  # ilp runs the relaxed search first
    assert extraction.differentiable.programs == len(report.programs)  # one per fragment of the chain
    assert extraction.differentiable.differentiable_total_s <= report.greedy_total_s * (1 + 1e-12)
    assert extraction.winner in ("greedy", "differentiable", "ilp")


def test_block_plans_do_not_depend_on_string_hashing(examples: Path, tmp_path: Path) -> None:
    """The same model and options give the same plan (steps and hash) in every process: a piece's weights are
    taken in the model's order, not a set's, whose order changes with PYTHONHASHSEED from run to run."""
    import os
    import subprocess
    import sys

    hashes = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"plan-{seed}"
        args = [sys.executable, "-m", "unity_eq.cli", "optimize", str(examples / "transformer.onnx"), "--devices", "8"]
        args += ["--objective", "training", "--blocks", "on", "-q", "-o", str(out)]
        proc = subprocess.run(args, env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        plan = json.loads((out / "plan.json").read_text())
        hashes.append((plan["plan_hash"], json.dumps(plan["steps"])))
    assert hashes[0] == hashes[1] == hashes[2]
