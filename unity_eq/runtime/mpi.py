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
* **Interrupts.** ``mpiexec`` forwards Ctrl-C and SIGTERM to every rank; each stops without a status round
  (rank 0 prints the one ``interrupted`` line). The supervisor ends a rank that has not stopped within 5 s,
  then sends PMI's ``finalize`` for it, so that MPICH's proxy does not take the exit for a crash and kill the
  other ranks: every rank exits 128 + the signal's number, and so does ``mpiexec`` (docs/runtime.md).

This module runs a plan (:func:`run_plan_mpi`); the parts it drives live beside it:
:mod:`~unity_eq.runtime.mpi_supervisor` (mpi4py and the supervisor), :mod:`~unity_eq.runtime.mpi_status`
(status rounds and deadlines) and :mod:`~unity_eq.runtime.mpi_communicator` (the collectives).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.errors import OptionError, RuntimeBackendError
from unity_eq.progress import Tracker
from unity_eq.runtime.devices import (
    DeviceChoice,
    available_cores,
    choose_device,
    describe_devices,
    device_notes,
    threads_per_rank,
)
from unity_eq.runtime.draws import random_inputs
from unity_eq.runtime.execute import COLLECTIVE_TIMEOUT_S, RankTimes, execute_rank
from unity_eq.runtime.mpi_communicator import MPICommunicator, open_communicator
from unity_eq.runtime.mpi_pipeline import PipelineRank, pipeline_groupings, pipeline_rank, run_pipeline_rank
from unity_eq.runtime.mpi_status import (
    FINAL,
    SETUP,
    Control,
    MPIRunError,
    Poller,
    RankStatus,
    fail_together,
    status_round,
)
from unity_eq.runtime.mpi_supervisor import import_mpi, supervise, tell_supervisor
from unity_eq.runtime.pipeline import PipelinePlan, read_plan
from unity_eq.runtime.plandir import PlanDir, check_inputs, check_rank_file, load_npz
from unity_eq.runtime.segments import build_rank_program

__all__ = ["MPICommunicator", "MPIRunError", "open_communicator", "run_plan_mpi"]

Note = Callable[[str], None]


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
    pipeline: PipelineRank | None = None  # a pipeline plan: this rank's stage (runtime/mpi_pipeline.py)


def _setup(
    plan_dir: str | Path | PlanDir,
    inputs: Mapping[str, np.ndarray] | str | Path | None,
    seed: int,
    device: str,
    world: Any,
    local: Any,
) -> _Setup:
    loaded = plan_dir if isinstance(plan_dir, PlanDir) else read_plan(plan_dir, check_files=False)
    if isinstance(loaded, PipelinePlan):
        pipeline = loaded
        choice = choose_device(device, local.rank)
        part = pipeline_rank(pipeline, world.rank, world.size, choice.providers, threads_per_rank(local.size))
        notes: list[str] = []
        feeds = check_inputs(pipeline.whole, _inputs(pipeline.whole, inputs, seed, notes))
        return _Setup(pipeline.whole, choice, feeds, part.program, notes, part)
    plan = loaded
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
    notes = []
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
    other ranks end their process quietly once it has been printed
    (:func:`~unity_eq.runtime.mpi_status.fail_together`).
    """
    requested = timeout
    timeout = COLLECTIVE_TIMEOUT_S if timeout is None or timeout <= 0 else float(timeout)
    supervise()
    mpi, ours = import_mpi()
    world = mpi.COMM_WORLD
    rank = world.rank
    tell_supervisor(f"R{rank};")
    local = world.Split_type(mpi.COMM_TYPE_SHARED, key=rank)
    control = Control(mpi, world)
    host = mpi.Get_processor_name()

    setup: _Setup | None = None
    start = time.perf_counter()
    tracker = tracker if tracker is not None and rank == 0 else Tracker()
    tracker.start("run", f"loading {world.size} device files, one per process")

    def load() -> dict[str, Any]:
        nonlocal setup
        if requested is not None and requested <= 0:
            raise OptionError(f"`--timeout` must be positive, got {requested:g}.")
        if repeat < 1:
            raise OptionError(f"`repeat` must be at least 1, got {repeat}.")
        if rank == 0 and check_outputs is not None:
            check_outputs()
        setup = _setup(plan_dir, inputs, seed, device, world, local)
        choice = setup.choice
        return {"host": host, "device": choice.description, "note": choice.note, "local_rank": local.rank}

    statuses = status_round(control, SETUP, timeout, load)
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
    comm = MPICommunicator(mpi, world, Poller(control, timeout, spins))
    if setup.pipeline is not None:
        comm.prepare(pipeline_groupings(setup.pipeline.plan))
    else:
        comm.prepare(c.groups for c in setup.plan.record.collectives)
    outputs: dict[str, np.ndarray] | None = None
    runs: list[dict[str, float]] = []

    def stage(done: int, total: int) -> None:
        tracker.count("run", done, total, "stages run (rank 0)")

    def run() -> dict[str, Any]:
        nonlocal outputs
        assert setup is not None
        for _ in range(repeat):
            times = RankTimes()
            begin = time.perf_counter()
            if setup.pipeline is not None:
                outputs = run_pipeline_rank(setup.pipeline, setup.feeds, comm, times, stage) or {}
            else:
                outputs = execute_rank(setup.program, setup.feeds, comm, times, stage)
            runs.append(
                {
                    "wall_s": time.perf_counter() - begin,
                    "compute_s": sum(times.segments_s),
                    "collectives_s": times.collectives_s,
                }
            )
        assert outputs is not None
        return {"digests": _digest(outputs), "runs": runs, "host": host, "device": setup.choice.description}

    statuses = status_round(control, FINAL, timeout, run)
    try:
        return _finish(mpi, control, comm, statuses, setup, outputs, stats, tracker, setup_s, ours)
    except KeyboardInterrupt:
        if rank == 0:
            raise
        return None  # this rank's part is done and rank 0 has every status: the job's outcome is rank 0's


def _finish(
    mpi: Any,
    control: Control,
    comm: MPICommunicator,
    statuses: dict[int, RankStatus],
    setup: _Setup,
    outputs: dict[str, np.ndarray] | None,
    stats: dict[str, Any] | None,
    tracker: Tracker,
    setup_s: float,
    ours: bool,
) -> dict[str, np.ndarray] | None:
    """After the last status round: compare the ranks' outputs, report, end MPI. A rank other than 0
    interrupted here exits 0 (its caller returns): the outputs are complete and rank 0 prints them."""
    rank = control.rank
    for other in range(1, control.size if setup.pipeline is None else 1):  # a pipeline's outputs are rank 0's alone
        theirs, first = statuses[other].info["digests"], statuses[0].info["digests"]
        differs = [name for name in first if theirs.get(name) != first[name]]
        if differs:
            error = MPIRunError(f"output {differs[0]!r} differs between rank 0 and rank {other}")
            fail_together(control, error, 0, True)
    if stats is not None and rank == 0:
        stats["setup_s"] = setup_s
        stats["ranks"] = [
            {"rank": r, "host": s.info["host"], "device": s.info["device"], "runs": s.info["runs"]}
            for r, s in sorted(statuses.items())
        ]
    tracker.finish("run", f"{control.size} ranks run")
    comm.poller.wait(lambda: bool(mpi.Request.Testall(control.sends)), "sending the final status")
    if ours:
        mpi.Finalize()
    return outputs if rank == 0 else None
