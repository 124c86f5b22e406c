"""``unity-eq run`` and ``unity-eq check``: run a plan directory (local or MPI backend), and compare it with
the original model.

Together because both run a plan's ranks and print per-output results; :func:`print_check` also serves
``optimize --check``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.markup import escape

from unity_eq.cli.shared import (
    RECOMPUTE_OPTION,
    SHARED_OPTION,
    ZERO_AXIS_OPTION,
    ZERO_OPTION,
    err,
    live_display,
    out,
    progress_printer,
    read_npz,
)
from unity_eq.errors import OptionError
from unity_eq.files import check_output_file

__all__ = ["check", "print_check", "run"]


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
    from unity_eq.runtime import random_inputs, run_plan
    from unity_eq.runtime.plandir import refuse_plan_output

    def note(message: str) -> None:
        err.print(f"[yellow]{escape(message)}[/yellow]")

    def check_outputs() -> None:
        if outputs is not None:
            refuse_plan_output(outputs, plan_dir)
            check_output_file(outputs, "`--outputs`")

    results: dict[str, np.ndarray] | None
    if backend == "mpi":
        from unity_eq.progress import LineTracker, Tracker
        from unity_eq.runtime.mpi import run_plan_mpi

        # Every rank checks its options, plan and inputs inside run_plan_mpi, so that a failure on any rank
        # reaches all of them and is printed once. Rank 0 reports progress as plain lines (mpiexec forwards the
        # ranks' output through pipes: no live display): the row `run` when it starts and ends, as `optimize`
        # reports its meshes in a log.
        say = progress_printer(quiet)
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
        from unity_eq.runtime.pipeline import PipelinePlan, read_plan, run_pipeline

        loaded = read_plan(plan_dir)
        pipeline = loaded if isinstance(loaded, PipelinePlan) else None
        plan = loaded.whole if isinstance(loaded, PipelinePlan) else loaded
        if inputs is None:
            feeds = random_inputs(plan.input_specs, seed)
            if not quiet:
                err.print(f"[dim]… no --inputs: using random inputs (seed {seed})[/dim]")
        else:
            feeds = read_npz(inputs)
        live = live_display(quiet, transient=True)
        with live or contextlib.nullcontext():
            if pipeline is not None:
                results = run_pipeline(pipeline, feeds, device=device, timeout=timeout, on_note=note)
            else:
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


def check(
    model: Path = typer.Argument(..., help="The original ONNX model."),
    plan_dir: Path = typer.Argument(..., help="The plan directory made from it."),
    inputs: Path = typer.Option(None, "--inputs", "-i", help=".npz inputs (default: random, seeded)."),
    seed: int = typer.Option(0, "--seed", help="First seed of the random inputs."),
    tolerance: float = typer.Option(1e-4, "--tolerance", help="Largest relative error accepted for float32."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto for the plan's ranks."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
    training: bool = typer.Option(False, "--training", help="Train K steps on the ranks and on one device; compare."),
    steps: int = typer.Option(2, "--steps", help="With --training: optimizer steps."),
    loss: str = typer.Option(None, "--loss", help="With --training: sum or mean of the first output."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="With --training: sgd or adamw."),
    lr: float = typer.Option(1e-2, "--lr", help="With --training: learning rate."),
    zero: int = ZERO_OPTION,
    zero_axis: str = ZERO_AXIS_OPTION,
    recompute: bool = RECOMPUTE_OPTION,
    shared: list[str] = SHARED_OPTION,
) -> None:
    """Run the original model and the plan on the same inputs (without --inputs: several seeds, scales and
    distributions); exit 0 when every output matches, 1 on a mismatch, 2 on bad input. With --training:
    train both (docs/training.md)."""
    if training:
        from unity_eq.cli.train import print_training_check

        print_training_check(
            model, plan_dir, inputs, steps=steps, optimizer=optimizer, lr=lr, loss=loss, tolerance=tolerance,
            seed=seed, quiet=quiet, zero=zero, zero_axis=zero_axis, recompute=recompute, shared=shared,
        )  # fmt: skip
        return
    feeds = read_npz(inputs) if inputs is not None else None
    print_check(model, plan_dir, feeds, seed=seed, tolerance=tolerance, device=device, quiet=quiet)


def print_check(model: Path, plan_dir: Path, feeds: Any, seed: int, tolerance: float, device: str, quiet: bool) -> None:
    """Print the worst error of every output over every input set, then raise CheckFailed on a mismatch."""
    from unity_eq.runtime import assert_check
    from unity_eq.runtime import check as run_check

    if not tolerance >= 0:
        raise OptionError(f"`--tolerance`: expected a relative error of 0 or more, got {tolerance:g}.")
    live = live_display(quiet, transient=True)
    with live or contextlib.nullcontext():
        result = run_check(
            model,
            plan_dir,
            feeds,
            seed=seed,
            tolerance=tolerance,
            device=device,
            on_progress=None if live else progress_printer(quiet),
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
