"""The ``unity-eq`` app: its verbs, and running it (:func:`main`, the console script :func:`entry`).

Every verb turns a :class:`~unity_eq.errors.UnityEqError` into one line on stderr and a non-zero exit code;
only a bug in unity-eq itself shows a traceback; an interrupt ends it with one line. The verbs are defined in
one module per command group and registered on the app here, in the order ``--help`` lists them.
"""

from __future__ import annotations

import os
import signal
import sys

import typer
from rich.markup import escape

from unity_eq.cli.explain import explain
from unity_eq.cli.optimize import optimize
from unity_eq.cli.profile import profile_cmd
from unity_eq.cli.rules import generate_rules, verify
from unity_eq.cli.run import check, run
from unity_eq.cli.shared import err, last_step, out
from unity_eq.cli.train import train
from unity_eq.errors import UnityEqError
from unity_eq.files import received_signal
from unity_eq.launcher import asks_mpi_backend, quiet_rank

__all__ = ["CLICK_ERROR", "app", "entry", "main"]

app = typer.Typer(
    name="unity-eq",
    help="Decide how to run an ONNX model across many devices, with e-graphs and rules proven by Z3.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


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


app.command()(optimize)
app.command()(run)
app.command()(check)
app.command()(train)
app.command("profile")(profile_cmd)
app.command()(verify)
app.command()(explain)
app.command("generate-rules")(generate_rules)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: run the app, turn our errors into one line and an exit code.

    SIGINT and SIGTERM unwind the command (temporary files and engine processes are removed on the way) and
    end it with one line saying what was interrupted, exit 128 + the signal's number."""
    from unity_eq.files import install_signal_handlers, received_signal

    install_signal_handlers()
    try:
        rv = app(args=argv, standalone_mode=False)
        signum = received_signal()
        # typer ≥ 0.25 turns an interrupt into exit code 130. An MPI rank other than 0 whose command ran to its
        # end keeps its status: the job's outcome is rank 0's, which prints the results or the interrupt
        if signum is not None and not _quiet_mpi_rank():
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
    except CLICK_ERROR as exc:  # usage errors: a mistyped option, a bad value, an unknown verb (exit 2)
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
    with the command's own exit status. Under MPI, only a rank below its supervisor (the default): the exit may
    end MPI, which waits for the other ranks, and a rank stuck there must still be ended, by its supervisor
    after an interrupt (without one, by mpiexec's SIGTERM or the parent-death signal). The rank tells its
    supervisor its status, which the supervisor keeps if a signal kills the rank during the interpreter's
    teardown, when the default handlers are back."""
    try:
        code = main()
    except KeyboardInterrupt:  # the signal came in the instant main returned
        signum = received_signal()
        _say_interrupted(sys.argv[1:], signum)
        code = 128 + (signum or signal.SIGINT)
    finally:
        if "unity_eq.runtime.mpi" not in sys.modules or _supervised_rank():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
    if code >= 128 and "unity_eq.runtime.mpi" not in sys.modules:
        # Interrupted: the command has cleaned up and said so, but a rank thread may still be inside an
        # onnxruntime call that no signal can stop, and tearing the interpreter down under it aborts the process
        # (std::terminate, exit -6, after our line). Leave at once with our status, after ending the worker
        # processes the interpreter's exit would have ended (multiprocessing's own exit hook is skipped too).
        import multiprocessing

        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        for child in children:
            child.join(timeout=2)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if "unity_eq.runtime.mpi" in sys.modules:
        from unity_eq.runtime.mpi_supervisor import declare_status

        declare_status(code)
    return code


def _quiet_mpi_rank() -> bool:
    """An MPI backend's rank other than 0: it leaves the job's messages to rank 0. Also before the backend is
    loaded (an interrupt while the ranks start), from the command line."""
    if "unity_eq.runtime.mpi" not in sys.modules and not asks_mpi_backend(sys.argv[1:]):
        return False
    return quiet_rank()


def _supervised_rank() -> bool:
    """An MPI rank forked by the supervisor (:func:`unity_eq.runtime.mpi_supervisor.supervise`)."""
    if "unity_eq.runtime.mpi" not in sys.modules:
        return False
    from unity_eq.runtime.mpi_supervisor import supervised

    return supervised()


def _say_interrupted(argv: list[str], signum: int | None) -> None:
    """``interrupted by SIGINT: unity-eq optimize (at: mesh x=4: saturating); temporary files removed``.

    Under the MPI backend only rank 0 says it: every rank is interrupted at once, and the job needs one line."""
    if _quiet_mpi_rank():
        return
    verb = next((a for a in argv if not a.startswith("-")), "")
    name = signal.Signals(signum).name if signum else "SIGINT"
    where = f" (at: {last_step[-1]})" if last_step else ""
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


CLICK_ERROR = _click_error_type()
