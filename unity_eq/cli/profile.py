"""``unity-eq profile``: measure the model's distinct ops on this machine and write the table ``optimize
--profile`` reads.

Separate from ``optimize``: it runs on the target device, apart from the search, and prints its own table.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from unity_eq.cli.shared import err, input_shapes, out, progress_printer
from unity_eq.errors import OptionError
from unity_eq.files import check_output_file

__all__ = ["profile_cmd"]


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
    backward: bool = typer.Option(
        True, "--backward/--no-backward", help="Also time each op forward + backward in PyTorch (training)."
    ),
    framework: str = typer.Option(
        "auto",
        "--framework",
        help="Time the forward pass in onnxruntime or torch; auto: torch when only torch can use the CUDA device.",
    ),
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
        input_shapes=input_shapes(input_shape),
        device=device,
        threads=threads,
        warmup=warmup,
        repeats=repeats,
        min_time=min_time,
        progress=progress_printer(quiet),
        backward=backward,
        framework=framework,
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
    if "backward_median_relative_error" in summary:
        grid.add_row(
            "backward (torch)",
            f"{summary['backward_entries']} ops on {meta['backward']['device']}; roofline median relative error "
            f"{summary['backward_median_relative_error']:.2f}",
        )
    grid.add_row("time", f"{meta['seconds']:.1f} s")
    grid.add_row("written to", str(target))
    out.print(grid)
