"""What every ``unity-eq`` command shares: the output consoles, progress messages and displays, and the
parsing of options that several verbs take (``--input-shape``, ``.npz`` inputs), and the training options that
``train`` and ``check --training`` both hand to unity_eq.train.load_rank, declared once.

Separate so that the command modules share these without importing the app (:mod:`unity_eq.cli.dispatch`,
which registers them). Progress goes to stderr (``err``), results to stdout (``out``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape

from unity_eq.errors import OptionError

__all__ = [
    "RECOMPUTE_OPTION",
    "SHARED_OPTION",
    "ZERO_AXIS_OPTION",
    "ZERO_OPTION",
    "err",
    "input_shapes",
    "last_step",
    "live_display",
    "out",
    "progress_printer",
    "read_npz",
    "remember_step",
]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


# load_rank's options, the same for `train` and `check --training` (docs/training.md)
ZERO_OPTION: Any = typer.Option(
    0, "--zero", help="When training: ZeRO level 1-3 over the data axis (0: none; docs/training.md)."
)
ZERO_AXIS_OPTION: Any = typer.Option(None, "--zero-axis", help="With --zero: the mesh axis (default: the only one).")
RECOMPUTE_OPTION: Any = typer.Option(
    False, "--recompute", help="When training: recompute the forward in the backward pass."
)
SHARED_OPTION: Any = typer.Option(
    [], "--shared", help="When training: a weight the source model shares, which looks merged by the exporter "
    "(repeatable)."
)  # fmt: skip


last_step: list[str] = []  # the latest progress message, to say where an interrupt stopped


def progress_printer(quiet: bool) -> Any:
    if quiet:
        return None

    def say(message: str) -> None:
        remember_step(message)
        err.print(f"[dim]… {escape(message)}[/dim]")

    return say


def remember_step(message: str) -> None:
    last_step[:] = [message]


def live_display(quiet: bool, transient: bool = False) -> Any:
    """A live display of the progress rows on stderr when it is a terminal and not ``-q``; else None (then
    progress, if any, is plain lines: a log or a pipe gets no redrawn display). ``transient``: it goes away
    when done (run and check print their results next)."""
    if quiet or not err.is_terminal:
        return None
    from unity_eq.progress import LiveTracker

    return LiveTracker(err, on_step=remember_step, transient=transient)


def input_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    from unity_eq.frontends.onnx_inputs import parse_input_shape

    shapes: dict[str, tuple[int, ...]] = {}
    for text in values:
        name, shape = parse_input_shape(text)
        if name in shapes and shapes[name] != shape:
            given = "x".join(map(str, shapes[name]))
            raise OptionError(f"`--input-shape`: input {name!r} given twice, as {given} and as {text!r}. Pass one.")
        shapes[name] = shape
    return shapes


def read_npz(path: Path) -> dict[str, np.ndarray]:
    from unity_eq.runtime import load_npz

    return load_npz(path)  # one loader for every verb: a .npy or a broken file is one clear error
