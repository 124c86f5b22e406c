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

import unity_eq.search.choose as search_module
from unity_eq import optimize
from unity_eq.extract import Restriction
from unity_eq.frontends.onnx import load_onnx
from unity_eq.machine import default_machine
from unity_eq.memory import plan_memory
from unity_eq.planfile import PlanReport
from unity_eq.progress import LiveTracker
from unity_eq.rulefile.manifest import default_rule_files, load_rule_files
from unity_eq.search import search

ESCAPE = "\x1b["


def _assert_never_dearer_than_a_baseline(meta: dict) -> None:  # type: ignore[type-arg]
    """Every baseline that fits costs at least the plan (float noise aside)."""
    total = meta["cost"]["total_s"]
    for name, b in meta["baselines"].items():
        if b["fits"]:
            assert b["total_s"] >= total * (1 - 1e-9), (name, b["total_s"], total)
            assert b["ratio"] >= 1 - 1e-9, (name, b["ratio"])


def _as_meta(report: PlanReport, leave_out: str = "") -> dict:  # type: ignore[type-arg]
    """The search's report as the plan.json sections ``cost`` and ``baselines`` (without ``leave_out``)."""
    assert report.cost is not None
    baselines = {name: b.to_json() for name, b in report.baselines.items() if name != leave_out}
    return {"cost": report.cost.to_json(), "baselines": baselines}


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
    assert result.plan.stats.saturation is not None
    assert len(iterations) >= result.plan.stats.saturation.iterations
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

    unbounded, tie_break = search_module.choose_trial([flat])
    assert unbounded.plan is replicated.plan  # without the ceiling the tie-break returns the dearer plan
    # and says so: the summary and `explain` show this note next to a runner-up that costs less
    assert tie_break is not None and tie_break.cheapest.total_s < replicated.plan.cost.total
    note = tie_break.note
    assert note.startswith(f"{flat.label} ") and "less than this plan" in note and "communicates less" in note

    chosen, _ = search_module.choose_trial([flat], search_module.baseline_ceiling(result.baselines))
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
    _assert_never_dearer_than_a_baseline(_as_meta(report))
    assert report.extraction is not None
    choice = report.extraction.plan_choice
    if choice.baseline is not None:  # the plan is a baseline's own extraction: said so
        assert report.baselines[choice.baseline].total_s == result.plan.cost.total
        assert choice.note is not None and choice.baseline in choice.note


def test_on_a_mixed_machine_the_plan_may_leave_the_slow_devices_idle(examples: Path, tmp_path: Path) -> None:
    """4 H100 + 4 A100 PCIe (examples/machines/mixed.toml): every plan over the 8 devices runs at the A100s'
    pace, and the small MLP on one H100 costs less than any of them. The search also tries the H100 node
    alone (the A100 node's meshes are dominated by it) and the one-device plan, so the plan never costs more
    than a baseline it reports; it says which devices it uses and which stay idle, lowers, runs and checks."""
    machine = examples / "machines" / "mixed.toml"
    result = optimize(examples / "mlp.onnx", machine=machine, max_axes=2, output_dir=tmp_path / "plan")
    report = result.plan.report
    _assert_never_dearer_than_a_baseline(_as_meta(report))
    assert report.baselines["one_device"].total_s < report.baselines["data_parallel"].total_s
    assert report.extraction is not None and report.extraction.plan_choice.cheaper_baseline is None
    assert result.plan.mesh.devices == (0, 1, 2, 3)  # the H100 node
    assert report.mesh_search is not None
    tried = {t.mesh: t for t in report.mesh_search.tried}
    assert {"x=8", "x=4 on devices 0-3", "x=1 on device 0"} <= set(tried)
    assert tried["x=4 on devices 0-3"].device_kind == "H100-SXM-80G"
    assert tried["x=4 on devices 0-3"].devices == "0-3"
    skipped = {t.mesh: t.reason for t in report.mesh_search.skipped}
    assert skipped["x=4 on devices 4-7"].startswith("dominated: devices 0-3")
    usage = report.parallelism
    assert usage is not None and usage.machine_devices == 8 and usage.idle_devices == 4
    assert usage.note is not None and "devices 4-7 (4 × A100-PCIe-40G) stay idle" in usage.note

    meta = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert meta["mesh"]["devices"] == [0, 1, 2, 3]
    assert [r["device_kind"] for r in meta["mesh"]["ranks"]] == ["H100-SXM-80G"] * 4
    proc = run_cli("check", str(examples / "mlp.onnx"), str(tmp_path / "plan"), "-q")
    assert proc.returncode == 0 and "match" in proc.stdout, proc.stderr
    proc = run_cli("explain", str(tmp_path / "plan"))
    assert proc.returncode == 0 and "on devices 0-3" in proc.stdout and "stay idle" in proc.stdout, proc.stderr


def test_the_one_device_plan_is_returned_on_a_device_other_than_0(examples: Path, tmp_path: Path) -> None:
    """The A100 node first and the H100 node on a slow link: the fastest device is device 4 and no plan over
    several devices beats it alone. The plan is the one_device baseline on device 4; plan.json says rank 0 is
    machine device 4; it lowers to one file, runs and checks."""
    text = (examples / "machines" / "mixed.toml").read_text()
    head, hopper, ampere = text.split("[[nodes]]")
    fast = "[links.nvlink4]\nbandwidth_gbs = 450\nlatency_us = 1.5"
    assert fast in head
    head = head.replace(fast, "[links.nvlink4]\nbandwidth_gbs = 2\nlatency_us = 200")
    machine = tmp_path / "slow.toml"
    machine.write_text(head + "[[nodes]]" + ampere.rstrip() + "\n\n[[nodes]]" + hopper)
    result = optimize(examples / "mlp.onnx", machine=machine, max_axes=2, output_dir=tmp_path / "plan")
    report = result.plan.report
    _assert_never_dearer_than_a_baseline(_as_meta(report))
    assert report.mesh_search is not None and report.extraction is not None and report.parallelism is not None
    assert result.plan.mesh.devices == (4,) and report.mesh_search.chosen == "x=1 on device 4"
    assert report.extraction.plan_choice.baseline == "one_device"
    assert report.parallelism.unused_axes == () and report.parallelism.idle_devices == 7
    meta = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert meta["files"] == ["device_0.onnx"]
    rank = {"rank": 0, "coords": [0], "device": 4, "device_kind": "H100-SXM-80G", "node": 1}
    assert meta["mesh"]["ranks"] == [rank]
    proc = run_cli("check", str(examples / "mlp.onnx"), str(tmp_path / "plan"), "-q")
    assert proc.returncode == 0 and "match" in proc.stdout, proc.stderr


def test_a_cheaper_baseline_the_search_cannot_return_is_named_under_forced_mesh(examples: Path) -> None:
    """`--mesh x=8` on mixed.toml: the search may not return the one-device plan, so the plan comes with a
    note naming it and what to do (drop `--mesh`)."""
    result = optimize(examples / "mlp.onnx", machine=examples / "machines" / "mixed.toml", mesh="x=8")
    report = result.plan.report
    one = report.baselines["one_device"]
    assert one.fits and one.total_s < result.plan.cost.total  # the case this test is about
    assert report.extraction is not None
    cheaper = report.extraction.plan_choice.cheaper_baseline
    assert cheaper is not None and cheaper.name == "one_device" and cheaper.total_s == one.total_s
    assert "H100" in cheaper.note and "drop `--mesh`" in cheaper.note
    assert result.plan.mesh.devices == tuple(range(8))
    _assert_never_dearer_than_a_baseline(_as_meta(report, leave_out="one_device"))
