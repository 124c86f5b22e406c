"""``unity-eq train`` (a plan's ranks under torchrun) and ``check --training`` (ranks started here, compared with
one-device training). Both import torch only when they run (unity_eq.train)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from unity_eq.cli.shared import RECOMPUTE_OPTION, SHARED_OPTION, ZERO_AXIS_OPTION, ZERO_OPTION, err, out, read_npz
from unity_eq.errors import OptionError

__all__ = ["print_training_check", "train"]


def train(
    plan_dir: Path = typer.Argument(..., help="A plan directory written by `unity-eq optimize` (SPMD or pipeline)."),
    steps: int = typer.Option(10, "--steps", help="Optimizer steps to run."),
    inputs: Path = typer.Option(
        None, "--inputs", "-i", help=".npz batch, one array per model input (default: random)."
    ),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd or adamw."),
    lr: float = typer.Option(1e-2, "--lr", help="Learning rate."),
    loss: str = typer.Option(None, "--loss", help="sum or mean of the first output (default: it is a scalar loss)."),
    load: Path = typer.Option(None, "--load", help="Start from this checkpoint of the whole model."),
    save: Path = typer.Option(None, "--save", help="Write the whole model's weights here at the end."),
    model: Path = typer.Option(None, "--model", help="The source ONNX model (default: plan.json's model.source)."),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random batch used without --inputs."),
    zero: int = ZERO_OPTION,
    zero_axis: str = ZERO_AXIS_OPTION,
    recompute: bool = RECOMPUTE_OPTION,
    shared: list[str] = SHARED_OPTION,
) -> None:
    """Train with a plan, one process per rank: `torchrun --nproc_per_node N -m unity_eq train PLAN/`."""
    import os

    import torch
    import torch.distributed as dist

    from unity_eq.runtime.draws import random_inputs
    from unity_eq.runtime.plandir import check_inputs, refuse_plan_output
    from unity_eq.train.check import make_optimizer
    from unity_eq.train.session import resolve_device

    if steps < 1:
        raise OptionError(f"`--steps` must be at least 1, got {steps}.")
    plan, world, predicted = _read_plan(plan_dir)  # before the process group: a wrong world is one line, not a hang
    if save is not None:  # before any step: never over a file of the plan, its model or the model's data
        refuse_plan_output(save, plan_dir, "`--save`")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise OptionError(
            f"`train` runs one process per rank under torchrun: `torchrun --nproc_per_node {world} -m unity_eq train "
            f"{plan_dir}`. (`unity-eq check MODEL {plan_dir} --training` starts the ranks itself.)"
        )
    if int(os.environ["WORLD_SIZE"]) != world:
        raise OptionError(
            f"world size: torchrun started {os.environ['WORLD_SIZE']} processes, the plan in {plan_dir} has {world} "
            f"ranks. Run `torchrun --nproc_per_node {world} -m unity_eq train {plan_dir}`."
        )
    device, note = resolve_device(device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if note and os.environ.get("RANK") == "0":
        err.print(f"[yellow]note: {escape(note)}[/yellow]")
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    try:
        from unity_eq.train.load import load_rank

        rank = dist.get_rank()
        feeds = check_inputs(plan, read_npz(inputs) if inputs is not None else random_inputs(plan.input_specs, seed))
        trainer = load_rank(
            plan_dir, model, device=device, zero=zero, zero_axis=zero_axis, recompute=recompute, loss=loss,
            shared=shared,
        )  # fmt: skip
        if load is not None:
            trainer.load(load)
        opt = trainer.optimizer(lambda params: make_optimizer(optimizer, params, lr))
        batch = trainer.inputs(feeds)
        times: list[float] = []
        for k in range(steps):
            start = time.perf_counter()
            opt.zero_grad()
            value = trainer.forward_backward(batch, loss)
            opt.step()
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            times.append(seconds)
            if rank == 0:
                out.print(
                    f"step {k + 1}/{steps}: loss {float(value.detach()):.6g}, {seconds * 1e3:.1f} ms", highlight=False
                )
        if rank == 0:
            _say_collectives(trainer.ledger.as_rows(), steps)
            _say_predicted(predicted, times, trainer.device.type == "cuda")
        if save is not None:
            written = trainer.save(save)
            if written is not None:
                out.print(f"wrote the whole model's parameters to {escape(str(written))}")
    finally:
        dist.destroy_process_group()


def _read_plan(plan_dir: Path) -> tuple[Any, int, tuple[float | None, str]]:
    """The plan's inputs (a PlanDir: a pipeline's ``whole``), its number of ranks, and its predicted step
    (seconds, machine)."""
    from unity_eq.runtime.pipeline import is_pipeline_dir, load_pipeline_dir
    from unity_eq.runtime.plandir import load_plan_dir
    from unity_eq.train.pipeline import refuse_unbuilt
    from unity_eq.train.session import read_training_plan

    if is_pipeline_dir(plan_dir):
        pipeline = load_pipeline_dir(plan_dir)
        refuse_unbuilt(pipeline)
        return pipeline.whole, pipeline.world_size, (pipeline.record.chosen.step_s, pipeline.record.machine)
    record = read_training_plan(plan_dir)
    step = record.training_search.step_s if record.training_search is not None else None
    if step is None and record.cost is not None:
        step = record.cost.total_s
    machine = record.machine.name if record.machine is not None else "its machine"
    return load_plan_dir(plan_dir, check_files=False), len(record.mesh.ranks), (step, machine)


def _say_predicted(prediction: tuple[float | None, str], times: list[float], on_gpu: bool) -> None:
    """The measured step beside plan.json's prediction, the first step (start-up: CUDA contexts, NCCL's
    rings, allocator warm-up) left out of the median when there are more. On the CPU a sanity figure only:
    the plan priced its machine's GPUs."""
    predicted, machine = prediction
    steady = times[1:] if len(times) > 1 else times
    measured = sorted(steady)[len(steady) // 2]
    said = f"{predicted * 1e3:.3g} ms on {machine}" if predicted is not None else "not recorded"
    ratio = f", measured / predicted {measured / predicted:.2f}" if predicted and on_gpu else ""
    remark = "" if on_gpu else " (a CPU run is a sanity figure, not a test of the prediction)"
    err.print(
        f"[dim]… step time: measured {measured * 1e3:.1f} ms (median of steps 2-{len(times)}); plan.json predicts "
        f"{escape(said)}{ratio}{remark}[/dim]"
        if len(times) > 1
        else f"[dim]… step time: measured {measured * 1e3:.1f} ms (one step); plan.json predicts {escape(said)}"
        f"{ratio}{remark}[/dim]"
    )


def _say_collectives(rows: list[Any], steps: int) -> None:
    for kind, axis, phase, count, nbytes in rows:
        err.print(
            f"[dim]… {kind} on axis {axis} ({phase}): {count // steps} per step, {nbytes // steps} bytes per rank[/dim]"
        )


def print_training_check(
    model: Path,
    plan_dir: Path,
    inputs: Path | None,
    *,
    steps: int,
    optimizer: str,
    lr: float,
    loss: str | None,
    tolerance: float,
    seed: int,
    quiet: bool,
    zero: int = 0,
    zero_axis: str | None = None,
    recompute: bool = False,
    shared: Sequence[str] = (),
) -> None:
    """``check --training``: print every comparison, then raise CheckFailed on the first mismatch."""
    from unity_eq.train.check import assert_training_check, check_training

    if not tolerance >= 0:
        raise OptionError(f"`--tolerance`: expected a relative error of 0 or more, got {tolerance:g}.")
    feeds = read_npz(inputs) if inputs is not None else None
    if not quiet:
        err.print(f"[dim]… training {plan_dir} for {steps} step(s) on its ranks and {model} on one device[/dim]")
    result = check_training(
        model, plan_dir, feeds, steps=steps, optimizer=optimizer, lr=lr, loss=loss, tolerance=tolerance, seed=seed,
        zero=zero, zero_axis=zero_axis, recompute=recompute, shared=shared,
    )  # fmt: skip
    for ok, text in result.lines:
        mark = "[green]ok[/green]" if ok else "[red]MISMATCH[/red]"
        out.print(f"{mark} {escape(text)}")
    for note in result.notes:
        err.print(f"note: {escape(note)}")
    assert_training_check(result)
