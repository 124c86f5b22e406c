"""What an MPI launcher tells a process before anything else is loaded: its rank, and PMI's socket.

Standard library only, so the console script can use it while it is still starting (``unity_eq.cli.entry``,
before typer, numpy or onnxruntime are imported) as well as the MPI supervisor (``runtime.mpi_supervisor``).
"""

from __future__ import annotations

import contextlib
import os
import select
import time

__all__ = ["asks_mpi_backend", "finalize_pmi", "launcher_rank", "pmi_fd", "quiet_rank"]

_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank() -> str:
    """This process's rank as its launcher (MPICH, Open MPI, MVAPICH, Slurm) set it; ``?`` outside one."""
    for name in _RANK_VARIABLES:
        if name in os.environ:
            return os.environ[name]
    return "?"


def quiet_rank() -> bool:
    """Whether this process is an MPI rank other than 0 (which leaves the job's messages to rank 0)."""
    rank = launcher_rank()
    return rank.isdigit() and rank != "0"


def asks_mpi_backend(argv: list[str]) -> bool:
    """Whether the command line asks for the MPI backend (``--backend mpi``): known before anything loads."""
    return any(
        a == "--backend=mpi" or (a == "--backend" and argv[i + 1 : i + 2] == ["mpi"]) for i, a in enumerate(argv)
    )


def pmi_fd() -> int | None:
    """The PMI socket MPICH's proxy (hydra) gave this process (``PMI_FD``); None under other launchers."""
    text = os.environ.get("PMI_FD", "")
    return int(text) if text.isdigit() else None


def finalize_pmi(fd: int) -> None:
    """PMI-1's ``cmd=finalize``, then the proxy's answer (``cmd=finalize_ack``), waited for at most 2 s.

    MPICH's proxy SIGKILLs every other rank (and ``mpiexec`` prints its "BAD TERMINATION" banner) when a rank's
    PMI socket closes before PMI's finalize was sent; a process leaving without ending MPI (interrupted) sends
    it this way. The proxy answers it also before PMI's init (a rank interrupted while Python was importing).
    When the rank had sent it already, the proxy has closed the socket and the write fails, harmlessly."""
    with contextlib.suppress(OSError):
        os.write(fd, b"cmd=finalize\n")
        deadline = time.monotonic() + 2.0
        said = b""
        while b"\n" not in said and (left := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 256)
            if not chunk:
                break
            said += chunk
