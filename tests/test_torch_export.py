"""A transformer exported from PyTorch (dynamo exporter, random weights) optimizes and checks."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from model_zoo import export_torch_transformer

from unity_eq import check, optimize


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_torch_transformer(tmp_path_factory.mktemp("torch") / "encoder_layer.onnx")


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("objective", ["inference", "training"])
def test_torch_transformer_checks(exported: Path, tmp_path: Path, devices: int, objective: str) -> None:
    result = optimize(exported, devices=devices, output_dir=tmp_path / "plan", objective=objective)
    assert result.plan.validate() == []
    outcome = check(exported, tmp_path / "plan")
    assert outcome.passed, outcome.describe()


def test_larger_torch_transformer_gets_sharded_and_checks(tmp_path: Path) -> None:
    """Big enough (1,024 tokens, d=256) that parallelism pays: the rules must work on dynamo's graph."""
    model = export_torch_transformer(tmp_path / "layer.onnx", d_model=256, nhead=8, ffn=1024, batch=8, seq=128)
    for objective in ("inference", "training"):
        result = optimize(model, devices=4, objective=objective, output_dir=tmp_path / objective)
        assert not result.plan.is_replicated(), objective
        assert check(model, tmp_path / objective).passed
