"""``unity-eq optimize``: find a parallel plan for a model, write it, and print its summary.

Separate because the summary table (the plan's mesh, cost, collectives, baselines, search) is most of the
command line's printing code and belongs to this one command.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from unity_eq.cli.run import print_check
from unity_eq.cli.shared import input_shapes, live_display, out, progress_printer
from unity_eq.errors import OptionError

if TYPE_CHECKING:
    from collections.abc import Callable

    from unity_eq.driver import OptimizeRequest
    from unity_eq.planfile import BaselineRecord

    Progress = Callable[[str], None]

__all__ = ["optimize"]


def optimize(
    model: Path = typer.Argument(..., help="The ONNX model to parallelize."),
    devices: int = typer.Option(None, "--devices", "-n", help="N A100-80G GPUs in one node on NVLink."),
    machine: str = typer.Option(
        None, "--machine", "-m", help="A machine TOML file or a preset (a100x8, h100x8, pcie-a100x8)."
    ),
    nodes: int = typer.Option(None, "--nodes", help="Repeat the machine's node N times (presets and one-node files)."),
    interconnect: str = typer.Option(
        None, "--interconnect", help="Network between nodes: ib100, ib200, ib400 or eth100 (default: the preset's)."
    ),
    output: Path = typer.Option(None, "--output", "-o", help="Plan directory to write (default: MODEL.plan/)."),
    input_shape: list[str] = typer.Option([], "--input-shape", help="Fix a dynamic input: name=2x16 (repeatable)."),
    objective: str = typer.Option("inference", "--objective", help="inference (forward latency) or training."),
    mesh: str = typer.Option(None, "--mesh", help="Force a device mesh, e.g. 2x4 or dp=2,tp=4 (default: search)."),
    max_axes: int = typer.Option(3, "--max-axes", help="Search meshes of at most this many axes (1-3)."),
    rules: list[Path] = typer.Option([], "--rules", help="Extra .egg rule files to load (repeatable)."),
    no_generated_rules: bool = typer.Option(
        False,
        "--no-generated-rules",
        help="Leave out the rules `generate-rules` found (rules/generated/): load the core rules alone.",
    ),
    max_iterations: int = typer.Option(12, "--max-iterations", help="Parallel rewrite iterations at most."),
    max_nodes: int = typer.Option(200_000, "--max-nodes", help="Stop saturating past this many e-nodes."),
    time_limit: float = typer.Option(120.0, "--time-limit", help="Stop saturating after this many seconds."),
    memory_limit: float = typer.Option(6.0, "--memory-limit", help="Memory limit of the e-graph engine, GiB."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
    profile: Path = typer.Option(
        None, "--profile", help="Measured op times from `unity-eq profile` (the roofline prices the rest)."
    ),
    blocks: str = typer.Option(
        "auto", "--blocks", help="Optimize piece by piece, reusing repeated blocks: auto (large models), on, off."
    ),
    extractor: str = typer.Option(
        "greedy",
        "--extractor",
        help="greedy; differentiable (a relaxed search seeded with greedy's plan); or ilp (both, then exact).",
    ),
    ilp_time_limit: float = typer.Option(60.0, "--ilp-time-limit", help="Seconds for the ILP extraction."),
    check_plan: bool = typer.Option(
        False, "--check", help="Then run `unity-eq check` on the plan written (exit 1 when it does not match)."
    ),
    pipeline: bool = typer.Option(
        False,
        "--pipeline",
        help="Write a pipeline plan whatever it costs: the stage search alone (stages × data × tensor groups, "
        "microbatches, schedule, recomputation, ZeRO; docs/pipeline.md). `--objective training` weighs "
        "pipelines against SPMD plans without it.",
    ),
    batch: int = typer.Option(
        None, "--batch", help="Training or --pipeline: samples per step (default: the model's batch)."
    ),
    stages: int = typer.Option(None, "--stages", help="With --pipeline: only plans of this many pipeline stages."),
    tensor: int = typer.Option(None, "--tensor", help="With --pipeline: only plans with tensor groups of this size."),
    microbatches: int = typer.Option(
        None, "--microbatches", help="With --pipeline: only plans of this many microbatches per step."
    ),
    plan_only: bool = typer.Option(
        False, "--plan-only", help="Write plan.json alone: no device files, no weight read (weights may be absent)."
    ),
    weight_input: list[str] = typer.Option(
        [], "--weight-input", help="A model input that is a weight (parameters exported as inputs; repeatable)."
    ),
    parameters: Path = typer.Option(
        None,
        "--parameters",
        help="JSON: the source model's parameter names, or initializer -> parameter name(s); the other "
        "initializers are constants (docs/training.md).",
    ),
) -> None:
    """Find a parallel plan for MODEL and write it as a plan directory (device_<rank>.onnx + plan.json)."""
    from unity_eq.driver import Planner, build_request
    from unity_eq.egraph import Limits
    from unity_eq.rulefile.manifest import default_rule_files

    if max_iterations < 1 or max_nodes < 1 or not time_limit > 0:
        raise OptionError("`--max-iterations`, `--max-nodes` and `--time-limit` must be positive.")
    if not memory_limit > 0:
        raise OptionError(f"`--memory-limit`: expected a positive number of GiB, got {memory_limit:g}.")
    if plan_only and check_plan:
        raise OptionError("`--check` runs the device files, which `--plan-only` does not write. Pass one of them.")
    limits = Limits(
        max_iterations=max_iterations,
        max_nodes=max_nodes,
        time_limit_s=time_limit,
        memory_limit_gib=memory_limit,
    )
    request = build_request(
        pipeline=pipeline,
        devices=devices,
        machine=machine,
        nodes=nodes,
        interconnect=interconnect,
        output_dir=output or model.with_suffix(".plan"),
        input_shapes=input_shapes(input_shape),
        objective=objective,
        mesh=mesh,
        max_axes=max_axes,
        limits=limits,
        rule_files=default_rule_files(not no_generated_rules) + list(rules) if rules else None,
        generated_rules=not no_generated_rules,
        profile=profile,
        blocks=blocks,
        extractor=extractor,
        ilp_time_limit=ilp_time_limit,
        plan_only=plan_only,
        weight_inputs=weight_input,
        parameters=parameters,
        batch=batch,
        stages=stages,
        tensor=tensor,
        microbatches=microbatches,
    )
    say = progress_printer(quiet) or (lambda _msg: None)
    match request.planner:
        case Planner.PIPELINE:
            from unity_eq.driver import optimize_pipeline

            staged = optimize_pipeline(model, request, say)
            _print_pipeline_summary(staged)
            plan_dir = staged.plan_dir
        case Planner.TRAINING:
            plan_dir = _optimize_training(model, request, say, quiet)
        case Planner.SPMD:
            from unity_eq.driver import plan_spmd

            live = live_display(quiet)
            with live or contextlib.nullcontext():
                result = plan_spmd(model, request, say, live)
            _print_plan_summary(result)
            plan_dir = result.plan_dir
    if check_plan and plan_dir is not None:
        print_check(model, plan_dir, None, seed=0, tolerance=1e-4, device="cpu", quiet=quiet)


def _optimize_training(model: Path, request: OptimizeRequest, say: Progress, quiet: bool) -> Path | None:
    """``--objective training``: the SPMD search and the stage search on the same workload, the cheaper written
    (unity_eq.driver.training), and a summary that compares them. Returns the plan directory written."""
    from unity_eq.driver import optimize_training

    live = live_display(quiet)
    with live or contextlib.nullcontext():
        found = optimize_training(model, request, say, live)
    rows = _training_rows(found)
    if found.chosen == "pipeline":
        _print_pipeline_summary(found.staged, rows)
    else:
        _print_plan_summary(found.spmd, rows)
    return found.plan_dir


def _training_rows(found: Any) -> list[tuple[str, str]]:
    """What the training search compared: the SPMD plan's step and the best pipeline's, and its notes."""
    spmd, piped = found.spmd_step_s, found.pipeline_step_s
    passes = f" over {found.passes} accumulated passes" if found.passes > 1 else ""
    spmd_text = (
        f"{spmd * 1e3:.1f} ms per step on mesh {found.spmd.plan.mesh}{passes} (with the optimizer's update)"
        if spmd is not None
        else "no SPMD plan fits"
    )
    if piped is not None:
        best = found.staged.search.best.config
        piped_text = f"{piped * 1e3:.1f} ms per step ({best.describe()})"
    else:
        piped_text = "none"
    chosen = found.chosen
    ratio = ""
    if spmd is not None and piped is not None:
        ratio = f"; SPMD {spmd / found.step_s:.2f}×, pipeline {piped / found.step_s:.2f}× the chosen step"
    rows = [
        ("training search", f"{'pipeline' if chosen == 'pipeline' else 'SPMD plan'} chosen{ratio}"),
        ("SPMD search", spmd_text),
        ("best pipeline", piped_text),
    ]
    rows += [("note", note) for note in found.notes]
    return rows


def _print_plan_summary(result: Any, extra: list[tuple[str, str]] | None = None) -> None:
    from unity_eq.report import device_span

    plan = result.plan
    summary = plan.summary()
    table = Table(title=f"plan for {plan.model}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("machine", plan.machine.describe())
    usage = plan.report.parallelism
    unused = usage.unused_axes if usage else ()
    idle = usage.idle_devices if usage else None
    where = f" on {device_span(plan.mesh.devices)}" if idle else ""
    table.add_row("mesh", str(plan.mesh) + where + (f" (unused: {', '.join(unused)})" if unused else ""))
    if usage:
        devices = f"{usage.devices_used} of {usage.machine_devices}"
        table.add_row(
            "devices used", devices + (f": {usage.note}" if usage.note else ", every one doing distinct work")
        )
    table.add_row("objective", plan.objective.name)
    cost = plan.cost
    table.add_row(
        "predicted cost",
        f"{cost.total * 1e3:.3f} ms (compute {cost.compute * 1e3:.3f} ms, communication {cost.comm * 1e3:.3f} ms)",
    )
    collectives: dict[str, int] = {}
    for step in plan.collectives():
        key = f"{type(step).__name__}@{step.axis}"
        collectives[key] = collectives.get(key, 0) + 1
    table.add_row("collectives", ", ".join(f"{k}×{v}" for k, v in collectives.items()) or "none")
    table.add_row("sharded tensors", f"{summary['sharded_tensors']} of {summary['tensors']}")
    memory = plan.report.memory
    if memory:
        table.add_row(
            "memory per device",
            f"{memory.total_bytes / 2**30:.2f} GiB of {memory.capacity_bytes / 2**30:.2f} GiB usable",
        )
    baselines = plan.report.baselines
    if baselines:
        table.add_row("baselines (×plan)", ", ".join(_baseline_text(name, b) for name, b in baselines.items()))
    extraction = plan.report.extraction
    if extraction:
        choice, tie_break = extraction.plan_choice, extraction.tie_break
        cheaper = choice.cheaper_baseline
        for note in (choice.note, cheaper.note if cheaper else None, tie_break.note if tie_break else None):
            if note:
                table.add_row("note", note)
        if extraction.winner is not None:
            table.add_row("extractor", _extractor_text(extraction))
    search = plan.report.mesh_search
    if search:
        runner = search.runner_up
        table.add_row(
            "mesh search",
            f"{len(search.tried)} mesh(es) tried, {len(search.skipped)} skipped"
            + (f"; runner-up {runner.mesh} {runner.cost_s * 1e3:.3f} ms" if runner else ""),
        )
    sat = plan.stats.saturation
    enodes, iterations, stop = (sat.enodes, sat.iterations, sat.stop_reason) if sat else (None, None, None)
    table.add_row("search", f"{enodes} e-nodes, {iterations} iterations ({stop}), " + _search_time(result.timings))
    for key, value in extra or ():
        table.add_row(key, value)
    if result.plan_dir is not None:
        only = " (plan.json only: --plan-only)" if result.lowered is not None and result.lowered.plan_only else ""
        table.add_row("written to", f"{result.plan_dir}{only}")
    out.print(table)


def _extractor_text(extraction: Any) -> str:
    """Which extractor's plan was kept, by how much it beat greedy's, and the gap the ILP proved."""
    text = f"{extraction.winner} kept"
    if extraction.winner != "greedy":
        text += f", {extraction.winner_saving:.2%} cheaper than greedy"
    relaxed = extraction.differentiable
    if relaxed is not None:
        text += f"; differentiable {relaxed.improvement:+.2%} vs greedy in {relaxed.seconds:.1f} s"
    if extraction.ilp is not None:
        text += f"; ILP gap ≤ {extraction.ilp.max_gap:.1%}" + (" (optimal)" if extraction.ilp.all_optimal else "")
    return text


def _print_pipeline_summary(result: Any, extra: list[tuple[str, str]] | None = None) -> None:
    from unity_eq.explain.pipeline import summary_rows

    record = result.record
    table = Table(title=f"pipeline plan for {record.model}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = summary_rows(record)
    keys, values = {key for key, _ in rows}, {value for _, value in rows}
    for key, value in [*rows, *((k, v) for k, v in extra or () if k not in keys and v not in values)]:
        table.add_row(key, value)
    if result.plan_dir is not None:
        what = "stage directories and plan.json" if result.record.lowered else "plan.json only"
        table.add_row("written to", f"{result.plan_dir} ({what}; `unity-eq explain {result.plan_dir}` shows it)")
    out.print(table)


def _baseline_text(name: str, baseline: BaselineRecord) -> str:
    """``data_parallel 1.24 (x=16, 16 devices)``: the ratio to the plan, the mesh it ran on, how many devices
    did distinct work, and whether it fits: a ratio means little without what it compares."""
    ratio = "-" if baseline.ratio is None else f"{baseline.ratio:.2f}"
    devices, used = baseline.devices, baseline.devices_used
    if devices == 1:
        where = "1 device"
    else:
        where = f"on {baseline.mesh}, " + (
            f"{devices} devices" if used == devices else f"{used} of {devices} devices do distinct work"
        )
    fits = "" if baseline.fits else ", does not fit"
    return f"{name} {ratio} ({where}{fits})"


def _search_time(timings: dict[str, float]) -> str:
    """The search's wall time, and the meshes' time summed over the workers that ran side by side."""
    text = f"{timings.get('search_s', 0.0):.2f} s"
    worker = timings.get("worker_s")
    if worker is not None:
        text += f" (meshes' time summed over parallel workers: {worker:.2f} s)"
    wall = timings.get("wall_s")
    if wall is not None:
        text += f"; {wall:.2f} s in all"
    return text
