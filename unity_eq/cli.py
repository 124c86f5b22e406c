"""The ``unity-eq`` command line: one verb per job.

Every verb turns a :class:`~unity_eq.errors.UnityEqError` into one line on stderr and a non-zero exit code;
only a bug in unity-eq itself shows a traceback. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from unity_eq.errors import OptionError, UnityEqError
from unity_eq.files import check_output_file, check_output_folder, received_signal

if TYPE_CHECKING:
    from unity_eq.planfile import BaselineRecord

app = typer.Typer(
    name="unity-eq",
    help="Decide how to run an ONNX model across many devices, with e-graphs and rules proven by Z3.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("unity-eq")
        except PackageNotFoundError:  # run from a source tree that is not installed
            from unity_eq.version import __version__ as number
        out.print(f"unity-eq {number}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_version, is_eager=True
    ),
) -> None:
    """Decide how to run an ONNX model across many devices, with e-graphs and rules proven by Z3."""


def _progress(quiet: bool) -> Any:
    if quiet:
        return None

    def say(message: str) -> None:
        _remember(message)
        err.print(f"[dim]… {escape(message)}[/dim]")

    return say


def _remember(message: str) -> None:
    _last_step[:] = [message]


def _live(quiet: bool, transient: bool = False) -> Any:
    """A live display of the progress rows on stderr when it is a terminal and not ``-q``; else None (then
    progress, if any, is plain lines: a log or a pipe gets no redrawn display). ``transient``: it goes away
    when done (run and check print their results next)."""
    if quiet or not err.is_terminal:
        return None
    from unity_eq.progress import LiveTracker

    return LiveTracker(err, on_step=_remember, transient=transient)


def _input_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    from unity_eq.frontends.onnx import parse_input_shape

    shapes: dict[str, tuple[int, ...]] = {}
    for text in values:
        name, shape = parse_input_shape(text)
        if name in shapes and shapes[name] != shape:
            given = "x".join(map(str, shapes[name]))
            raise OptionError(f"`--input-shape`: input {name!r} given twice, as {given} and as {text!r}. Pass one.")
        shapes[name] = shape
    return shapes


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    from unity_eq.runtime import load_npz

    return load_npz(path)  # one loader for every verb: a .npy or a broken file is one clear error


@app.command()
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
        False, "--no-generated-rules", help="Load only the hand-written rules (not rules/generated/shrinking.egg)."
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
    extractor: str = typer.Option("greedy", "--extractor", help="greedy, or ilp (exact, seeded with greedy)."),
    ilp_time_limit: float = typer.Option(60.0, "--ilp-time-limit", help="Seconds for the ILP extraction."),
    check_plan: bool = typer.Option(
        False, "--check", help="Then run `unity-eq check` on the plan written (exit 1 when it does not match)."
    ),
) -> None:
    """Find a parallel plan for MODEL and write it as a plan directory (device_<rank>.onnx + plan.json)."""
    from unity_eq.egraph import Limits
    from unity_eq.pipeline import optimize as run_optimize
    from unity_eq.rulesets import default_rule_files

    if max_iterations < 1 or max_nodes < 1 or not time_limit > 0:
        raise OptionError("`--max-iterations`, `--max-nodes` and `--time-limit` must be positive.")
    if not memory_limit > 0:
        raise OptionError(f"`--memory-limit`: expected a positive number of GiB, got {memory_limit:g}.")
    target = output or model.with_suffix(".plan")
    limits = Limits(
        max_iterations=max_iterations,
        max_nodes=max_nodes,
        time_limit_s=time_limit,
        memory_limit_gib=memory_limit,
    )
    rule_files = None
    if rules:
        rule_files = default_rule_files(not no_generated_rules) + list(rules)
    live = _live(quiet)
    with live or contextlib.nullcontext():
        result = run_optimize(
            model,
            devices=devices,
            machine=machine,
            nodes=nodes,
            interconnect=interconnect,
            max_axes=max_axes,
            output_dir=target,
            input_shapes=_input_shapes(input_shape),
            objective=objective,
            mesh=mesh,
            limits=limits,
            rule_files=rule_files,
            generated_rules=not no_generated_rules,
            progress=_progress(quiet),
            profile=profile,
            blocks=blocks,
            extractor=extractor,
            ilp_time_limit=ilp_time_limit,
            tracker=live,
        )
    _print_plan_summary(result)
    if check_plan and result.plan_dir is not None:
        _check_plan(model, result.plan_dir, None, seed=0, tolerance=1e-4, device="cpu", quiet=quiet)


def _print_plan_summary(result: Any) -> None:
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
    if result.plan_dir is not None:
        table.add_row("written to", str(result.plan_dir))
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


@app.command()
def run(
    plan_dir: Path = typer.Argument(..., help="A plan directory written by `unity-eq optimize`."),
    inputs: Path = typer.Option(None, "--inputs", "-i", help=".npz with one array per model input (default: random)."),
    outputs: Path = typer.Option(None, "--outputs", help="Write the outputs to this .npz file."),
    backend: str = typer.Option("local", "--backend", help="local (all ranks in this process) or mpi (under mpiexec)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda (falls back to the CPU with a message) or auto."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs used without --inputs."),
    timeout: float = typer.Option(
        None, "--timeout", help="Seconds a rank waits for the others in one collective before failing (default 300)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages (notes and warnings stay)."),
) -> None:
    """Run every shard of a plan and write the model's outputs."""
    from unity_eq.runtime import load_plan_dir, random_inputs, run_plan

    def note(message: str) -> None:
        err.print(f"[yellow]{escape(message)}[/yellow]")

    def check_outputs() -> None:
        if outputs is not None:
            check_output_file(outputs, "`--outputs`")

    results: dict[str, np.ndarray] | None
    if backend == "mpi":
        from unity_eq.progress import LineTracker, Tracker
        from unity_eq.runtime.mpi import run_plan_mpi

        # Every rank checks its options, plan and inputs inside run_plan_mpi, so that a failure on any rank
        # reaches all of them and is printed once. Rank 0 reports progress as plain lines (mpiexec forwards the
        # ranks' output through pipes: no live display): the row `run` when it starts and ends, as `optimize`
        # reports its meshes in a log.
        say = _progress(quiet)
        results = run_plan_mpi(
            plan_dir,
            inputs,
            seed=seed,
            device=device,
            timeout=timeout,
            on_note=note,
            check_outputs=check_outputs,
            on_progress=say or (lambda _message: None),
            tracker=Tracker() if say is None else LineTracker(say, prefix="run"),
        )
        if results is None:
            return  # ranks other than 0 write nothing
    elif backend == "local":
        if timeout is not None and timeout <= 0:
            raise OptionError(f"`--timeout` must be positive, got {timeout:g}.")
        check_outputs()
        plan = load_plan_dir(plan_dir)
        if inputs is None:
            feeds = random_inputs(plan.input_specs, seed)
            if not quiet:
                err.print(f"[dim]… no --inputs: using random inputs (seed {seed})[/dim]")
        else:
            feeds = _load_npz(inputs)
        live = _live(quiet, transient=True)
        with live or contextlib.nullcontext():
            results = run_plan(plan, feeds, device=device, on_note=note, timeout=timeout, tracker=live)
    else:
        raise OptionError(f"`--backend`: expected local or mpi, got {backend!r}.")
    if outputs is not None:
        partial = outputs.with_name(f".{outputs.name}.tmp-{os.getpid()}.npz")
        try:
            np.savez(partial, **results)  # type: ignore[arg-type]
            partial.replace(outputs)  # an interrupt never leaves a half-written file under the user's name
        except OSError as exc:
            raise OptionError(f"`--outputs` {outputs}: cannot write ({exc.strerror or exc}).") from None
        finally:
            partial.unlink(missing_ok=True)
        out.print(f"wrote {len(results)} output(s) to {outputs}")
    for name, value in results.items():
        out.print(f"{name}: {value.dtype}{list(value.shape)} mean {float(np.mean(value)):.6g}")


@app.command()
def check(
    model: Path = typer.Argument(..., help="The original ONNX model."),
    plan_dir: Path = typer.Argument(..., help="The plan directory made from it."),
    inputs: Path = typer.Option(None, "--inputs", "-i", help=".npz inputs (default: random, seeded)."),
    seed: int = typer.Option(0, "--seed", help="First seed of the random inputs."),
    tolerance: float = typer.Option(1e-4, "--tolerance", help="Largest relative error accepted for float32."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto for the plan's ranks."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
) -> None:
    """Run the original model and the plan on the same inputs (without --inputs: several seeds, scales and
    distributions); exit 0 when every output matches, 1 on a mismatch, 2 on bad input."""
    feeds = _load_npz(inputs) if inputs is not None else None
    _check_plan(model, plan_dir, feeds, seed=seed, tolerance=tolerance, device=device, quiet=quiet)


def _check_plan(model: Path, plan_dir: Path, feeds: Any, seed: int, tolerance: float, device: str, quiet: bool) -> None:
    """Print the worst error of every output over every input set, then raise CheckFailed on a mismatch."""
    from unity_eq.runtime import assert_check
    from unity_eq.runtime import check as run_check

    if not tolerance >= 0:
        raise OptionError(f"`--tolerance`: expected a relative error of 0 or more, got {tolerance:g}.")
    live = _live(quiet, transient=True)
    with live or contextlib.nullcontext():
        result = run_check(
            model,
            plan_dir,
            feeds,
            seed=seed,
            tolerance=tolerance,
            device=device,
            on_progress=None if live else _progress(quiet),
            tracker=live,
        )
    for o in result.outputs:
        mark = "[green]ok[/green]" if o.passed else "[red]MISMATCH[/red]"
        out.print(
            f"{mark} {escape(o.name)}: worst relative error {o.relative_error:.2e}, max abs error "
            f"{o.max_abs_error:.3g} ({escape(o.inputs)})"
        )
    out.print(escape(result.describe()))
    assert_check(result)


@app.command("profile")
def profile_cmd(
    model: Path = typer.Argument(..., help="The ONNX model whose ops to measure."),
    devices: int = typer.Option(None, "--devices", "-n", help="Devices of the mesh to profile for."),
    mesh: str = typer.Option(None, "--mesh", help="Device mesh, e.g. 2x4 or dp=2,tp=4 (default: one axis)."),
    output: Path = typer.Option(None, "--output", "-o", help="Table to write (default: MODEL.profile.json)."),
    input_shape: list[str] = typer.Option([], "--input-shape", help="Fix a dynamic input: name=2x16 (repeatable)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda (falls back to the CPU with a message) or auto."),
    threads: int = typer.Option(None, "--threads", help="onnxruntime threads on the CPU (default: all cores)."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed runs of each op first."),
    repeats: int = typer.Option(10, "--repeats", help="Timed runs of each op at least (the median is kept)."),
    min_time: float = typer.Option(0.05, "--min-time", help="Keep repeating (up to 20× --repeats) for this long, s."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
) -> None:
    """Measure every distinct op (on its shard shapes) of MODEL's e-graph on this machine's device."""
    from unity_eq.profile import profile_model

    target = output or model.with_suffix(".profile.json")
    if target.is_dir():
        raise OptionError(f"`-o` {target}: is a directory; pass a file name such as {target / 'profile.json'}.")
    check_output_file(target, "`-o`", make_parents=True)
    table = profile_model(
        model,
        devices=devices,
        mesh=mesh,
        input_shapes=_input_shapes(input_shape),
        device=device,
        threads=threads,
        warmup=warmup,
        repeats=repeats,
        min_time=min_time,
        progress=_progress(quiet),
    )
    table.save(target)
    meta, summary = table.meta, table.meta["summary"]
    if meta["device"].get("note") and quiet:  # without -q it was said as progress
        err.print(f"[yellow]{escape(meta['device']['note'])}[/yellow]")
    cal = meta["calibration"]
    grid = Table(title=f"profile of {meta['model']['name']}", show_header=False, title_justify="left")
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("device", f"{meta['device']['description']} ({meta['device']['provider']})")
    grid.add_row(
        "mesh", " × ".join(f"{a}={n}" for a, n in zip(meta["mesh"]["axes"], meta["mesh"]["sizes"], strict=True))
    )
    grid.add_row(
        "calibration",
        f"{cal['peak_flops']['float32'] / 1e9:.1f} GFLOP/s, {cal['memory_bandwidth'] / 1e9:.1f} GB/s, "
        f"{cal['launch_overhead_s'] * 1e6:.1f} µs per op",
    )
    grid.add_row("ops", f"{len(table.entries)} measured, {len(table.skipped)} skipped (priced by the roofline)")
    if "median_relative_error" in summary:
        by_op = ", ".join(f"{op} {err:.2f}" for op, err in summary["median_relative_error_by_op"].items())
        grid.add_row(
            "roofline vs measured",
            f"median relative error {summary['median_relative_error']:.2f}, "
            f"{summary['within_2x'] * 100:.0f}% within 2× ({by_op})",
        )
    grid.add_row("time", f"{meta['seconds']:.1f} s")
    grid.add_row("written to", str(target))
    out.print(grid)


@app.command()
def verify(
    paths: list[Path] = typer.Argument(None, help=".egg files to verify (default: every shipped rule)."),
    rule: list[str] = typer.Option([], "--rule", "-r", help="Verify only this rule (repeatable)."),
    json_path: str = typer.Option(None, "--json", help="Write a JSON report to this file (`-` for stdout)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes (default: one per CPU)."),
    budget: int = typer.Option(
        0, "--budget", min=0, help="At most this many cases per rule (0: every case; stopping early is `partial`)."
    ),
    cross_check: int = typer.Option(
        1000,
        "--cross-check",
        min=0,
        help="Bounded cases that check the axioms of a rule proven generically (0: every case).",
    ),
    timeout: int = typer.Option(2000, "--timeout", help="z3 timeout per case, in milliseconds."),
    no_generic: bool = typer.Option(False, "--no-generic", help="Skip the shape-generic proofs."),
    no_numeric: bool = typer.Option(False, "--no-numeric", help="Skip the numeric back-up."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only failures and the summary."),
) -> None:
    """Prove every rewrite rule sound with z3; exit 0 iff every rule is proven."""
    from unity_eq.verify import Options
    from unity_eq.verify._cli import run as run_verify

    options = Options(
        generic=not no_generic,
        numeric=not no_numeric,
        budget=budget or None,
        cross_check=cross_check or None,
        timeout_ms=timeout,
        jobs=jobs,
    )
    if json_path and json_path != "-":
        check_output_file(Path(json_path), "`--json`")
    code = run_verify(paths or None, rule, options, json_path, quiet, out)
    if code:
        raise typer.Exit(code)


@app.command()
def explain(
    plan_dir: Path = typer.Argument(..., help="A plan directory written by `unity-eq optimize`."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (same as `--format json`)."),
    fmt: str = typer.Option(
        "text", "--format", "-f", help="text or json (printed), or a picture: dot, svg or html (written to a file)."
    ),
    output: Path = typer.Option(
        None, "--output", "-o", help="File to write (default for a picture: plan.FORMAT in the plan directory)."
    ),
    max_ops: int = typer.Option(
        None, "--max-ops", help="Ops to show: text report 60 (PCG lines twice that), pictures 150 (the rest noted)."
    ),
) -> None:
    """Explain a plan: shardings, cost split, memory, baselines with their ratio to the plan, and the PCG.

    `--format svg|html|dot` draws it: the parallel computation graph coloured by placement, the mesh on the
    machine's nodes and the cost split as a chart."""
    import json

    from unity_eq.explain import explain as build_report
    from unity_eq.explain import reading_plan, render

    if as_json and fmt not in ("text", "json"):
        raise OptionError(f"`--json` and `--format {fmt}` disagree: pass one of them.")
    fmt = "json" if as_json else fmt
    if fmt in ("dot", "svg", "html"):
        from unity_eq.picture import write_picture

        picture = write_picture(plan_dir, fmt, output, max_ops=150 if max_ops is None else max_ops)
        if picture.note:
            err.print(f"[yellow]{escape(picture.note)}[/yellow]")
        out.print(f"wrote {picture.path}", markup=False)
        return
    if fmt not in ("text", "json"):
        raise OptionError(f"`--format`: expected text, json, dot, svg or html; got {fmt!r}.")
    if output is not None:
        check_output_file(output, "`-o`")
    report = build_report(plan_dir)
    with reading_plan(plan_dir):
        text = (
            json.dumps(report.to_json(), indent=1)
            if fmt == "json"
            else render(report, max_ops=60 if max_ops is None else max_ops)
        )
    if output is None:
        out.print(text, markup=False)
        return
    from unity_eq.files import write_file_atomic

    write_file_atomic(output, text + "\n", "`-o`")
    out.print(f"wrote {output}", markup=False)


@app.command("generate-rules")
def generate_rules(
    ops: str = typer.Option(
        "MatMul,Add,Relu,Concat,Split,Transpose,Partition,Combine,Replicate,Reduce",
        "--ops",
        help="Comma-separated operators to enumerate over.",
    ),
    max_size: int = typer.Option(3, "--max-size", help="Operators per enumerated graph, at most (1-3)."),
    output: Path = typer.Option(
        None, "--output", "-o", help="Directory for the .egg files and report (default: print the report only)."
    ),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes for the proofs (default: one per CPU)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random fingerprint inputs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Enumerate small graphs, fingerprint them exactly, prove the candidate rules with z3, prune and write them."""
    from unity_eq.verify._generate import check_ops, render_report
    from unity_eq.verify._generate import generate_rules as run_generate

    names = check_ops(ops)
    if output is not None:
        check_output_folder(output, "`-o`")
    if not 1 <= max_size <= 3:
        raise OptionError(f"`--max-size`: expected 1, 2 or 3, got {max_size}. Size 4 does not finish in hours.")
    if jobs < 0:
        raise OptionError(f"`--jobs`: expected 0 (one per CPU) or more, got {jobs}.")
    if quiet:
        report = run_generate(names, max_size, output, jobs=jobs, seed=seed)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        ) as bar:
            tasks: dict[str, Any] = {}

            def tick(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(phase, total=total)
                bar.update(tasks[phase], completed=done, total=total)

            report = run_generate(names, max_size, output, jobs=jobs, seed=seed, progress=tick)
    out.print(render_report(report), markup=False)
    if output is not None:
        out.print(f"\nwritten to {output}/ (report.md, report.json)", markup=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: run the app, turn our errors into one line and an exit code.

    SIGINT and SIGTERM unwind the command (temporary files and engine processes are removed on the way) and
    end it with one line saying what was interrupted, exit 128 + the signal's number."""
    from unity_eq.files import install_signal_handlers, received_signal

    install_signal_handlers()
    try:
        rv = app(args=argv, standalone_mode=False)
        signum = received_signal()
        if signum is not None:  # typer ≥ 0.25 turns an interrupt into exit code 130
            _say_interrupted(argv if argv is not None else sys.argv[1:], signum)
            return 128 + signum
        if isinstance(rv, int) and rv:
            return rv  # a command's typer.Exit(code)
    except UnityEqError as exc:
        signum = received_signal()
        if signum is not None:  # a library turned the interrupt into its own error (onnxruntime loading a model)
            _say_interrupted(argv if argv is not None else sys.argv[1:], signum)
            return 128 + signum
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return exc.exit_code
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except _CLICK_ERROR as exc:  # usage errors: a mistyped option, a bad value, an unknown verb (exit 2)
        _usage_error(exc)
        return int(getattr(exc, "exit_code", 2))
    except BaseException as exc:
        signum = received_signal()
        if signum is None and not isinstance(exc, KeyboardInterrupt):
            if isinstance(exc, typer.Abort):
                err.print("aborted")
                return 1
            raise
        # click turns the interrupt into its own Abort; whichever arrives, say what stopped
        _say_interrupted(argv if argv is not None else sys.argv[1:], signum)
        return 128 + (signum or signal.SIGINT)
    return 0


def entry() -> int:
    """The console script: :func:`main`, then an exit that a late signal cannot turn into a silent death.

    Once the command is over (its result printed, its files written), the interpreter still takes a moment to
    exit, and has by then put back the default handlers: a SIGTERM in that moment ended the process with -15
    and no word. From the end of :func:`main` on, SIGINT and SIGTERM are ignored: the process is only exiting,
    with the command's own exit status. Not under MPI: there the exit finalizes MPI, which waits for the other
    ranks, and mpiexec's SIGTERM (or the parent-death signal) must still end a rank stuck there."""
    try:
        code = main()
    except KeyboardInterrupt:  # the signal came in the instant main returned
        signum = received_signal()
        _say_interrupted(sys.argv[1:], signum)
        code = 128 + (signum or signal.SIGINT)
    finally:
        if "unity_eq.runtime.mpi" not in sys.modules:
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
    return code


_last_step: list[str] = []  # the latest progress message, to say where an interrupt stopped


def _say_interrupted(argv: list[str], signum: int | None) -> None:
    """``interrupted by SIGINT: unity-eq optimize (at: mesh x=4: saturating); temporary files removed``."""
    verb = next((a for a in argv if not a.startswith("-")), "")
    name = signal.Signals(signum).name if signum else "SIGINT"
    where = f" (at: {_last_step[-1]})" if _last_step else ""
    err.print(
        f"[red]interrupted[/red] by {name}: unity-eq {escape(verb)}{escape(where)}; its temporary files are removed"
    )


def _usage_error(exc: Exception) -> None:
    """One ``error:`` line naming the command's help; no arguments at all shows the help itself."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        exc.show()  # type: ignore[attr-defined]
        return
    message = exc.format_message()  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    where = f"`{ctx.command_path} --help`" if ctx is not None else "`unity-eq --help`"
    err.print(f"[red]error:[/red] {escape(message)} (see {where})")


def _click_error_type() -> type[Exception]:
    """The ClickException class typer raises: typer ≥ 0.25 carries its own copy of click (``typer._click``), so
    the ``click`` package's class would never match. ``typer.BadParameter`` derives from the one in use."""
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "ClickException" and issubclass(cls, Exception):
            return cls
    raise AssertionError("typer.BadParameter does not derive from a ClickException")  # pragma: no cover


_CLICK_ERROR = _click_error_type()


if __name__ == "__main__":
    sys.exit(entry())
