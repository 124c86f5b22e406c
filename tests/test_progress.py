"""Progress (live on a terminal, plain lines in a log, nothing with -q), the search's times, and an honest
headline: unused mesh axes are named, devices doing distinct work are counted, and the plan never costs
more than a baseline it reports."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from conftest import run_cli
from rich.console import Console
from unity_eq.frontends.onnx import load_onnx

import unity_eq.search as search_module
from unity_eq import optimize
from unity_eq.cost import default_machine
from unity_eq.extract import Restriction
from unity_eq.memory import plan_memory
from unity_eq.progress import LiveTracker
from unity_eq.rulesets import default_rule_files, load_rule_files
from unity_eq.search import search

ESCAPE = "\x1b["


def _assert_never_dearer_than_a_baseline(meta: dict) -> None:  # type: ignore[type-arg]
    """Every baseline that fits costs at least the plan (float noise aside)."""
    total = meta["cost"]["total_s"]
    for name, b in meta["baselines"].items():
        if b["fits"]:
            assert b["total_s"] >= total * (1 - 1e-9), (name, b["total_s"], total)
            assert b["ratio"] >= 1 - 1e-9, (name, b["ratio"])


def _axes_holding_non_replicated(meta: dict) -> set[str]:  # type: ignore[type-arg]
    """The mesh axes along which some tensor of plan.json is sharded or partial (computed from scratch)."""
    axes = meta["mesh"]["axes"]
    return {axes[i] for t in meta["tensors"].values() for i, p in enumerate(t["placement"]) if p != "R"}


def test_two_nodes_name_the_unused_axis_and_log_plain_lines(
    examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLP on 2 × 8 H100: the inter-node axis is never worth a collective for it, so the chosen 2-axis
    mesh leaves one axis replicated; the summary must say so and count the devices doing distinct work."""
    monkeypatch.setenv("COLUMNS", "400")  # the summary table on one line per row, to read it back
    plan_dir = tmp_path / "plan"
    proc = run_cli(
        "optimize", str(examples / "mlp.onnx"), "--machine", "h100x8", "--nodes", "2", "--max-axes", "2",
        "-o", str(plan_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((plan_dir / "plan.json").read_text())
    usage = meta["parallelism"]
    used = _axes_holding_non_replicated(meta)
    sizes = dict(zip(meta["mesh"]["axes"], meta["mesh"]["sizes"], strict=True))
    assert usage["used_axes"] == [a for a in meta["mesh"]["axes"] if a in used]
    assert usage["unused_axes"] == [a for a in meta["mesh"]["axes"] if a not in used]
    assert usage["unused_axes"], "the case this test is about: a mesh axis left unused"
    assert usage["devices_used"] == math.prod(sizes[a] for a in used) < usage["devices"] == 16
    unused = ", ".join(usage["unused_axes"])
    assert f"(unused: {unused})" in proc.stdout
    assert f"{usage['devices_used']} of 16: axis {unused}" in proc.stdout
    assert "data_parallel" in proc.stdout and "(on x=16, 16 devices)" in proc.stdout  # the baseline's own mesh
    _assert_never_dearer_than_a_baseline(meta)
    for b in meta["baselines"].values():
        assert 1 <= b["devices_used"] <= b["devices"]

    # stderr is not a terminal: plain lines, a start and an end per mesh, no redrawn display
    assert ESCAPE not in proc.stderr
    tried = [t["mesh"] for t in meta["mesh_search"]["tried"]]
    for mesh in tried:
        assert sum(line.startswith(f"… mesh {mesh}:") for line in proc.stderr.splitlines()) == 2, proc.stderr
    assert "iteration" not in proc.stderr

    # the search time is wall time; the meshes' summed worker time is shown apart, and is not less
    timings = meta["stats"]["timings"]
    assert timings["worker_s"] == pytest.approx(timings["saturate_s"] + timings["extract_s"])
    assert f"{timings['search_s']:.2f} s (meshes' time summed over parallel workers" in proc.stdout

    proc = run_cli("explain", str(plan_dir))
    assert proc.returncode == 0, proc.stderr
    assert f"devices used: {usage['devices_used']} of 16: axis {unused}" in proc.stdout


def test_quiet_prints_no_progress(examples: Path, tmp_path: Path) -> None:
    plan_dir = tmp_path / "plan"
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "-n", "2", "-q", "-o", str(plan_dir))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "predicted cost" in proc.stdout

    proc = run_cli("run", str(plan_dir), "-q")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "Y: float32" in proc.stdout
    proc = run_cli("run", str(plan_dir))
    assert proc.returncode == 0 and "no --inputs" in proc.stderr and ESCAPE not in proc.stderr

    proc = run_cli("check", str(examples / "mlp.onnx"), str(plan_dir), "-q")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "match" in proc.stdout
    proc = run_cli("check", str(examples / "mlp.onnx"), str(plan_dir))
    assert proc.returncode == 0 and ESCAPE not in proc.stderr
    assert sum(line.startswith("… checking on") for line in proc.stderr.splitlines()) == 6, proc.stderr


def test_live_display_shows_iterations_extraction_baselines_and_files(examples: Path, tmp_path: Path) -> None:
    """On a terminal every mesh gets a row that goes through saturation iterations with e-node counts,
    extraction and its result; then the baselines and the device files written."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200, highlight=False)
    steps: list[str] = []
    with LiveTracker(console, on_step=steps.append) as tracker:
        result = optimize(examples / "mlp.onnx", devices=2, output_dir=tmp_path / "plan", tracker=tracker)
    shown = buffer.getvalue()
    assert ESCAPE in shown  # redrawn
    for needle in ("mesh x=2", "e-nodes", "baselines", "device files", f"2 written to {result.plan_dir}"):
        assert needle in shown, needle
    iterations = [s for s in steps if s.startswith("mesh x=2: saturating: ") and " iteration " in s]
    assert len(iterations) >= result.plan.stats["saturation"]["iterations"]
    assert any(s.startswith("mesh x=2: extracting (greedy)") for s in steps)
    assert "device files: 1 of 2 written" in steps and "device files: 2 of 2 written" in steps


def test_tie_break_never_returns_a_plan_dearer_than_a_baseline(examples: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Among plans within TIE_TOLERANCE of the cheapest, the one that communicates least wins — unless it
    costs more than a baseline. Made to happen: the all-replicated plan of the 1-axis mesh (no communication,
    twice the cheapest) joins the options and every plan within 10× is a tie."""
    graph = load_onnx(examples / "mlp.onnx")
    result = search(graph, default_machine(4), "inference", load_rule_files(default_rule_files()), max_axes=1)
    flat = result.trials[0]
    replicated = result.extractors[flat.label].extract(Restriction.one_device())
    assert replicated.plan.cost.comm == 0
    flat.extractions.append((replicated, plan_memory(replicated.plan)))
    dp = result.baselines["data_parallel"]
    assert dp.memory.fits and dp.cost.total < replicated.plan.cost.total
    monkeypatch.setattr(search_module, "TIE_TOLERANCE", 10.0)

    unbounded, _ = search_module._choose([flat])
    assert unbounded.plan is replicated.plan  # without the ceiling the tie-break returns the dearer plan

    chosen, _ = search_module._choose([flat], search_module._ceiling(result.baselines))
    assert chosen.plan is not None
    assert chosen.plan.cost.total <= dp.cost.total * (1 + 1e-9)


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("transformer.onnx", {"devices": 4, "objective": "training"}),
        ("branches.onnx", {"machine": "pcie-a100x8"}),
    ],
    ids=["transformer-4-training", "branches-pcie8"],
)
def test_plan_never_costs_more_than_a_baseline_it_reports(examples: Path, model: str, options: dict) -> None:  # type: ignore[type-arg]
    result = optimize(examples / model, **options)
    report = result.plan.report
    _assert_never_dearer_than_a_baseline({"cost": report["cost"], "baselines": report["baselines"]})
    choice = report["extraction"]["plan_choice"]
    if choice["baseline"] is not None:  # the plan is a baseline's own extraction: said so
        assert report["baselines"][choice["baseline"]]["total_s"] == result.plan.cost.total
        assert choice["baseline"] in choice["note"]


def test_a_cheaper_baseline_the_search_cannot_return_is_named(examples: Path) -> None:
    """4 H100 + 4 A100 PCIe (examples/machines/mixed.toml): every plan over the 8 devices runs at the A100s'
    pace, so the small MLP on one H100 alone is cheaper than any of them. No plan of the machine's mesh can
    be that baseline, so the plan comes with a note naming it and what to do."""
    result = optimize(examples / "mlp.onnx", machine=examples / "machines" / "mixed.toml", max_axes=1)
    report = result.plan.report
    one = report["baselines"]["one_device"]
    assert one["fits"] and one["total_s"] < result.plan.cost.total  # the case this test is about
    cheaper = report["extraction"]["plan_choice"]["cheaper_baseline"]
    assert cheaper["name"] == "one_device" and cheaper["total_s"] == one["total_s"]
    assert "H100" in cheaper["note"] and "alone" in cheaper["note"]
    others = {k: b for k, b in report["baselines"].items() if k != "one_device"}
    _assert_never_dearer_than_a_baseline({"cost": report["cost"], "baselines": others})
