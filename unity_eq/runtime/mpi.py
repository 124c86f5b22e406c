"""The ``mpi`` backend: one process per rank under ``mpiexec``, collectives through MPI (mpi4py).

::

    mpiexec -n 4 unity-eq run plan/ --backend mpi --inputs in.npz --outputs out.npz

Every rank reads ``plan.json`` and loads only its own ``device_<rank>.onnx``; rank 0 returns (and the CLI
writes) the outputs. Collectives run on one MPI sub-communicator per rank group of the plan (made with
``MPI_Comm_split`` once, before the first segment), on raw bytes, so every dtype travels unchanged:

==================  ==============================================================================
collective          MPI
==================  ==============================================================================
all_gather          ``Iallgather`` of the pieces, concatenated along ``dim``
all_reduce          ``Iallgather`` of the pieces, then summed in group order (:func:`sum_pieces`)
reduce_scatter      ``Ialltoall`` of the chunks, then summed in group order
all_to_all          ``Ialltoall`` of the chunks, concatenated along ``concat_dim``
send / recv         ``isend`` / ``improbe`` on a private duplicate of ``COMM_WORLD``
==================  ==============================================================================

Sums are never ``MPI_SUM``: the pieces are gathered and added in group order, as the ``local`` backend
does, so both backends agree bit for bit (same thread count per rank, same reduction order).

Failures end every rank, with one line naming the rank and the cause, within the timeout:

* **Status rounds.** After setup (plan, world size, device, inputs, the rank's shard) and after the run,
  every rank sends its status (ok, or the error) to every other rank on a private communicator and
  collects theirs, polling against a deadline. A rank that fails sends its error at once; ranks waiting in
  a collective poll for such messages, so they stop within milliseconds instead of hanging. The lowest rank
  that knows the outcome raises the error (the CLI prints it); the others stay silent until it has been
  printed, then every rank ends MPI and exits, the reporter last with the failure's exit code. (Exiting
  early would let ``mpiexec`` kill the reporter before it prints, and a killed process makes ``mpiexec``
  print a banner of its own.)
* **Deadlines.** Every wait (collective, message, status round) is a non-blocking MPI request polled
  against ``timeout`` seconds; a rank that hangs is named by the others' status round.
* **Supervisor.** A rank that dies without a Python exception (killed by a signal, the OOM killer, a crash
  in native code, ``os._exit``) cannot report itself. So each process started by ``mpiexec`` forks before
  MPI starts: the child is the MPI rank, the parent only waits for it and, if it died, prints
  ``error: rank R died: killed by signal SIGKILL …`` and exits non-zero, which makes ``mpiexec`` stop the
  others. ``UNITY_EQ_MPI_SUPERVISOR=0`` turns this off (POSIX only).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from unity_eq.errors import OptionError, RuntimeBackendError, UnityEqError
from unity_eq.files import owner_tag, sweep_stale
from unity_eq.progress import Tracker
from unity_eq.runtime.checker import random_inputs
from unity_eq.runtime.collectives import split_chunks, sum_pieces
from unity_eq.runtime.devices import (
    DeviceChoice,
    available_cores,
    choose_device,
    describe_devices,
    device_notes,
    threads_per_rank,
)
from unity_eq.runtime.execute import COLLECTIVE_TIMEOUT_S, RankTimes, execute_rank
from unity_eq.runtime.plandir import PlanDir, check_inputs, check_rank_file, load_npz, load_plan_dir
from unity_eq.runtime.segments import build_rank_program

__all__ = ["MPICommunicator", "MPIRunError", "open_communicator", "run_plan_mpi"]

STATUS_TAG = 7301
RELEASE_TAG = 7302
EXIT_GRACE_S = 0.25  # the reporter exits this long after the silent ranks were released
SETUP, FINAL = 0, 1
LINGER_S = 10.0  # how long a silent rank waits for the reporter to print a failure

Note = Callable[[str], None]


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
# mpi4py, and the supervisor process


def _import_mpi(finalize_at_exit: bool = False) -> tuple[Any, bool]:
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


def _launcher_rank() -> str:
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return os.environ[name]
    return "?"


def _tell_supervisor(text: str) -> None:
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


def _claim_job_report() -> None:
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
            rank = _launcher_rank()
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


def _supervise() -> None:
    """Fork before MPI starts. The child is the rank and returns; the parent waits and never returns.

    The parent reports a child that died without saying so through the pipe (a signal, ``os._exit``, a crash
    in native code); a child that exits on purpose (``sys.exit``, the end of the CLI, or :func:`_await_release`)
    writes ``X`` first. Signals sent to the parent (``mpiexec`` forwarding Ctrl-C, cleanup) go to the child.
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
        atexit.register(_tell_supervisor, "X")
        return
    os.close(write_fd)
    forwarded: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        with contextlib.suppress(ValueError):  # not the main thread: signals stay with the default handlers
            signal.signal(signum, forward)
    _, status = os.waitpid(pid, 0)
    said = b""
    while chunk := os.read(read_fd, 4096):
        said += chunk
    code = os.waitstatus_to_exitcode(status)
    if not forwarded and (code < 0 or not said.endswith(b"X")):
        text = said.decode(errors="replace")
        rank = text[1:].split(";", 1)[0] if text.startswith("R") else _launcher_rank()
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


def _orphaned() -> bool:
    return bool(_SUPERVISED["parent"]) and os.getppid() != _SUPERVISED["parent"]


# ----------------------------------------------------------------------------------------------------------
# Status messages and polling


class _Control:
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


class _Poller:
    """Waits on non-blocking MPI operations against a deadline, watching for other ranks' failures."""

    def __init__(self, control: _Control, timeout: float, spins: int = 50) -> None:
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
            if _orphaned():
                os._exit(1)
            spins += 1
            if spins > self.spins:
                time.sleep(min(1e-3, 1e-5 * (spins - self.spins)))


# ----------------------------------------------------------------------------------------------------------
# The communicator


def _bytes_of(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class MPICommunicator:
    """The :class:`~unity_eq.runtime.Communicator` of one MPI rank. ``group``\\ s are ``COMM_WORLD`` ranks.

    :meth:`prepare` (collective over ``COMM_WORLD``) makes the sub-communicators of a list of groupings up
    front; a group met later gets one from ``MPI_Comm_create_group`` (collective over that group only).
    """

    def __init__(self, mpi: Any, world: Any, poller: _Poller) -> None:
        self.mpi = mpi
        self.world = world
        self.rank = world.rank
        self.poller = poller
        self.p2p = world.Dup()
        self._groups: dict[tuple[int, ...], Any] = {}
        self.calls = 0

    def prepare(self, groupings: Iterable[Sequence[Sequence[int]]]) -> None:
        """Split ``COMM_WORLD`` once per distinct grouping (every rank must call this with the same list)."""
        seen: set[tuple[tuple[int, ...], ...]] = set()
        for grouping in groupings:
            key = tuple(tuple(int(r) for r in g) for g in grouping)
            if key in seen:
                continue
            seen.add(key)
            mine = next((g for g in key if self.rank in g), None)
            color = key.index(mine) if mine is not None else self.mpi.UNDEFINED
            sub = self.world.Split(color, mine.index(self.rank) if mine is not None else 0)
            if mine is not None:
                self._groups.setdefault(mine, sub)

    def _comm(self, group: Sequence[int]) -> Any:
        key = tuple(int(r) for r in group)
        if key not in self._groups:
            if self.rank not in key:
                raise RuntimeBackendError(f"rank {self.rank}: not a member of collective group {list(key)}")
            self._groups[key] = self.world.Create_group(self.world.group.Incl(list(key)))
        return self._groups[key]

    def _wait(self, request: Any, what: str) -> None:
        self.poller.wait(request.Test, what)

    def _gather(self, array: np.ndarray, group: Sequence[int], what: str) -> np.ndarray:
        """Every member's piece, stacked in group order: shape (n, *array.shape)."""
        comm = self._comm(group)
        send = _bytes_of(array)
        recv = np.empty(send.size * comm.size, np.uint8)
        self._wait(comm.Iallgather([send, self.mpi.BYTE], [recv, self.mpi.BYTE]), what)
        return recv.view(array.dtype).reshape((comm.size, *array.shape))

    def _exchange(self, chunks: Sequence[np.ndarray], group: Sequence[int], what: str) -> np.ndarray:
        """All-to-all of equal chunks: chunk j goes to member j; returns what each member sent here, stacked."""
        comm = self._comm(group)
        send = np.concatenate([_bytes_of(c) for c in chunks])
        recv = np.empty_like(send)
        self._wait(comm.Ialltoall([send, self.mpi.BYTE], [recv, self.mpi.BYTE]), what)
        return recv.view(chunks[0].dtype).reshape((comm.size, *chunks[0].shape))

    def _what(self, kind: str, group: Sequence[int]) -> str:
        self.calls += 1
        return f"{kind} #{self.calls} with ranks {list(group)}"

    def all_gather(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        pieces = self._gather(array, group, self._what("all_gather", group))
        if dim == 0 and array.ndim > 0:  # the pieces already lie in order: the receive buffer is the result
            return pieces.reshape((-1, *array.shape[1:]))
        return np.concatenate(list(pieces), axis=dim)

    def all_reduce(self, array: np.ndarray, group: Sequence[int]) -> np.ndarray:
        return sum_pieces(list(self._gather(array, group, self._what("all_reduce", group))))

    def reduce_scatter(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        chunks = split_chunks(array, len(group), dim)
        return sum_pieces(list(self._exchange(chunks, group, self._what("reduce_scatter", group))))

    def all_to_all(self, array: np.ndarray, group: Sequence[int], split_dim: int, concat_dim: int) -> np.ndarray:
        chunks = split_chunks(array, len(group), split_dim)
        pieces = self._exchange(chunks, group, self._what("all_to_all", group))
        return np.concatenate(list(pieces), axis=concat_dim)

    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None:
        request = self.p2p.isend(np.ascontiguousarray(array), dest=dest, tag=tag)
        self._wait(request, f"send to rank {dest} (tag {tag})")

    def recv(self, source: int, tag: int = 0) -> np.ndarray:
        found: list[Any] = []

        def arrived() -> bool:
            if not found:
                message = self.p2p.improbe(source=source, tag=tag)
                if message is not None:
                    found.append(message)
            return bool(found)

        self.poller.wait(arrived, f"recv from rank {source} (tag {tag})")
        return np.asarray(found[0].recv())


def open_communicator(timeout: float | None = None) -> MPICommunicator:
    """An :class:`MPICommunicator` over ``COMM_WORLD`` for code of your own under ``mpiexec`` (MPI starts here
    if it has not). Waits fail after ``timeout`` seconds or when another rank's failure status arrives."""
    mpi, _ = _import_mpi(finalize_at_exit=True)
    world = mpi.COMM_WORLD
    control = _Control(mpi, world)
    return MPICommunicator(mpi, world, _Poller(control, COLLECTIVE_TIMEOUT_S if timeout is None else timeout))


# ----------------------------------------------------------------------------------------------------------
# Running a plan


def _digest(outputs: Mapping[str, np.ndarray]) -> dict[str, str]:
    out = {}
    for name, value in outputs.items():
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
        out[name] = h.hexdigest()
    return out


def _failure(rank: int, round_: int, exc: BaseException) -> RankStatus:
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


def _agree(control: _Control, mine: RankStatus, timeout: float) -> tuple[dict[int, RankStatus], list[int]]:
    """Send this rank's status to all, collect everyone's for the round (until the deadline)."""
    control.announce(mine)
    deadline = time.monotonic() + timeout
    while True:
        control.drain()
        statuses = control.round(mine.round)
        if len(statuses) == control.size or time.monotonic() > deadline:
            break
        if _orphaned():
            os._exit(1)
        time.sleep(1e-3)
    missing = sorted(set(range(control.size)) - set(statuses))
    return statuses, missing


def _outcome(statuses: Mapping[int, RankStatus], missing: Sequence[int], timeout: float) -> MPIRunError | None:
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


def _release(control: _Control, finalize: bool) -> None:
    """The reporter, at exit (after the CLI printed the error): let the silent ranks go, then end MPI."""
    sends = [control.comm.isend(None, dest=d, tag=RELEASE_TAG) for d in range(control.size) if d != control.rank]
    deadline = time.monotonic() + LINGER_S
    while not control.mpi.Request.Testall(sends) and time.monotonic() < deadline:
        time.sleep(1e-3)
    if finalize:
        control.mpi.Finalize()
        time.sleep(EXIT_GRACE_S)  # exit last: mpiexec kills (and reports) ranks still running after a failure


def _await_release(control: _Control, reporter: int, finalize: bool, exit_code: int) -> None:
    """A silent rank: wait until the reporter has printed the error, then end quietly.

    Exiting first would let ``mpiexec`` kill the reporter before it prints. When every rank answered, all end
    MPI together and the silent ranks exit 0, before the reporter exits with the failure's code: ``mpiexec``
    then has no process left to kill (a killed process makes it print a banner) and returns that code. When
    a rank did not answer (hung), the others exit with the failure's code without ending MPI.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline and not _orphaned():
        if control.comm.iprobe(source=reporter, tag=RELEASE_TAG):
            control.comm.recv(source=reporter, tag=RELEASE_TAG)
            if finalize:
                control.mpi.Finalize()
                # A normal exit: after MPI_Finalize, os._exit makes MPICH's mpiexec see an abnormal end.
                raise SystemExit(0)  # the reporter exits with the failure's code, last
            break
        time.sleep(1e-3)
    _tell_supervisor("X")
    os._exit(exit_code)


def _fail_together(control: _Control, error: MPIRunError, reporter: int, everyone: bool) -> NoReturn:
    """Raise ``error`` on the reporter; end the other ranks quietly once it has been printed."""
    if reporter == control.rank:
        atexit.register(_release, control, everyone)
        _claim_job_report()  # this rank's line says why the job ends: the watchdogs stay silent
        raise error
    _await_release(control, reporter, everyone, error.exit_code)
    raise AssertionError("unreachable")  # pragma: no cover


def _interrupted(rank: int) -> None:
    """Ctrl-C (mpiexec forwards it to every rank): no status round, every rank stops now; rank 0 re-raises
    (the CLI prints ``interrupted``), the others leave quietly."""
    if rank == 0:
        _claim_job_report()
        raise KeyboardInterrupt
    sys.stdout.flush()
    sys.stderr.flush()
    _tell_supervisor("X")
    os._exit(130)


def _conclude(control: _Control, statuses: Mapping[int, RankStatus], missing: Sequence[int], timeout: float) -> None:
    error = _outcome(statuses, missing, timeout)
    if error is not None:
        # The lowest rank that answered reports (this rank always has its own status).
        _fail_together(control, error, min(statuses), not missing)


def _inputs(
    plan: PlanDir, inputs: Mapping[str, np.ndarray] | str | Path | None, seed: int, notes: list[str]
) -> dict[str, np.ndarray]:
    if inputs is None:
        notes.append(f"no --inputs: using random inputs (seed {seed})")
        return random_inputs(plan.input_specs, seed)
    if isinstance(inputs, str | Path):
        return load_npz(Path(inputs))
    return dict(inputs)


@dataclass
class _Setup:
    plan: PlanDir
    choice: DeviceChoice
    feeds: dict[str, np.ndarray]
    program: Any
    notes: list[str]


def _setup(
    plan_dir: str | Path | PlanDir,
    inputs: Mapping[str, np.ndarray] | str | Path | None,
    seed: int,
    device: str,
    world: Any,
    local: Any,
) -> _Setup:
    plan = plan_dir if isinstance(plan_dir, PlanDir) else load_plan_dir(plan_dir, check_files=False)
    if world.size != plan.world_size and world.size == 1:
        raise RuntimeBackendError(
            f"world size: one process, the plan in {plan.path} has {plan.world_size} ranks. Launch it with "
            f"`mpiexec -n {plan.world_size} unity-eq run {plan.path} --backend mpi`."
        )
    if world.size != plan.world_size:
        raise RuntimeBackendError(
            f"world size: mpiexec started {world.size} processes, the plan in {plan.path} has {plan.world_size} "
            f"ranks. Run `mpiexec -n {plan.world_size} unity-eq run {plan.path} --backend mpi`."
        )
    check_rank_file(plan, world.rank)
    choice = choose_device(device, local.rank)
    notes: list[str] = []
    feeds = check_inputs(plan, _inputs(plan, inputs, seed, notes))
    program = build_rank_program(plan, world.rank, choice.providers, threads_per_rank(local.size))
    return _Setup(plan, choice, feeds, program, notes)


def run_plan_mpi(
    plan_dir: str | Path | PlanDir,
    inputs: Mapping[str, np.ndarray] | str | Path | None = None,
    *,
    seed: int = 0,
    device: str = "cpu",
    timeout: float | None = None,
    on_note: Note | None = None,
    repeat: int = 1,
    stats: dict[str, Any] | None = None,
    check_outputs: Callable[[], None] | None = None,
    on_progress: Note | None = None,
    tracker: Tracker | None = None,
) -> dict[str, np.ndarray] | None:
    """Run this process's rank of a plan under ``mpiexec``; rank 0 gets the outputs, other ranks None.

    ``inputs`` is a mapping, an ``.npz`` path or None (random, from ``seed``); every rank reads them.
    ``timeout`` bounds every wait (default ``UNITY_EQ_COLLECTIVE_TIMEOUT``, 300 s). ``repeat`` runs the plan
    that many times (timing); ``stats``, on rank 0, receives each rank's host, device and times.
    ``check_outputs`` runs on rank 0 during setup (e.g. that the outputs file can be written), so that its
    error, like every other, is reported once.
    ``on_progress`` (rank 0) hears the progress messages (``no --inputs: …``; without it they go to
    ``on_note``), and ``tracker`` (rank 0) the row ``run``, as in the local backend: the device files loaded,
    rank 0's stages run, the ranks run.

    A failure raises :class:`MPIRunError` on the lowest rank that knows it, naming the failing rank; the
    other ranks end their process quietly once it has been printed (:func:`_await_release`).
    """
    requested = timeout
    timeout = COLLECTIVE_TIMEOUT_S if timeout is None or timeout <= 0 else float(timeout)
    _supervise()
    mpi, ours = _import_mpi()
    world = mpi.COMM_WORLD
    rank = world.rank
    _tell_supervisor(f"R{rank};")
    local = world.Split_type(mpi.COMM_TYPE_SHARED, key=rank)
    control = _Control(mpi, world)
    host = mpi.Get_processor_name()

    setup: _Setup | None = None
    start = time.perf_counter()
    tracker = tracker if tracker is not None and rank == 0 else Tracker()
    tracker.start("run", f"loading {world.size} device files, one per process")
    try:
        if requested is not None and requested <= 0:
            raise OptionError(f"`--timeout` must be positive, got {requested:g}.")
        if repeat < 1:
            raise OptionError(f"`repeat` must be at least 1, got {repeat}.")
        if rank == 0 and check_outputs is not None:
            check_outputs()
        setup = _setup(plan_dir, inputs, seed, device, world, local)
        choice = setup.choice
        info = {"host": host, "device": choice.description, "note": choice.note, "local_rank": local.rank}
        status = RankStatus(rank, SETUP, True, info=info)
    except KeyboardInterrupt:
        _interrupted(rank)
    except BaseException as exc:  # reported to every rank, raised on one
        status = _failure(rank, SETUP, exc)
    statuses, missing = _agree(control, status, timeout)
    _conclude(control, statuses, missing, timeout)
    assert setup is not None
    setup_s = time.perf_counter() - start
    tracker.update("run", f"{world.size} device files loaded")
    progress = on_progress or on_note
    if rank == 0 and progress is not None:
        for message in setup.notes:
            progress(message)
    if rank == 0 and on_note is not None:
        choices = [DeviceChoice([], statuses[r].info["device"], statuses[r].info["note"]) for r in range(world.size)]
        for note in device_notes(choices):
            on_note(note)
        if any(c.cuda for c in choices):
            on_note(describe_devices(choices, [statuses[r].info["host"] for r in range(world.size)]))

    spins = 0 if local.size > available_cores() else 50
    comm = MPICommunicator(mpi, world, _Poller(control, timeout, spins))
    comm.prepare(c.groups for c in setup.plan.record.collectives)
    outputs: dict[str, np.ndarray] | None = None
    runs: list[dict[str, float]] = []

    def stage(done: int, total: int) -> None:
        tracker.count("run", done, total, "stages run (rank 0)")

    try:
        for _ in range(repeat):
            times = RankTimes()
            begin = time.perf_counter()
            outputs = execute_rank(setup.program, setup.feeds, comm, times, stage)
            runs.append(
                {
                    "wall_s": time.perf_counter() - begin,
                    "compute_s": sum(times.segments_s),
                    "collectives_s": times.collectives_s,
                }
            )
        assert outputs is not None
        info = {"digests": _digest(outputs), "runs": runs, "host": host, "device": setup.choice.description}
        status = RankStatus(rank, FINAL, True, info=info)
    except KeyboardInterrupt:
        _interrupted(rank)
    except BaseException as exc:  # reported to every rank, raised on one
        status = _failure(rank, FINAL, exc)
    statuses, missing = _agree(control, status, timeout)
    _conclude(control, statuses, missing, timeout)
    for other in range(1, world.size):
        theirs, first = statuses[other].info["digests"], statuses[0].info["digests"]
        differs = [name for name in first if theirs.get(name) != first[name]]
        if differs:
            error = MPIRunError(f"output {differs[0]!r} differs between rank 0 and rank {other}")
            _fail_together(control, error, 0, True)
    if stats is not None and rank == 0:
        stats["setup_s"] = setup_s
        stats["ranks"] = [
            {"rank": r, "host": s.info["host"], "device": s.info["device"], "runs": s.info["runs"]}
            for r, s in sorted(statuses.items())
        ]
    tracker.finish("run", f"{world.size} ranks run")
    comm.poller.wait(lambda: bool(mpi.Request.Testall(control.sends)), "sending the final status")
    if ours:
        mpi.Finalize()
    return outputs if rank == 0 else None
