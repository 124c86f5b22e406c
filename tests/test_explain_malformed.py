"""`unity-eq explain` on a damaged plan.json: it works, or it says which field is wrong (exit 2), never a traceback.

A real plan.json (optimize of the MLP example on 2 devices) is mutated many ways: every top-level field set to
null, to a value of the wrong type and removed, and a sample of nested fields likewise. Each mutant is explained
as text, json and dot (svg for a sample) through the CLI's entry point in this process.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import unity_eq
from unity_eq.cli import main

ROOT = Path(__file__).resolve().parents[1]

Mutation = tuple[str, Callable[[dict[str, Any]], None]]


@pytest.fixture(scope="module")
def plan_meta(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("malformed") / "plan"
    unity_eq.optimize(ROOT / "examples" / "mlp.onnx", devices=2, output_dir=out)
    meta: dict[str, Any] = json.loads((out / "plan.json").read_text())
    return meta


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(meta: dict[str, Any]) -> None:
        target = meta
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def mutate(meta: dict[str, Any]) -> None:
        target = meta
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _wrong(value: Any) -> list[Any]:
    """Values of a type other than ``value``'s."""
    if isinstance(value, dict):
        return [None, 7, [], "x"]
    if isinstance(value, list):
        return [None, 7, {}, "x", [None]]
    if isinstance(value, str):
        return [None, 7, [], {}]
    if isinstance(value, bool):
        return [None, "yes", []]
    if isinstance(value, int | float):
        return [None, "1", [], {}]
    return [7, "x", []]


def _mutations(meta: dict[str, Any]) -> Iterator[Mutation]:
    for key, value in meta.items():
        yield f"drop {key}", _drop((key,))
        for wrong in _wrong(value):
            yield f"{key}={json.dumps(wrong)}", _set((key,), wrong)
    compute = next(i for i, s in enumerate(meta["steps"]) if s["kind"] == "compute")
    moved = next(i for i, s in enumerate(meta["steps"]) if "src" in s)
    tensor = next(iter(meta["tensors"]))
    nested: list[tuple[Any, ...]] = [
        ("mesh", "axes"),
        ("mesh", "sizes"),
        ("mesh", "ranks", 0),
        ("mesh", "ranks", 0, "device"),
        ("mesh", "ranks", 0, "node"),
        ("model", "name"),
        ("model", "outputs"),
        ("cost", "total_s"),
        ("cost", "compute_s"),
        ("cost", "communication_s"),
        ("cost", "communication_by_axis"),
        ("tensors", tensor),
        ("tensors", tensor, "placement"),
        ("tensors", tensor, "shape"),
        ("tensors", tensor, "local_shape"),
        ("tensors", tensor, "dtype"),
        ("tensors", tensor, "value"),
        ("steps", 0),
        ("steps", 0, "kind"),
        ("steps", 0, "out"),
        ("steps", compute, "op"),
        ("steps", compute, "inputs"),
        ("steps", compute, "outputs"),
        ("steps", compute, "compute_s"),
        ("steps", moved, "src"),
        ("steps", moved, "axis"),
        ("steps", moved, "communication_s"),
        ("baselines", "one_device"),
        ("baselines", "one_device", "total_s"),
        ("memory", "total_bytes"),
        ("memory", "fits"),
        ("machine", "name"),
        ("parallelism", "devices_used"),
        ("extraction", "method"),
        ("mesh_search", "tried"),
        ("mesh_search", "chosen"),
        ("collectives", 0),
        ("stats", "timings"),
    ]
    for path in nested:
        target: Any = meta
        for key in path:
            target = target[key]
        name = ".".join(map(str, path))
        if not isinstance(path[-1], int):
            yield f"drop {name}", _drop(path)
        for wrong in _wrong(target):
            yield f"{name}={json.dumps(wrong)}", _set(path, wrong)
    yield "mesh.axes=[1]", _set(("mesh", "axes"), [1])
    yield "mesh.sizes=[]", _set(("mesh", "sizes"), [])
    yield "tensors.placement=[1]", _set(("tensors", tensor, "placement"), [1])
    yield "steps.inputs=['nope']", _set(("steps", compute, "inputs"), ["nope"])
    yield "steps.outputs=[1]", _set(("steps", compute, "outputs"), [1])
    yield "steps.src='nope'", _set(("steps", moved, "src"), "nope")
    yield "steps.kind='teleport'", _set(("steps", moved, "kind"), "teleport")


def test_every_mutant_plan_is_explained_or_one_error_line_naming_plan_json_and_the_field(
    plan_meta: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan"
    plan.mkdir()
    outcomes: dict[str, int] = {"explained": 0, "error": 0}
    mutations = list(_mutations(plan_meta))
    assert len(mutations) > 150
    for index, (name, mutate) in enumerate(mutations):
        meta = copy.deepcopy(plan_meta)
        mutate(meta)
        (plan / "plan.json").write_text(json.dumps(meta))
        formats = ["text", "json", "dot"] + (["svg"] if index % 10 == 0 else [])
        for fmt in formats:
            capsys.readouterr()
            code = main(["explain", str(plan), "--format", fmt, "-o", str(tmp_path / f"out.{fmt}")])
            captured = capsys.readouterr()
            assert "Traceback" not in captured.err, f"{name} ({fmt}): {captured.err}"
            if code == 0:
                outcomes["explained"] += 1
                continue
            assert code == 2, f"{name} ({fmt}): exit {code}: {captured.err}"
            lines = [line for line in captured.err.splitlines() if line.startswith("error:")]
            assert len(lines) == 1, f"{name} ({fmt}): {captured.err}"
            line = lines[0]
            assert "plan.json" in line, f"{name} ({fmt}): {line}"
            # the schema check names the field and what it expected; the last resort is never needed here
            assert "field '" in line or "format version" in line, f"{name} ({fmt}): {line}"
            assert "unexpected value" not in line, f"{name} ({fmt}): {line}"
            outcomes["error"] += 1
    assert outcomes["error"] > 100 and outcomes["explained"] > 0, outcomes


def test_cost_null_is_one_error_line_from_the_console_script(plan_meta: dict[str, Any], tmp_path: Path) -> None:
    from conftest import run_cli

    plan = tmp_path / "plan"
    plan.mkdir()
    (plan / "plan.json").write_text(json.dumps({**plan_meta, "cost": None}))
    for fmt in ("text", "json", "svg"):
        proc = run_cli("explain", str(plan), "--format", fmt, "-o", str(tmp_path / f"out.{fmt}"))
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"error: {plan / 'plan.json'}: field 'cost': expected an object, got null. Re-run `unity-eq optimize`."
        ]
