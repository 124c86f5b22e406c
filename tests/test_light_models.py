"""Every CNN of onnx's light model set (weights randomized) optimizes for 2 and 4 devices and checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_zoo import light_model_paths

from unity_eq import check, optimize

NAMES = [p.stem for p in light_model_paths()]


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_light_model_optimizes_runs_and_checks(
    light_models: dict[str, Path], tmp_path: Path, name: str, devices: int
) -> None:
    model = light_models[name]
    result = optimize(model, devices=devices, output_dir=tmp_path / "plan")
    assert result.plan.validate() == []
    assert result.plan.stats["saturation"]["stop_reason"] == "saturated"
    outcome = check(model, tmp_path / "plan")
    assert outcome.passed, f"{name} on {devices}: {outcome.describe()}"


def test_the_light_set_is_all_there() -> None:
    assert len(NAMES) == 9
