"""Every CNN of onnx's light model set (weights randomized) gets a sharded plan for 2 and 4 devices that checks.

The light models take a batch of one, so on a datasheet GPU machine the cheapest plan of half of them is the
one-device plan, and checking it would compare the model with itself. These tests price them on a
compute-bound machine instead (slow devices on very fast links), where splitting channels, rows or columns
pays for every model, and assert that the plan really is sharded before checking it numerically.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_zoo import light_model_paths

from unity_eq import check, optimize

NAMES = [p.stem for p in light_model_paths()]


def compute_bound_machine(folder: Path, devices: int) -> Path:
    """A one-node machine file whose devices are 2000x slower than an A100 and whose links are 30x faster."""
    path = folder / f"compute-bound-{devices}.toml"
    path.write_text(
        'name = "compute-bound"\n'
        'description = "test machine: 0.01 TFLOP/s devices on 10 TB/s links"\n'
        "[devices.slow]\n"
        "peak_tflops = { float32 = 0.01 }\n"
        "memory_bandwidth_gbs = 10000\n"
        "memory_gib = 80\n"
        "[links.fast]\n"
        "bandwidth_gbs = 10000\n"
        "latency_us = 0.001\n"
        "[[nodes]]\n"
        f"devices = {{ slow = {devices} }}\n"
        'link = "fast"\n'
    )
    return path


def sharded_compute(plan_dir: Path) -> list[str]:
    """The outputs of the plan's compute steps that are split along some mesh axis: ops run on shards."""
    meta = json.loads((plan_dir / "plan.json").read_text())
    split = {name for name, p in meta["shardings"].items() if any(s.startswith("S(") for s in p)}
    return [out for step in meta["steps"] if step["kind"] == "compute" for out in step["outputs"] if out in split]


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_light_model_gets_a_sharded_plan_that_checks(
    light_models: dict[str, Path], tmp_path: Path, name: str, devices: int
) -> None:
    model = light_models[name]
    machine = compute_bound_machine(tmp_path, devices)
    result = optimize(model, machine=machine, output_dir=tmp_path / "plan")
    assert result.plan.validate() == []
    assert result.plan.stats.saturation is not None and result.plan.stats.saturation.stop_reason == "saturated"
    ops_on_shards = sharded_compute(tmp_path / "plan")
    assert len(ops_on_shards) >= 3, f"{name} on {devices}: ops on shards {ops_on_shards}; the check would be vacuous"
    outcome = check(model, tmp_path / "plan")
    assert outcome.passed, f"{name} on {devices}: {outcome.describe()}"


def test_the_light_set_is_all_there() -> None:
    assert len(NAMES) == 9
