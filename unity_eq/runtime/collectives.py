"""Collectives behind one small :class:`Communicator` interface (defined with the kinds, in
:mod:`unity_eq.collectives.base`), their reference semantics on numpy pieces, and the in-process backend (every
rank a thread of this process); :func:`run_collective` runs a plan.json collective through its kind's op.

Reductions sum the pieces in the order of the ranks of the group, in every backend, so results agree bit for
bit where the reduction order is the same.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.collectives import BY_NAME, RUNTIME_FIELDS
from unity_eq.collectives import Communicator as Communicator  # defined with the kinds; re-exported
from unity_eq.errors import PlanError, RuntimeBackendError
from unity_eq.files import stop_requested
from unity_eq.planfile import CollectiveRecord


def gather_pieces(pieces: Sequence[np.ndarray], dim: int) -> np.ndarray:
    return np.concatenate(pieces, axis=dim)


def sum_pieces(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """Sum in group order, one addition at a time: the reduction order every backend uses."""
    total = np.array(pieces[0], copy=True)
    for piece in pieces[1:]:
        total += piece
    return total


def split_chunks(array: np.ndarray, parts: int, dim: int) -> list[np.ndarray]:
    """``parts`` equal contiguous chunks along ``dim`` (each a contiguous copy, ready to send)."""
    if array.ndim == 0 or array.shape[dim] % parts:
        raise RuntimeBackendError(
            f"collective: cannot split shape {list(array.shape)} into {parts} equal chunks along dim {dim}"
        )
    return [np.ascontiguousarray(c) for c in np.split(array, parts, axis=dim)]


def reduce_scatter_pieces(pieces: Sequence[np.ndarray], index: int, dim: int) -> np.ndarray:
    """Chunk ``index`` (along ``dim``) of the group-order sum of ``pieces``."""
    return sum_pieces([split_chunks(p, len(pieces), dim)[index] for p in pieces])


def all_to_all_pieces(pieces: Sequence[np.ndarray], index: int, split_dim: int, concat_dim: int) -> np.ndarray:
    """Chunk ``index`` along ``split_dim`` of every piece, concatenated along ``concat_dim`` in group order."""
    return np.concatenate([split_chunks(p, len(pieces), split_dim)[index] for p in pieces], axis=concat_dim)


class Board:
    """Where rank threads of one process meet for a collective or a message.

    A wait ends when the others arrive, when a rank fails (:meth:`fail`), after ``timeout`` seconds, or at once
    when SIGTERM/SIGINT asked the process to stop (:func:`unity_eq.files.stop_requested`, looked at every
    ``poll`` seconds): an interrupted run never waits out the collective timeout for ranks that will not come."""

    STOPPED = "the run was interrupted"

    def __init__(self, world: int, timeout: float, poll: float = 0.1) -> None:
        self.cond = threading.Condition()
        self.slots: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}
        self.counters = [0] * world
        self.mail: dict[tuple[int, int, int], deque[np.ndarray]] = {}
        self.failure: str | None = None
        self.timeout = timeout
        self.poll = poll

    def fail(self, message: str) -> None:
        """Stop every wait, now and later: the ranks raise ``rank N stopped because MESSAGE``."""
        with self.cond:
            if self.failure is None:
                self.failure = message
            self.cond.notify_all()

    def _stopped(self, rank: int) -> RuntimeBackendError:
        return RuntimeBackendError(f"rank {rank} stopped because {self.failure}")

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """With ``cond`` held: wait until ``ready()`` or a failure (True), or the timeout (False)."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self.failure is None and stop_requested():
                self.failure = self.STOPPED
                self.cond.notify_all()
            if self.failure is not None or ready():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.cond.wait(min(left, self.poll))

    def exchange(self, rank: int, group: tuple[int, ...], array: np.ndarray) -> list[np.ndarray]:
        with self.cond:
            seq = self.counters[rank]
            self.counters[rank] += 1
            entry = self.slots.setdefault((seq, group), {"pieces": {}, "readers": 0})
            entry["pieces"][rank] = array
            self.cond.notify_all()
            ready = self._wait(lambda: len(entry["pieces"]) == len(group))
            if self.failure is not None:
                raise self._stopped(rank)
            if not ready:
                missing = sorted(set(group) - set(entry["pieces"]))
                raise RuntimeBackendError(f"rank {rank}: collective #{seq} timed out waiting for ranks {missing}")
            pieces = [entry["pieces"][r] for r in group]
            entry["readers"] += 1
            if entry["readers"] == len(group):
                del self.slots[(seq, group)]
            return pieces

    def post(self, source: int, dest: int, tag: int, array: np.ndarray) -> None:
        with self.cond:
            self.mail.setdefault((source, dest, tag), deque()).append(np.array(array, copy=True))
            self.cond.notify_all()

    def take(self, source: int, dest: int, tag: int) -> np.ndarray:
        with self.cond:
            box = self.mail.setdefault((source, dest, tag), deque())
            ready = self._wait(lambda: bool(box))
            if self.failure is not None:
                raise self._stopped(dest)
            if not ready:
                raise RuntimeBackendError(f"rank {dest}: recv (tag {tag}) timed out waiting for rank {source}")
            return box.popleft()


@dataclass
class LocalCommunicator:
    """A rank thread's view of the in-process board."""

    rank: int
    board: Board

    def _pieces(self, array: np.ndarray, group: Sequence[int]) -> list[np.ndarray]:
        return self.board.exchange(self.rank, tuple(group), array)

    def all_gather(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        return gather_pieces(self._pieces(array, group), dim)

    def all_reduce(self, array: np.ndarray, group: Sequence[int]) -> np.ndarray:
        return sum_pieces(self._pieces(array, group))

    def reduce_scatter(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        return reduce_scatter_pieces(self._pieces(array, group), list(group).index(self.rank), dim)

    def all_to_all(self, array: np.ndarray, group: Sequence[int], split_dim: int, concat_dim: int) -> np.ndarray:
        pieces = self._pieces(array, group)
        return all_to_all_pieces(pieces, list(group).index(self.rank), split_dim, concat_dim)

    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None:
        self.board.post(self.rank, dest, tag, array)

    def recv(self, source: int, tag: int = 0) -> np.ndarray:
        return self.board.take(source, self.rank, tag)


def run_collective(comm: Communicator, c: CollectiveRecord, array: np.ndarray, group: Sequence[int]) -> np.ndarray:
    """Run one collective of plan.json through ``comm`` (planfile checked its kind and fields when it loaded)."""
    kind = BY_NAME.get(c.kind)
    if kind is None or kind.run is None or set(kind.dims) - set(c.dims()):
        known = [f"{name} ({', '.join(dims)})" if dims else name for name, dims in RUNTIME_FIELDS.items()]
        raise PlanError(
            f"plan.json: collective {c.id}: kind {c.kind!r} without its fields; expected {', '.join(known[:-1])} or "
            f"{known[-1]}. Re-run `unity-eq optimize` with this version."
        )
    return kind.run(comm, array, group, c.dims())


def group_of(collective: CollectiveRecord, rank: int) -> tuple[int, ...]:
    """The ranks ``rank`` runs ``collective`` with."""
    return collective.group_of(rank)
