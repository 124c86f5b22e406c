"""Step time of the bundled examples' plans on the local and the mpi backend, and the CLI's wall time.

    python benchmarks/runtime_backends.py [--repeat 20] [--out results.json]
    python benchmarks/runtime_backends.py --collectives     # all-gather / all-reduce alone, 1 KiB to 8 MiB

For each plan (the MLP and the transformer block, 2 and 4 ranks, inference and training), it makes the plan,
then measures one forward step after a warm-up: ``local`` runs every rank as a thread of this process,
``mpi`` runs ``mpiexec -n N`` processes (``run_plan_mpi(repeat=…)``), both with the same onnxruntime thread
count per rank. The median over the repeats of the slowest rank's step is reported, with the time spent in
collectives, and the wall time of the whole ``unity-eq run`` command (process start and model loading
included). Outputs are compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PLANS = {
    "mlp-2 inference": ("mlp", 2, None, "inference"),
    "mlp-4 inference": ("mlp", 4, None, "inference"),
    "transformer-2 inference": ("transformer", 2, None, "inference"),
    "transformer-4 training": ("transformer", 4, None, "training"),
    "transformer-2x2 training": ("transformer", 4, "2x2", "training"),
}


def local_steps(plan_dir: Path, feeds: dict[str, np.ndarray], repeat: int) -> dict[str, Any]:
    from unity_eq.runtime import (
        Board,
        LocalCommunicator,
        RankTimes,
        build_rank_program,
        check_inputs,
        execute_rank,
        load_plan_dir,
        threads_per_rank,
    )

    plan = load_plan_dir(plan_dir)
    feeds = check_inputs(plan, feeds)
    world = plan.world_size
    programs = [build_rank_program(plan, r, ["CPUExecutionProvider"], threads_per_rank(world)) for r in range(world)]
    steps, collectives = [], []
    outputs: dict[str, np.ndarray] = {}
    for _ in range(repeat + 1):  # the first run warms up
        board = Board(world, 60)
        times = [RankTimes() for _ in range(world)]
        results: list[Any] = [None] * world

        def work(rank: int, board: Board = board, times: list[RankTimes] = times, results: list[Any] = results) -> None:
            results[rank] = execute_rank(programs[rank], feeds, LocalCommunicator(rank, board), times[rank])

        threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
        begin = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        steps.append(time.perf_counter() - begin)
        collectives.append(max(t.collectives_s for t in times))
        outputs = results[0]
    return {
        "step_s": statistics.median(steps[1:]),
        "collectives_s": statistics.median(collectives[1:]),
        "outputs": outputs,
    }


def mpi_worker(plan_dir: str, inputs: str, repeat: int) -> None:
    from unity_eq.runtime.mpi import run_plan_mpi

    stats: dict[str, Any] = {}
    outputs = run_plan_mpi(plan_dir, inputs, repeat=repeat + 1, stats=stats)
    if outputs is not None:
        np.savez(Path(inputs).with_name("mpi_out.npz"), **outputs)
        print(json.dumps(stats))


def mpi_steps(plan_dir: Path, inputs: Path, ranks: int, repeat: int) -> dict[str, Any]:
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    command = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--mpi-worker", str(plan_dir), str(inputs)]
    proc = subprocess.run([*command, str(repeat)], capture_output=True, text=True, check=True, timeout=600)
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    per_run = list(zip(*[r["runs"] for r in stats["ranks"]], strict=True))[1:]  # drop the warm-up
    with np.load(inputs.with_name("mpi_out.npz")) as data:
        outputs = {k: data[k] for k in data.files}
    return {
        "step_s": statistics.median(max(r["wall_s"] for r in run) for run in per_run),
        "collectives_s": statistics.median(max(r["collectives_s"] for r in run) for run in per_run),
        "setup_s": stats["setup_s"],
        "outputs": outputs,
    }


def cli_wall(plan_dir: Path, inputs: Path, ranks: int, backend: str) -> float:
    command = [
        sys.executable,
        "-m",
        "unity_eq.cli",
        "run",
        str(plan_dir),
        "--inputs",
        str(inputs),
        "--backend",
        backend,
    ]
    if backend == "mpi":
        mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
        command = [mpiexec, "-n", str(ranks), *command]
    begin = time.perf_counter()
    subprocess.run(command, capture_output=True, check=True, timeout=600)
    return time.perf_counter() - begin


SIZES = (1 << 10, 1 << 20, 1 << 23)  # bytes per rank: 1 KiB, 1 MiB (the MLP's gathered piece at 4 ranks), 8 MiB


def _timed(call: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat + 2):
        begin = time.perf_counter()
        call()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples[2:])


def mpi_collectives_worker(repeat: int) -> None:
    from unity_eq.runtime.mpi import open_communicator

    comm = open_communicator(timeout=60)
    group = list(range(comm.world.size))
    comm.prepare([[group]])
    rows = []
    for size in SIZES:
        piece = np.ones(size // 4, np.float32)
        comm.world.Barrier()
        gather = _timed(lambda piece=piece: comm.all_gather(piece, group, 0), repeat)
        reduce = _timed(lambda piece=piece: comm.all_reduce(piece, group), repeat)
        rows.append({"bytes": size, "all_gather_s": gather, "all_reduce_s": reduce})
    if comm.rank == 0:
        print(json.dumps(rows))


def local_collectives(ranks: int, repeat: int) -> list[dict[str, float]]:
    from unity_eq.runtime import Board, LocalCommunicator

    rows = []
    for size in SIZES:
        out: dict[str, float] = {"bytes": size}
        for kind in ("all_gather", "all_reduce"):
            board = Board(ranks, 60)
            times: list[float] = [0.0] * ranks

            def work(
                rank: int, board: Board = board, kind: str = kind, times: list[float] = times, size: int = size
            ) -> None:
                comm = LocalCommunicator(rank, board)
                piece = np.ones(size // 4, np.float32)
                group = list(range(ranks))
                if kind == "all_gather":
                    times[rank] = _timed(lambda: comm.all_gather(piece, group, 0), repeat)
                else:
                    times[rank] = _timed(lambda: comm.all_reduce(piece, group), repeat)

            threads = [threading.Thread(target=work, args=(r,)) for r in range(ranks)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out[f"{kind}_s"] = statistics.median(times)
        rows.append(out)
    return rows


def collectives(repeat: int) -> None:
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    for ranks in (2, 4):
        command = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--mpi-collectives", str(repeat)]
        proc = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
        mpi = json.loads(proc.stdout.strip().splitlines()[-1])
        local = local_collectives(ranks, repeat)
        for m, loc in zip(mpi, local, strict=True):
            print(
                f"{ranks} ranks, {m['bytes'] >> 10:5d} KiB per rank: all_gather local "
                f"{loc['all_gather_s'] * 1e3:7.3f} ms mpi {m['all_gather_s'] * 1e3:7.3f} ms; all_reduce local "
                f"{loc['all_reduce_s'] * 1e3:7.3f} ms"
                f" mpi {m['all_reduce_s'] * 1e3:7.3f} ms",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--collectives", action="store_true", help="time all-gather and all-reduce alone")
    args = parser.parse_args()
    if args.collectives:
        collectives(args.repeat)
        return
    from unity_eq import optimize
    from unity_eq.runtime import random_inputs

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, devices, mesh, objective) in PLANS.items():
            plan_dir = Path(tmp) / name.replace(" ", "_")
            optimize(
                ROOT / "examples" / f"{model}.onnx",
                devices=devices,
                mesh=mesh,
                objective=objective,
                output_dir=plan_dir,
            )
            feeds = random_inputs({"X": {"shape": [8, 128, 256], "dtype": "float32"}}, seed=0)
            inputs = plan_dir.parent / f"{plan_dir.name}.in.npz"
            np.savez(inputs, **feeds)
            local = local_steps(plan_dir, feeds, args.repeat)
            mpi = mpi_steps(plan_dir, inputs, devices, args.repeat)
            same = all(local["outputs"][k].tobytes() == mpi["outputs"][k].tobytes() for k in local["outputs"])
            row = {
                "plan": name,
                "ranks": devices,
                "local_step_ms": local["step_s"] * 1e3,
                "local_collectives_ms": local["collectives_s"] * 1e3,
                "mpi_step_ms": mpi["step_s"] * 1e3,
                "mpi_collectives_ms": mpi["collectives_s"] * 1e3,
                "local_cli_s": cli_wall(plan_dir, inputs, devices, "local"),
                "mpi_cli_s": cli_wall(plan_dir, inputs, devices, "mpi"),
                "bit_for_bit": same,
            }
            rows.append(row)
            print(
                f"{name:26s} {devices} ranks  step: local {row['local_step_ms']:7.2f} ms "
                f"(collectives {row['local_collectives_ms']:5.2f})  mpi {row['mpi_step_ms']:7.2f} ms "
                f"(collectives {row['mpi_collectives_ms']:5.2f})  run command: local {row['local_cli_s']:.2f} s, "
                f"mpi {row['mpi_cli_s']:.2f} s  bit-for-bit {same}",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--mpi-worker":
        mpi_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--mpi-collectives":
        mpi_collectives_worker(int(sys.argv[2]))
    else:
        main()
