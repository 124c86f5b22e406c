"""``optimize --pipeline`` refuses what the counts alone rule out — stages beyond the pieces or the devices,
microbatches that do not divide the batch, more devices than the pieces, a node and the batch can use — in one
``error:`` line, before any piece is saturated, and writes nothing (unity_eq/stages/arithmetic.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import run_cli
from test_stages import MACHINE_TOML, _layered_model

from unity_eq.stages.arithmetic import Forced, refuse_impossible, shapes


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """4 layers (4 pieces) wide enough that pricing its pieces takes seconds; a 2-device-a-node machine."""
    tmp = tmp_path_factory.mktemp("refusals")
    machine = tmp / "tiny.toml"
    machine.write_text(MACHINE_TOML.format(memory=80))
    return _layered_model(tmp / "layers.onnx", layers=4, hidden=256, seq=64), machine


CASES = {
    "stages-above-pieces": (
        ["--devices", "4", "--batch", "8", "--stages", "8"],
        "the model splits into 4 pieces and a stage is one or more whole pieces, so at most 4 stages",
    ),
    "stages-the-devices-cannot-hold": (
        ["--devices", "4", "--batch", "8", "--stages", "3"],
        "every device holds a stage (stages × data replicas × tensor group = 4 devices), so the stages can be "
        "1, 2, 4, not 3",
    ),
    "microbatches-not-dividing-the-batch": (
        ["--devices", "4", "--batch", "8", "--microbatches", "3"],
        "3 microbatches do not divide the batch of 8 samples",
    ),
    "nodes-beyond-the-batch": (
        ["--nodes", "16", "--batch", "2"],
        "32 devices are more than any pipeline plan of this model can use",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_at_once_in_one_line_with_nothing_written(model: tuple[Path, Path], tmp_path: Path, case: str) -> None:
    path, machine = model
    options, expected = CASES[case]
    if "--nodes" in options:
        options = ["--machine", str(machine), *options]
    plan = tmp_path / "plan"
    start = time.perf_counter()
    proc = run_cli("optimize", str(path), "--pipeline", *options, "-o", str(plan), "--no-generated-rules")
    seconds = time.perf_counter() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert "pricing pieces" not in proc.stdout + proc.stderr  # the progress line before the first saturation
    assert not plan.exists()
    assert seconds < 30, seconds  # loading and splitting only (pricing these pieces takes longer on this model)


def test_the_arithmetic_is_the_search_s() -> None:
    """``shapes`` is what ``configurations`` enumerates: d · m · M = batch, stages = devices / (d · t) within
    the pieces; a forced layout the counts allow passes."""
    got = {(s.tensor, s.data, s.stages, s.microbatch, s.microbatches) for s in shapes([4], [1, 2], 4, 8, [1, 2, 4])}
    assert (1, 1, 4, 2, 4) in got and (2, 2, 1, 4, 1) in got
    assert all(t * d * p == 4 and d * m * mb == 8 and p <= 4 for t, d, p, m, mb in got)
    assert not any(s.stages == 4 for s in shapes([4], [1, 2], 2, 8, [1]))  # 4 stages > 2 pieces
    refuse_impossible(Forced(stages=2, microbatches=4), [4], [1, 2], 4, 8, [1, 2, 4])  # allowed: no error
