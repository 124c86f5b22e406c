"""Running a plan: each rank's segments in order with the collectives between them (SPMD), on the local backend."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unity_eq.errors import RuntimeBackendError, UnityEqError
from unity_eq.files import raise_if_stopped
from unity_eq.progress import Tracker
from unity_eq.runtime.collectives import Board, Communicator, LocalCommunicator, group_of, run_collective
from unity_eq.runtime.devices import choose_device, describe_devices, device_notes, run_session, threads_per_rank
from unity_eq.runtime.plandir import PlanDir, check_inputs, load_plan_dir
from unity_eq.runtime.segments import RankProgram, build_rank_program

COLLECTIVE_TIMEOUT_S = float(os.environ.get("UNITY_EQ_COLLECTIVE_TIMEOUT", "300"))


@dataclass
class RankTimes:
    segments_s: list[float] = field(default_factory=list)
    collectives_s: float = 0.0


def execute_rank(
    program: RankProgram,
    inputs: Mapping[str, np.ndarray],
    comm: Communicator,
    times: RankTimes | None = None,
    on_stage: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run one rank's segments and collectives; returns the model outputs as this rank holds them.

    ``on_stage(done, total)`` hears each stage (a segment and the collectives after it) finished."""
    env: dict[str, np.ndarray] = dict(inputs)
    stages = len(program.segments)
    for index, (segment, collectives) in enumerate(zip(program.segments, program.collectives_after, strict=True)):
        if segment.session is not None:
            start = time.perf_counter()
            feeds = {name: env[name] for name in segment.inputs}
            values = run_session(segment.session, segment.outputs, feeds)
            env.update(zip(segment.outputs, values, strict=True))
            if times is not None:
                times.segments_s.append(time.perf_counter() - start)
        for c in collectives:
            start = time.perf_counter()
            env[c.dst] = run_collective(comm, c, env[c.src], group_of(c, program.rank))
            if times is not None:
                times.collectives_s += time.perf_counter() - start
        if on_stage is not None:
            on_stage(index + 1, stages)
    return {name: env[name] for name in program.outputs}


def run_plan(
    plan_dir: str | Path | PlanDir,
    inputs: Mapping[str, np.ndarray],
    backend: str = "local",
    device: str = "cpu",
    on_note: Callable[[str], None] | None = None,
    timeout: float | None = None,
    tracker: Tracker | None = None,
) -> dict[str, np.ndarray]:
    """Run every rank of a plan in this process (``local`` backend) and return rank 0's outputs.

    All ranks must agree on every (replicated) output; a disagreement is an error, not a silent choice.
    ``timeout`` bounds the wait of one collective (default ``UNITY_EQ_COLLECTIVE_TIMEOUT``, 300 s).
    ``tracker`` (unity_eq.progress) hears the device files loaded and rank 0's stages run (row ``run``).
    """
    tracker = tracker or Tracker()
    plan = plan_dir if isinstance(plan_dir, PlanDir) else load_plan_dir(plan_dir)
    if backend != "local":
        raise RuntimeBackendError(f"backend: `run_plan` runs the local backend; got {backend!r}")
    feeds = check_inputs(plan, inputs)
    world = plan.world_size
    threads = threads_per_rank(world)
    choices = [choose_device(device, rank) for rank in range(world)]
    if on_note:
        for note in device_notes(choices):
            on_note(note)
        if any(c.cuda for c in choices):
            on_note(describe_devices(choices))
    tracker.start("run", f"loading {world} device files")
    programs = []
    for rank in range(world):
        programs.append(build_rank_program(plan, rank, choices[rank].providers, threads))
        tracker.count("run", rank + 1, world, "device files loaded")

    def stage(done: int, total: int) -> None:
        tracker.count("run", done, total, "stages run (rank 0)")

    outputs = execute_local(programs, feeds, timeout, stage)
    tracker.finish("run", f"{world} ranks run")
    return outputs


def execute_local(
    programs: Sequence[RankProgram],
    feeds: Mapping[str, np.ndarray],
    timeout: float | None = None,
    on_stage: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run loaded rank programs once, one thread per rank (``check`` runs the same programs on many inputs).

    ``on_stage(done, total)`` hears rank 0's stages: the ranks wait for each other in every collective, so
    rank 0's progress is the run's."""
    world = len(programs)
    board = Board(world, COLLECTIVE_TIMEOUT_S if timeout is None else timeout)
    results: list[dict[str, np.ndarray] | None] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def work(rank: int) -> None:
        if board.failure is not None:  # interrupted before this rank started
            return
        try:
            progress = on_stage if rank == 0 else None
            results[rank] = execute_rank(programs[rank], feeds, LocalCommunicator(rank, board), on_stage=progress)
        except BaseException as exc:  # recorded and re-raised in the caller's thread
            errors[rank] = exc
            board.fail(f"rank {rank} failed: {exc}")

    # SIGTERM/SIGINT raise in this (the main) thread, possibly before every rank started: the board is failed,
    # so the ranks that did start stop at their next collective instead of waiting out the timeout for the
    # others, and those that start late do nothing (the interpreter's exit joins them).
    workers = [threading.Thread(target=work, args=(r,), name=f"unity-eq-rank{r}") for r in range(world)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    except BaseException:
        board.fail(Board.STOPPED)
        raise
    raise_if_stopped()  # a stop seen by the ranks (this function run outside the main thread)
    first = next((e for e in errors if e is not None and not _is_secondary(e)), None) or next(
        (e for e in errors if e is not None), None
    )
    if first is not None:
        if isinstance(first, UnityEqError):
            raise first
        rank = errors.index(first)
        raise RuntimeBackendError(f"rank {rank} failed: {type(first).__name__}: {first}") from first
    outputs = results[0]
    assert outputs is not None
    for rank in range(1, world):
        other = results[rank]
        assert other is not None
        for name, value in outputs.items():
            if not np.array_equal(value, other[name], equal_nan=True):
                raise RuntimeBackendError(f"output {name!r} differs between rank 0 and rank {rank}")
    return outputs


def _is_secondary(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeBackendError) and "stopped because" in str(exc)
