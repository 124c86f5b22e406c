"""The ``unity-eq`` command line: one verb per job.

Every verb turns a :class:`~unity_eq.errors.UnityEqError` into one line on stderr and a non-zero exit code;
only a bug in unity-eq itself shows a traceback. Progress goes to stderr, results to stdout.

The package, one module per command group:

==========  =================================================================================================
module      what it holds
==========  =================================================================================================
dispatch    the Typer app, its verbs in ``--help`` order, :func:`main` and :func:`entry` (errors, interrupts)
shared      the consoles, progress messages and displays, options several verbs parse
optimize    ``optimize`` and its plan summary
run         ``run`` (local or MPI backend) and ``check``
profile     ``profile``
explain     ``explain`` (text, JSON, or a picture)
rules       ``verify`` and ``generate-rules``: the only modules that call the verifier
==========  =================================================================================================

``python -m unity_eq.cli`` runs it as the ``unity-eq`` console script does (``unity_eq.cli:entry``).

This package's own module loads only the standard library: :func:`entry` installs its signal handlers before
the app and its dependencies (typer, numpy, onnx, onnxruntime: a second or more) are imported, so a signal in
that window (``mpiexec`` forwards Ctrl-C to ranks that are still starting) ends the command with one line and
128 + the signal's number, not an import's traceback. ``app`` and ``main`` are loaded on first use.
"""

from __future__ import annotations

import importlib
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from unity_eq.launcher import asks_mpi_backend, finalize_pmi, pmi_fd, quiet_rank

__all__ = ["app", "entry", "main"]

if TYPE_CHECKING:
    from unity_eq.cli.dispatch import app, main

_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


def entry() -> int:
    """The console script: the app's own entry (:func:`unity_eq.cli.dispatch.entry`), loaded under handlers
    that turn SIGINT or SIGTERM during the imports into one ``interrupted`` line and exit 128 + its number."""
    caught: list[int] = []

    def starting(signum: int, _frame: FrameType | None) -> None:
        if not caught:
            caught.append(signum)
            raise KeyboardInterrupt

    for signum in _INTERRUPTS:
        signal.signal(signum, starting)
    try:
        dispatch = importlib.import_module("unity_eq.cli.dispatch")
        importlib.import_module("unity_eq.files").install_signal_handlers()
    except KeyboardInterrupt:
        if not caught:
            raise
        return interrupted_while_starting(caught[0], sys.argv[1:])
    code: int = dispatch.entry()
    return code


def interrupted_while_starting(signum: int, argv: list[str]) -> int:
    """The command was interrupted before it began: say so (under the MPI backend, rank 0 only: every rank got
    the signal) and leave with 128 + ``signum``. Under MPICH, PMI's finalize goes first, or the proxy would
    SIGKILL the other ranks and ``mpiexec`` print its "BAD TERMINATION" banner (docs/runtime.md)."""
    for other in _INTERRUPTS:
        signal.signal(other, signal.SIG_IGN)  # a second Ctrl-C while leaving
    if not (asks_mpi_backend(argv) and quiet_rank()):
        verb = next((a for a in argv if not a.startswith("-")), "")
        name = signal.Signals(signum).name
        sys.stderr.write(f"interrupted by {name}: unity-eq {verb} (at: starting); nothing was written\n")
        sys.stderr.flush()
    fd = pmi_fd()
    if fd is not None:
        finalize_pmi(fd)
    return 128 + signum


def __getattr__(name: str) -> Any:
    if name in ("app", "main"):
        return getattr(importlib.import_module("unity_eq.cli.dispatch"), name)
    raise AttributeError(f"module 'unity_eq.cli' has no attribute {name!r}")
