"""The MPI backend's status rounds: how ranks tell each other they are ok or failed, and agree on one error.

Separate from the communicator and from running a plan: this is the failure protocol of the backend (the
"Status rounds" and "Deadlines" of :mod:`unity_eq.runtime.mpi`): the status messages on a private
communicator, the poller every wait goes through, and the rules that turn the ranks' statuses into the one
error the lowest rank raises while the others end quietly.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from unity_eq.errors import RuntimeBackendError, UnityEqError
from unity_eq.files import received_signal, stop_requested
from unity_eq.runtime.mpi_supervisor import claim_job_report, orphaned, tell_supervisor

__all__ = [
    "FINAL",
    "SETUP",
    "Control",
    "MPIRunError",
    "PeerFailed",
    "Poller",
    "RankStatus",
    "WaitTimeout",
    "agree",
    "conclude",
    "fail_together",
    "failure",
    "interrupted",
    "outcome",
    "status_round",
]

STATUS_TAG = 7301
RELEASE_TAG = 7302
EXIT_GRACE_S = 0.25  # the reporter exits this long after the silent ranks were released
SETUP, FINAL = 0, 1
LINGER_S = 10.0  # how long a silent rank waits for the reporter to print a failure


class MPIRunError(RuntimeBackendError):
    """A failure of an MPI run, as agreed by the ranks; ``exit_code`` is the failing rank's."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class PeerFailed(RuntimeBackendError):
    """Another rank reported a failure while this one waited for it."""


class WaitTimeout(RuntimeBackendError):
    """A collective or message did not complete before the deadline."""


@dataclass
class RankStatus:
    """What a rank tells the others at the end of a round: ok, or the error that stopped it."""

    rank: int
    round: int
    ok: bool
    message: str = ""
    primary: bool = True  # its own failure, not a reaction to another rank's
    exit_code: int = 0
    info: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------
# Status messages and polling


class Control:
    """Status messages between ranks, on a private duplicate of ``COMM_WORLD``."""

    def __init__(self, mpi: Any, world: Any) -> None:
        self.mpi = mpi
        self.comm = world.Dup()
        self.rank = world.rank
        self.size = world.size
        self.received: dict[tuple[int, int], RankStatus] = {}
        self.sends: list[Any] = []

    def announce(self, status: RankStatus) -> None:
        for dest in range(self.size):
            if dest != self.rank:
                self.sends.append(self.comm.isend(status, dest=dest, tag=STATUS_TAG))
        self.received[(status.round, self.rank)] = status

    def drain(self) -> None:
        probe = self.mpi.Status()
        while self.comm.iprobe(source=self.mpi.ANY_SOURCE, tag=STATUS_TAG, status=probe):
            status = self.comm.recv(source=probe.Get_source(), tag=STATUS_TAG)
            self.received[(status.round, status.rank)] = status

    def failure(self, round_: int) -> RankStatus | None:
        failed = [s for (r, _), s in self.received.items() if r == round_ and not s.ok and s.rank != self.rank]
        return min(failed, key=lambda s: (not s.primary, s.rank)) if failed else None

    def round(self, round_: int) -> dict[int, RankStatus]:
        return {rank: s for (r, rank), s in self.received.items() if r == round_}


class Poller:
    """Waits on non-blocking MPI operations against a deadline, watching for other ranks' failures."""

    def __init__(self, control: Control, timeout: float, spins: int = 50) -> None:
        self.control = control
        self.timeout = timeout
        self.spins = spins  # polls before sleeping; 0 when ranks outnumber cores (a spinning rank steals them)

    def wait(self, done: Callable[[], bool], what: str) -> None:
        if done():
            return
        deadline = time.monotonic() + self.timeout
        spins = 0
        while not done():
            self.control.drain()
            failed = self.control.failure(FINAL)
            if failed is not None:
                raise PeerFailed(f"stopped in {what} because rank {failed.rank} failed")
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{what} did not complete within {self.timeout:g} s")
            if orphaned():
                os._exit(1)
            if stop_requested():  # the interrupt was turned into another error (onnxruntime does) and handled
                interrupted(self.control.rank)
            spins += 1
            if spins > self.spins:
                time.sleep(min(1e-3, 1e-5 * (spins - self.spins)))


# ----------------------------------------------------------------------------------------------------------
# Agreeing on the outcome of a round


def failure(rank: int, round_: int, exc: BaseException) -> RankStatus:
    if isinstance(exc, PeerFailed | WaitTimeout):  # a symptom: another rank failed or did not come
        return RankStatus(rank, round_, False, str(exc), primary=False, exit_code=2)
    if isinstance(exc, UnityEqError):
        return RankStatus(rank, round_, False, str(exc), exit_code=exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return RankStatus(rank, round_, False, "interrupted", exit_code=130)
    return RankStatus(rank, round_, False, _describe(exc), exit_code=2)


def _describe(exc: BaseException) -> str:
    """One line for an unexpected exception (onnxruntime's, a bug's): its type and first line."""
    lines = str(exc).strip().splitlines()
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "onnxruntime: ", lines[0] if lines else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def agree(control: Control, mine: RankStatus, timeout: float) -> tuple[dict[int, RankStatus], list[int]]:
    """Send this rank's status to all, collect everyone's for the round (until the deadline)."""
    control.announce(mine)
    deadline = time.monotonic() + timeout
    while True:
        control.drain()
        statuses = control.round(mine.round)
        if len(statuses) == control.size or time.monotonic() > deadline:
            break
        if orphaned():
            os._exit(1)
        if stop_requested():  # a rank whose interrupt became another error: it stops with the others
            interrupted(control.rank)
        time.sleep(1e-3)
    missing = sorted(set(range(control.size)) - set(statuses))
    return statuses, missing


def outcome(statuses: Mapping[int, RankStatus], missing: Sequence[int], timeout: float) -> MPIRunError | None:
    """The one error every rank reports for a round, or None when all ranks are ok.

    A rank's own failure (primary) comes first; ranks that did not answer are named; failures that only
    react to another rank (stopped because rank r failed, a wait that timed out) are shown only when nothing
    else explains the failure.
    """
    failed = sorted((s for s in statuses.values() if not s.ok), key=lambda s: (not s.primary, s.rank))
    if not failed and not missing:
        return None
    parts = []
    primaries = [s for s in failed if s.primary]
    if primaries:
        first = primaries[0]
        same = not missing and all(s.message == first.message for s in statuses.values())
        parts.append(first.message if same else f"rank {first.rank}: {first.message}")
        others = [s.rank for s in primaries[1:] if s.message != first.message]
        if others:
            parts[-1] += f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)"
    if missing:
        plural = "s" if len(missing) > 1 else ""
        parts.append(
            f"rank{plural} {', '.join(map(str, missing))} did not answer within {timeout:g} s "
            "(hung, or stopped without an error)"
        )
    if not primaries and failed:
        parts.append(f"rank {failed[0].rank}: {failed[0].message}")
    code = primaries[0].exit_code if primaries else 2
    return MPIRunError("; ".join(parts), code or 2)


def _release(control: Control, finalize: bool) -> None:
    """The reporter, at exit (after the CLI printed the error): let the silent ranks go, then end MPI."""
    sends = [control.comm.isend(None, dest=d, tag=RELEASE_TAG) for d in range(control.size) if d != control.rank]
    deadline = time.monotonic() + LINGER_S
    while not control.mpi.Request.Testall(sends) and time.monotonic() < deadline:
        time.sleep(1e-3)
    if finalize:
        control.mpi.Finalize()
        time.sleep(EXIT_GRACE_S)  # exit last: mpiexec kills (and reports) ranks still running after a failure


def _await_release(control: Control, reporter: int, finalize: bool, exit_code: int) -> None:
    """A silent rank: wait until the reporter has printed the error, then end quietly.

    Exiting first would let ``mpiexec`` kill the reporter before it prints. When every rank answered, all end
    MPI together and the silent ranks exit 0, before the reporter exits with the failure's code: ``mpiexec``
    then has no process left to kill (a killed process makes it print a banner) and returns that code. When
    a rank did not answer (hung), the others exit with the failure's code without ending MPI.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline and not orphaned():
        if control.comm.iprobe(source=reporter, tag=RELEASE_TAG):
            control.comm.recv(source=reporter, tag=RELEASE_TAG)
            if finalize:
                control.mpi.Finalize()
                # A normal exit: after MPI_Finalize, os._exit makes MPICH's mpiexec see an abnormal end.
                raise SystemExit(0)  # the reporter exits with the failure's code, last
            break
        time.sleep(1e-3)
    tell_supervisor("X")
    os._exit(exit_code)


def fail_together(control: Control, error: MPIRunError, reporter: int, everyone: bool) -> NoReturn:
    """Raise ``error`` on the reporter; end the other ranks quietly once it has been printed."""
    if reporter == control.rank:
        atexit.register(_release, control, everyone)
        claim_job_report()  # this rank's line says why the job ends: the watchdogs stay silent
        raise error
    _await_release(control, reporter, everyone, error.exit_code)
    raise AssertionError("unreachable")  # pragma: no cover


def interrupted(rank: int) -> None:
    """Ctrl-C (mpiexec forwards it to every rank): no status round, every rank stops now; rank 0 re-raises
    (the CLI prints ``interrupted``), the others leave quietly."""
    if rank == 0:
        claim_job_report()
        raise KeyboardInterrupt
    sys.stdout.flush()
    sys.stderr.flush()
    tell_supervisor("X")
    os._exit(128 + (received_signal() or signal.SIGINT))


def conclude(control: Control, statuses: Mapping[int, RankStatus], missing: Sequence[int], timeout: float) -> None:
    error = outcome(statuses, missing, timeout)
    if error is not None:
        # The lowest rank that answered reports (this rank always has its own status).
        fail_together(control, error, min(statuses), not missing)


def status_round(
    control: Control, round_: int, timeout: float, work: Callable[[], dict[str, Any]]
) -> dict[int, RankStatus]:
    """Run this rank's ``work`` for round ``round_`` (what it returns is the status's ``info``), then agree on the
    round with every rank: each rank's status, once all answered or the deadline passed; a failure anywhere
    (``work`` raising here included) ends every rank with one error (:func:`conclude`). Ctrl-C holds no round
    (:func:`interrupted`)."""
    rank = control.rank
    try:
        status = RankStatus(rank, round_, True, info=work())
    except KeyboardInterrupt:
        interrupted(rank)
    except BaseException as exc:  # reported to every rank, raised on one
        status = failure(rank, round_, exc)
    statuses, missing = agree(control, status, timeout)
    conclude(control, statuses, missing, timeout)
    return statuses
