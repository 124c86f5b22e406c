"""Run under ``mpiexec`` by tests/test_mpi.py (not a test module): MPI collectives and failure injection.

    mpiexec -n N python tests/mpi_driver.py ops
    mpiexec -n N python tests/mpi_driver.py {raise|die|exit|hang} PLAN_DIR [TIMEOUT]

``ops`` checks every collective of :class:`~unity_eq.runtime.mpi.MPICommunicator` bit for bit against the
reference functions of ``unity_eq.runtime``. The failure modes make rank 1 fail inside its run of the plan
(raise an exception, be killed by SIGKILL, ``os._exit(3)``, or hang) through ``unity-eq run``'s code path.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np


def _piece(rank: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng(rank)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-100, 100, size=shape).astype(dtype)
    # magnitudes 1e-3 … 1e7 (1e3 in float16): the order of a float sum changes its bits
    top = 4 if dtype == "float16" else 8
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, top, size=shape)
    return values.astype(dtype)


def ops() -> int:
    from unity_eq.runtime import (
        all_to_all_pieces,
        gather_pieces,
        reduce_scatter_pieces,
        sum_pieces,
    )
    from unity_eq.runtime.mpi import open_communicator

    comm = open_communicator(timeout=30)
    rank, size = comm.rank, comm.world.size
    groupings = [[list(range(size))]]
    if size == 4:  # the two axes of a 2x2 mesh: rows {0,1},{2,3} and columns {0,2},{1,3}
        groupings += [[[0, 1], [2, 3]], [[0, 2], [1, 3]]]
    comm.prepare(groupings)
    checked = 0
    for grouping in groupings:
        group = next(g for g in grouping if rank in g)
        i = group.index(rank)
        n = len(group)
        for dtype in ("float32", "float16", "float64", "int64", "bool"):
            shape = (2 * n, 3, 2 * n)
            pieces = [_piece(r, shape, dtype) for r in group]
            mine = pieces[i]
            for dim in (0, 2):
                got = comm.all_gather(mine, group, dim)
                assert got.tobytes() == gather_pieces(pieces, dim).tobytes(), ("all_gather", dtype, dim)
            if dtype != "bool":
                got = comm.all_reduce(mine, group)
                assert got.tobytes() == sum_pieces(pieces).tobytes(), ("all_reduce", dtype)
                for dim in (0, 2):
                    got = comm.reduce_scatter(mine, group, dim)
                    want = reduce_scatter_pieces(pieces, i, dim)
                    assert got.shape == want.shape and got.tobytes() == want.tobytes(), ("reduce_scatter", dtype)
            got = comm.all_to_all(mine, group, 0, 2)
            want = all_to_all_pieces(pieces, i, 0, 2)
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), ("all_to_all", dtype)
            checked += 1
    # send/recv around the ring (even ranks send first, so blocking sends cannot deadlock)
    right, left = (rank + 1) % size, (rank - 1) % size
    message = _piece(rank, (5, 7), "float32")
    for turn in (0, 1):
        if (rank % 2 == 0) == (turn == 0):
            comm.send(message, right, tag=3)
        else:
            got = comm.recv(left, tag=3)
            assert got.tobytes() == _piece(left, (5, 7), "float32").tobytes()
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    print(f"rank {rank}: ok ({checked} cases)", flush=True)
    return 0


def fail(mode: str, plan: str, timeout: float) -> int:
    import unity_eq.runtime.mpi as runtime_mpi

    if os.environ.get("PMI_RANK") == "1":  # the launcher's rank: MPI has not started yet
        real = runtime_mpi.execute_rank

        def faulty(*args, **kwargs):  # type: ignore[no-untyped-def]
            if mode == "raise":
                raise ValueError("injected failure")
            if mode == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "exit":
                os._exit(3)
            if mode == "hang":
                time.sleep(3600)
            return real(*args, **kwargs)

        runtime_mpi.execute_rank = faulty  # type: ignore[assignment]
    from unity_eq.cli import main

    return main(["run", plan, "--backend", "mpi", "--timeout", str(timeout)])


if __name__ == "__main__":
    if sys.argv[1] == "ops":
        sys.exit(ops())
    sys.exit(fail(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 30.0))
