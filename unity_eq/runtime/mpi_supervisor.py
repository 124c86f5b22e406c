"""The MPI backend's process plumbing: loading mpi4py, and the supervisor process forked before MPI starts.

Separate from the status rounds and the communicator because it works below MPI: it runs before MPI is
initialized (the fork) and after a rank died (the parent reports it), and it holds the process-wide state
(:data:`_SUPERVISED`) that the other MPI modules only query through :func:`orphaned`,
:func:`tell_supervisor` and :func:`claim_job_report`. See :mod:`unity_eq.runtime.mpi` for the whole design.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from unity_eq.errors import RuntimeBackendError
from unity_eq.files import owner_tag, sweep_stale
from unity_eq.launcher import finalize_pmi, launcher_rank, pmi_fd

__all__ = [
    "REPORT_PREFIX",
    "claim_job_report",
    "declare_status",
    "import_mpi",
    "orphaned",
    "supervise",
    "supervised",
    "tell_supervisor",
]


def import_mpi(finalize_at_exit: bool = False) -> tuple[Any, bool]:
    """mpi4py's MPI module, and whether this call initialized MPI (then this module also finalizes it,
    unless ``finalize_at_exit`` leaves that to mpi4py's exit hook)."""
    try:
        import mpi4py
    except ImportError:
        raise RuntimeBackendError(
            "`--backend mpi` needs mpi4py: `pip install 'unity-eq[mpi]'` brings mpi4py and MPICH from PyPI, "
            "or `pip install mpi4py` against your system MPI (see docs/runtime.md)."
        ) from None
    ours = "mpi4py.MPI" not in sys.modules
    if ours and not finalize_at_exit:
        mpi4py.rc.finalize = False  # finalized explicitly on success; after a failure requests may be pending
        mpi4py.rc.thread_level = "funneled"  # only the main thread calls MPI (onnxruntime has its own threads)
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise RuntimeBackendError(
            f"mpi4py cannot load an MPI library ({exc}). Install one: `pip install mpich`, or a system MPI "
            "and mpi4py built against it (see docs/runtime.md)."
        ) from None
    return MPI, ours


_SUPERVISED = {"parent": 0, "fd": -1, "launcher": 0}


def declare_status(code: int) -> None:
    """The rank's command is over and the process exits with ``code``: its supervisor exits with it even if a
    late signal (mpiexec forwards Ctrl-C to every rank) kills the rank while the interpreter tears down, when
    the default handlers are back (the rank died -2 after printing its results, and mpiexec exited 130)."""
    tell_supervisor(f"D{code};")


def tell_supervisor(text: str) -> None:
    fd = _SUPERVISED["fd"]
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.write(fd, text.encode())


def _set_parent_death_signal() -> None:
    """Linux: get SIGTERM when the supervisor dies (``mpiexec`` or a user killed it), instead of lingering.
    The rank's watchdog (:func:`_watch_supervisor`) says why before the process ends."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


REPORT_PREFIX = "unity-eq-mpi-"  # one folder per job and host: whoever makes it prints why the job ended


def _claim_report(launcher: int) -> bool:
    """Whether this process is the first of its job (on this host) to explain the job's end: ``mkdir`` is
    atomic. The folder is named after mpiexec's process, so the next job sweeps it once that is gone."""
    try:
        (Path(tempfile.gettempdir()) / f"{REPORT_PREFIX}{owner_tag(launcher)}report").mkdir()
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def claim_job_report() -> None:
    """Called by the rank that prints the job's error: a rank killed afterwards by mpiexec stays silent."""
    if _SUPERVISED["launcher"]:
        _claim_report(_SUPERVISED["launcher"])


def _watch_supervisor(supervisor: int, launcher: int) -> None:
    """In the rank: when the process mpiexec started for it dies (killed from outside, or by mpiexec's clean-up
    after another rank was), print one ``error:`` line for the whole job and exit. A thread, so a rank busy in
    native code still answers; SIGTERM (the parent-death signal) unwinds Python meanwhile."""
    import threading

    def report_and_exit() -> None:
        if _claim_report(launcher):
            rank = launcher_rank()
            with contextlib.suppress(OSError):
                os.write(
                    2,
                    f"error: the MPI job stopped: the process mpiexec started for rank {rank} (pid {supervisor}) "
                    "was killed from outside unity-eq\n".encode(),
                )
        os._exit(1)

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(0.1)
        report_and_exit()

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        if os.getppid() != supervisor:  # the parent-death signal
            report_and_exit()
        if callable(previous):  # a SIGTERM the supervisor forwarded: as before
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=watch, name="unity-eq-supervisor-watch", daemon=True).start()


def supervise() -> None:
    """Fork before MPI starts. The child is the rank and returns; the parent waits and never returns.

    The parent reports a child that died without saying so through the pipe (a signal, ``os._exit``, a crash
    in native code); a child that exits on purpose (``sys.exit``, the end of the CLI, or a silent rank's end
    in :func:`~unity_eq.runtime.mpi_status.fail_together`) writes ``X`` first. Signals sent to the
    parent (``mpiexec`` forwarding Ctrl-C, cleanup) go to the child.
    """
    if (
        os.environ.get("UNITY_EQ_MPI_SUPERVISOR", "1") == "0"
        or not hasattr(os, "fork")
        or "mpi4py.MPI" in sys.modules
        or _SUPERVISED["parent"]
    ):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    launcher = os.getppid()  # mpiexec's process on this host (hydra_pmi_proxy for MPICH)
    sweep_stale(Path(tempfile.gettempdir()), REPORT_PREFIX)
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _set_parent_death_signal()
        if os.getppid() != parent:  # the parent died before the death signal was set
            os._exit(1)
        _watch_supervisor(parent, launcher)
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # signals reach the rank once, through the parent, even when sent to a group
        _SUPERVISED.update(parent=parent, fd=write_fd, launcher=launcher)
        atexit.register(tell_supervisor, "X")
        return
    os.close(write_fd)
    forwarded: list[int] = []
    ended: list[bool] = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        if signum in _INTERRUPTS and len(forwarded) == 1:
            signal.setitimer(signal.ITIMER_REAL, INTERRUPT_GRACE_S)

    def end_rank(_signum: int, _frame: Any) -> None:
        """The rank did not stop: it is blocked in a collective (``MPI_Comm_split`` waits for ranks that have
        already left) or inside one long native call, where Python never sees the signal."""
        ended.append(True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        with contextlib.suppress(ValueError):  # not the main thread: signals stay with the default handlers
            signal.signal(signum, forward)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGALRM, end_rank)
    _, status = os.waitpid(pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    said = b""
    while chunk := os.read(read_fd, 4096):
        said += chunk
    code = os.waitstatus_to_exitcode(status)
    interrupt = next((s for s in forwarded if s in _INTERRUPTS), 0)
    if interrupt:
        declared = re.findall(r"D(\d+);", said.decode(errors="replace"))
        if declared:  # the command was over; a late signal may have killed the rank in the interpreter's teardown
            _leave_interrupted(int(declared[-1]), interrupt, said_it=True)
        stopped = 0 <= code < 128 and not ended  # finished, or failed on its own, before the signal took effect
        _leave_interrupted(code if stopped else 128 + interrupt, interrupt, said_it=code >= 0 and not ended)
    if not forwarded and (code < 0 or not said.endswith(b"X")):
        text = said.decode(errors="replace")
        rank = text[1:].split(";", 1)[0] if text.startswith("R") else launcher_rank()
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory?)" if -code == signal.SIGKILL else ""
            cause = f"killed by signal {name}{hint}"
        else:
            cause = f"exited with code {code} without reporting an error"
        _claim_report(launcher)  # the other ranks' watchdogs stay silent: this line says why the job ended
        sys.stderr.write(f"error: rank {rank} died: {cause}; the other ranks are stopped\n")
        sys.stderr.flush()
        os._exit(1)
    os._exit(code if code >= 0 else 128 - code)


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
INTERRUPT_GRACE_S = 5.0  # how long an interrupted rank may take to stop before its supervisor ends it


def _leave_interrupted(code: int, signum: int, said_it: bool) -> NoReturn:
    """The supervisor of an interrupted rank, once the rank is gone: exit with ``code`` (128 + the signal's
    number, unless the rank's command was over) without making ``mpiexec`` take the job for a crash.

    MPICH's proxy (``hydra_pmi_proxy``) SIGKILLs every other rank as soon as one rank's PMI socket (named by
    ``PMI_FD``, inherited by this process and the rank) closes before PMI's ``finalize`` was sent. MPICH sends
    it only from a C exit hook, after ``MPI_Finalize``; an interrupted rank cannot end MPI (requests may be
    pending, and ``MPI_Finalize`` may wait for ranks that never come). The killed ranks then made ``mpiexec``
    print its "BAD TERMINATION" banner and exit 9. So this process sends PMI's finalize for the rank: one line
    of PMI-1's wire protocol, which the proxy reads whatever version the library spoke (it detects the version
    of every command), then waits for the answer, after which the proxy closes the socket on its side. When
    the rank had sent it already, the proxy has closed the socket and the write fails, harmlessly. Every rank
    then exits with the same code, which ``mpiexec`` returns (it ORs its ranks' wait statuses). Other launchers
    (no ``PMI_FD``) are left as they were. Rank 0 prints the job's one ``interrupted`` line (the CLI does);
    if it had to be ended before it could, this process does.
    """
    if not said_it and launcher_rank() == "0":
        verb = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
        with contextlib.suppress(OSError):
            os.write(
                2,
                f"interrupted by {signal.Signals(signum).name}: unity-eq {verb} (rank 0 was ended: it had not "
                f"stopped within {INTERRUPT_GRACE_S:g} s)\n".encode(),
            )
    fd = pmi_fd()
    if fd is not None:
        finalize_pmi(fd)
    os._exit(code)


def supervised() -> bool:
    """Whether this process is a rank forked by :func:`supervise` (which ends it if it hangs after an
    interrupt, and keeps the status it declared)."""
    return bool(_SUPERVISED["parent"])


def orphaned() -> bool:
    return bool(_SUPERVISED["parent"]) and os.getppid() != _SUPERVISED["parent"]
