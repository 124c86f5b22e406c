"""The MPI backend's communicator: the collectives of one rank over MPI sub-communicators, on raw bytes.

Separate from running a plan because it is usable on its own: :func:`open_communicator` gives code of your
own under ``mpiexec`` the same collectives the runtime uses (the table in :mod:`unity_eq.runtime.mpi`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from unity_eq.errors import RuntimeBackendError
from unity_eq.runtime.collectives import split_chunks, sum_pieces
from unity_eq.runtime.execute import COLLECTIVE_TIMEOUT_S
from unity_eq.runtime.mpi_status import Control, Poller
from unity_eq.runtime.mpi_supervisor import import_mpi

__all__ = ["MPICommunicator", "open_communicator"]


def _bytes_of(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class MPICommunicator:
    """The :class:`~unity_eq.runtime.Communicator` of one MPI rank. ``group``\\ s are ``COMM_WORLD`` ranks.

    :meth:`prepare` (collective over ``COMM_WORLD``) makes the sub-communicators of a list of groupings up
    front; a group met later gets one from ``MPI_Comm_create_group`` (collective over that group only).
    """

    def __init__(self, mpi: Any, world: Any, poller: Poller) -> None:
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

    def start_send(self, array: np.ndarray, dest: int, tag: int = 0) -> tuple[Any, str]:
        """A send that does not wait for its receiver (:meth:`finish_sends` does): a pipeline's stage 0 sends a
        side tensor to every later stage and goes on to its next microbatch meanwhile."""
        return self.p2p.isend(np.ascontiguousarray(array), dest=dest, tag=tag), f"send to rank {dest} (tag {tag})"

    def finish_sends(self, sends: Sequence[tuple[Any, str]]) -> None:
        """Wait until every send :meth:`start_send` began has been received."""
        for request, what in sends:
            self._wait(request, what)

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
    mpi, _ = import_mpi(finalize_at_exit=True)
    world = mpi.COMM_WORLD
    control = Control(mpi, world)
    return MPICommunicator(mpi, world, Poller(control, COLLECTIVE_TIMEOUT_S if timeout is None else timeout))
