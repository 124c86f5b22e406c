"""The mpi backend under a real ``mpiexec`` with 2 and 4 ranks: bit-for-bit agreement with the local backend,
every collective of the MPI communicator, and failures that end every rank quickly with the rank named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from unity_eq import optimize
from unity_eq.runtime import random_inputs, run_plan

pytest.importorskip("mpi4py", reason="the mpi backend needs mpi4py: pip install -e '.[mpi]'")

TESTS = Path(__file__).resolve().parent
DRIVER = TESTS / "mpi_driver.py"


def _mpiexec() -> str:
    for candidate in (Path(sys.executable).parent / "mpiexec", shutil.which("mpiexec")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.skip("no mpiexec on PATH: pip install -e '.[mpi]' brings MPICH's")
    raise AssertionError  # unreachable


def mpirun(n: int, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(
        [_mpiexec(), "-n", str(n), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc, time.monotonic() - start


def unity_eq(n: int, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    return mpirun(n, "-m", "unity_eq.cli", *args, timeout=timeout)


@pytest.fixture(scope="session")
def plans(examples: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Plans whose collectives cover all-gather, all-reduce, sub-groups of a 2-axis mesh and 2 or 4 ranks."""
    out = tmp_path_factory.mktemp("mpi-plans")
    specs = {
        "mlp-2": ("mlp", 2, None, "inference"),
        "mlp-4": ("mlp", 4, None, "inference"),
        "transformer-4-training": ("transformer", 4, None, "training"),
        "transformer-2x2-training": ("transformer", 4, "2x2", "training"),
        "transformer-2-inference": ("transformer", 2, None, "inference"),
    }
    paths = {}
    for name, (model, devices, mesh, objective) in specs.items():
        paths[name] = out / name
        optimize(examples / f"{model}.onnx", devices=devices, mesh=mesh, objective=objective, output_dir=paths[name])
    return paths


def _ranks(plan: Path) -> int:
    return len(list(plan.glob("device_*.onnx")))


def _assert_one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "name", ["mlp-2", "mlp-4", "transformer-4-training", "transformer-2x2-training", "transformer-2-inference"]
)
def test_mpi_matches_the_local_backend_bit_for_bit(plans: dict[str, Path], tmp_path: Path, name: str) -> None:
    plan = plans[name]
    meta_inputs = {"X": {"shape": [8, 128, 256], "dtype": "float32"}}
    feeds = random_inputs(meta_inputs, seed=7)
    np.savez(tmp_path / "in.npz", **feeds)
    proc, _ = unity_eq(
        _ranks(plan), "run", str(plan), "--backend", "mpi", "--inputs", str(tmp_path / "in.npz"),
        "--outputs", str(tmp_path / "out.npz"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ranks = _ranks(plan)
    progress = [f"… run: loading {ranks} device files, one per process", f"… run: {ranks} ranks run"]
    assert proc.stderr.splitlines() == progress, proc.stderr  # rank 0's progress; no notes, no MPI noise
    assert proc.stdout.count("Y: float32[8, 128, 256]") == 1  # rank 0 alone prints
    expected = run_plan(plan, feeds)
    with np.load(tmp_path / "out.npz") as got:
        assert sorted(got.files) == sorted(expected)
        for key, value in expected.items():
            assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key


@pytest.mark.parametrize("ranks", [2, 4])
def test_mpi_communicator_collectives(ranks: int) -> None:
    """all_gather, all_reduce, reduce_scatter, all_to_all (on the world and on 2x2 sub-groups), send/recv."""
    proc, _ = mpirun(ranks, str(DRIVER), "ops")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": ok") == ranks


def test_progress_once_and_nothing_with_quiet(plans: dict[str, Path]) -> None:
    """Without -q rank 0 (only) says, as plain lines, that the run starts, that the inputs are random and that
    the ranks ran (the local backend's row `run`); with -q, nothing, as the local backend."""
    proc, _ = unity_eq(2, "run", str(plans["mlp-2"]), "--backend", "mpi", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == [
        "… no --inputs: using random inputs (seed 3)",
        "… run: 2 ranks run",
        "… run: loading 2 device files, one per process",
    ], proc.stderr
    quiet, _ = unity_eq(2, "run", str(plans["mlp-2"]), "--backend", "mpi", "--seed", "3", "-q")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout == proc.stdout and "Y: float32" in quiet.stdout


def test_device_cuda_falls_back_with_one_message(plans: dict[str, Path]) -> None:
    from unity_eq.runtime import cuda_problem

    if cuda_problem(0) is None:
        pytest.skip("this machine has a usable CUDA device")
    proc, _ = unity_eq(2, "run", str(plans["mlp-2"]), "--backend", "mpi", "--device", "cuda", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "CUDA" in line]
    assert len(notes) == 1 and "running on the CPU" in notes[0], proc.stderr
    assert "onnxruntime" in notes[0] and "[E:" not in proc.stderr and "[W:" not in proc.stderr


# --- failures: every rank ends, quickly, with one line naming the rank and the cause --------------------------


def test_missing_shard(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans["mlp-4"], plan)
    (plan / "device_2.onnx").unlink()
    proc, seconds = unity_eq(4, "run", str(plan), "--backend", "mpi", "--timeout", "20")
    _assert_one_error(proc, "rank 2", "device_2.onnx", "missing")
    assert "BAD TERMINATION" not in proc.stdout + proc.stderr
    assert seconds < 30


def test_corrupt_shard(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans["mlp-2"], plan)
    (plan / "device_1.onnx").write_bytes(b"not a model")
    proc, _ = unity_eq(2, "run", str(plan), "--backend", "mpi", "--timeout", "20")
    _assert_one_error(proc, "rank 1", "device_1.onnx", "cannot load")


def test_world_size_must_match_the_plan(plans: dict[str, Path]) -> None:
    proc, _ = unity_eq(2, "run", str(plans["mlp-4"]), "--backend", "mpi", "--timeout", "20")
    _assert_one_error(proc, "has 4 ranks", "mpiexec started 2 processes", "mpiexec -n 4")


def test_bad_inputs_are_one_error(plans: dict[str, Path], tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", X=np.zeros((2, 2), np.float32))
    proc, _ = unity_eq(2, "run", str(plans["mlp-2"]), "--backend", "mpi", "--inputs", str(tmp_path / "in.npz"))
    _assert_one_error(proc, "'X' has shape [2, 2]", "--input-shape")


def _break_rank_at_run_time(plan: Path, rank: int) -> None:
    """Make ``rank``'s shard fail inside onnxruntime after the first collective (a Gather out of bounds)."""
    path = plan / f"device_{rank}.onnx"
    model = onnx.load(str(path))
    graph = model.graph
    first = json.loads((plan / "plan.json").read_text())["collectives"][0]["dst"]  # stage 1 reads it as an input
    cut = next(i for i in graph.input if i.name == first)
    rows = cut.type.tensor_type.shape.dim[0].dim_value
    graph.initializer.append(numpy_helper.from_array(np.arange(rows, dtype=np.int64) + 1000, "broken.indices"))
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name == cut.name:
                node.input[k] = "broken.rows"
    graph.node.insert(0, helper.make_node("Gather", [cut.name, "broken.indices"], ["broken.rows"], axis=0))
    onnx.save(model, str(path))


def test_rank_failing_inside_onnxruntime(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans["transformer-4-training"], plan)
    _break_rank_at_run_time(plan, 3)
    proc, seconds = unity_eq(4, "run", str(plan), "--backend", "mpi", "--timeout", "30", "--seed", "0")
    _assert_one_error(proc, "rank 3", "onnxruntime", "indices element out of data bounds")
    assert "BAD TERMINATION" not in proc.stdout + proc.stderr
    assert seconds < 30


def test_rank_raising_in_python(plans: dict[str, Path]) -> None:
    proc, seconds = mpirun(4, str(DRIVER), "raise", str(plans["transformer-4-training"]), "30")
    _assert_one_error(proc, "rank 1", "ValueError: injected failure")
    assert seconds < 30


@pytest.mark.parametrize(("mode", "cause"), [("die", "killed by signal SIGKILL"), ("exit", "exited with code 3")])
def test_rank_dying(plans: dict[str, Path], mode: str, cause: str) -> None:
    """A rank killed by a signal (or leaving with os._exit) cannot report itself: its supervisor does, and
    mpiexec stops the others (and prints its own banner after our line)."""
    proc, seconds = mpirun(4, str(DRIVER), mode, str(plans["transformer-4-training"]), "30")
    line = _assert_one_error(proc, "rank 1 died", cause)
    assert proc.stderr.lstrip().startswith(line) or line in proc.stderr.splitlines()[:3]
    assert seconds < 30


def test_rank_hanging_is_named_after_the_timeout(plans: dict[str, Path]) -> None:
    proc, seconds = mpirun(2, str(DRIVER), "hang", str(plans["mlp-2"]), "2")
    _assert_one_error(proc, "rank 1 did not answer within 2 s", "hung")
    assert seconds < 25


def test_bad_outputs_path_is_one_error(plans: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "out.npz"
    proc, _ = unity_eq(2, "run", str(plans["mlp-2"]), "--backend", "mpi", "--outputs", str(target))
    _assert_one_error(proc, "`--outputs`", "existing directory")


def test_without_mpiexec(examples: Path, plans: dict[str, Path], tmp_path: Path) -> None:
    """Started without mpiexec, MPI is one process: fine for a one-rank plan, a clear error otherwise."""
    command = [sys.executable, "-m", "unity_eq.cli", "run", "--backend", "mpi", "--seed", "2"]
    proc = subprocess.run([*command, str(plans["mlp-2"])], capture_output=True, text=True, timeout=120, check=False)
    _assert_one_error(proc, "one process", "mpiexec -n 2")
    optimize(examples / "mlp.onnx", devices=1, output_dir=tmp_path / "one")
    proc = subprocess.run([*command, str(tmp_path / "one")], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Y: float32[8, 128, 256]" in proc.stdout


def test_ctrl_c_stops_every_rank(plans: dict[str, Path]) -> None:
    """Ctrl-C to mpiexec (it forwards SIGINT to every rank) while a rank hangs: all stop at once."""
    import signal

    command = [_mpiexec(), "-n", "2", sys.executable, str(DRIVER), "hang", str(plans["mlp-2"]), "60"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("… run: loading")
        assert "random inputs" in proc.stderr.readline()  # setup is done: rank 1 is hanging
        time.sleep(1.0)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        assert time.monotonic() - start < 15
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _started_by_mpiexec(rank: int, needle: str) -> int:
    """The pid of the process mpiexec started for ``rank`` (the supervisor, not the rank it forked)."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if needle.encode() in cmdline and f"PMI_RANK={rank}".encode() in environ:
            found[int(entry.name)] = ppid
    outer = [pid for pid, ppid in found.items() if ppid not in found]
    assert len(outer) == 1, found
    return outer[0]


def test_killing_the_process_mpiexec_started_says_so(plans: dict[str, Path]) -> None:
    """SIGKILL to the process mpiexec started for rank 1: MPICH kills the others with SIGKILL and prints its
    banner; rank 1 itself (forked below that process) prints one error: line for the job."""
    import signal

    command = [_mpiexec(), "-n", "2", sys.executable, str(DRIVER), "hang", str(plans["mlp-2"]), "60"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("… run: loading")
        assert "random inputs" in proc.stderr.readline()  # setup is done: rank 1 is hanging
        time.sleep(0.5)
        target = _started_by_mpiexec(1, str(plans["mlp-2"]))
        start = time.monotonic()
        import os

        os.kill(target, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 15
        assert proc.returncode != 0
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, err
        assert "rank 1" in lines[0] and f"pid {target}" in lines[0] and "killed" in lines[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("signame", "to_group"), [("SIGINT", True), ("SIGTERM", False)])
def test_interrupting_mpiexec_gives_one_line_and_the_signal_s_code(
    plans: dict[str, Path], signame: str, to_group: bool
) -> None:
    """Ctrl-C (SIGINT to mpiexec's process group, as a terminal sends it) or SIGTERM to mpiexec during
    `mpiexec -n 2 unity-eq run`: one `interrupted` line, exit 128 + the signal's number, no MPICH banner.
    MPICH's proxy SIGKILLed the other ranks as soon as the first interrupted rank exited (its PMI socket closed
    without PMI's finalize), and mpiexec exited 9 after its "BAD TERMINATION" banner."""
    import os
    import signal

    signum = signal.Signals[signame]
    command = [_mpiexec(), "-n", "2", _console_script(), "run", str(plans["mlp-2"]), "--backend", "mpi"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # rank 0 prints it once MPI is up, before the ranks load their shards
        assert first.startswith("… run: loading"), first
        start = time.monotonic()
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, (proc.returncode, out, err)
    said = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(said) == 1 and said[0].startswith(f"interrupted by {signame}: unity-eq run"), err
    assert "error:" not in err and "Traceback" not in err, err
    assert "BAD TERMINATION" not in out and "signal 9" not in out, out


def _console_script() -> str:
    """This environment's ``unity-eq`` (a launcher's PATH may find another environment's first)."""
    script = Path(sys.executable).parent / "unity-eq"
    return str(script) if script.exists() else "unity-eq"


def _ranks_importing(needle: str, ranks: int, timeout: float = 30) -> list[int]:
    """The pids of the ``ranks`` processes ``mpiexec`` started (``needle`` in their command line), once each
    has loaded numpy's core library: every rank is then inside unity-eq's own imports (numpy is imported only by
    the app, after :func:`unity_eq.cli.entry` installed its handlers), long before its command begins."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if needle.encode() not in (entry / "cmdline").read_bytes():
                    continue
                if b"PMI_RANK=" not in (entry / "environ").read_bytes():
                    continue
                if "_multiarray_umath" in (entry / "maps").read_text():
                    found.append(int(entry.name))
            except OSError:
                continue
        if len(found) >= ranks:
            return found
        time.sleep(0.002)
    raise AssertionError(f"the ranks of {needle} never loaded numpy")


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_interrupting_mpiexec_while_the_ranks_import_gives_one_line(
    plans: dict[str, Path], tmp_path: Path, signame: str
) -> None:
    """A signal while the ranks are still importing (numpy loaded, the app not yet): before, every rank printed
    Python's KeyboardInterrupt traceback (SIGINT) or died of SIGTERM, and MPICH printed its "BAD TERMINATION"
    banner (exit 2 or 15). Now: rank 0's one `interrupted` line and exit 128 + the signal's number."""
    import os
    import signal

    signum = signal.Signals[signame]
    plan = tmp_path / "plan"  # a path of its own, to find this test's ranks by their command line
    shutil.copytree(plans["mlp-2"], plan)
    command = [_mpiexec(), "-n", "2", _console_script(), "run", str(plan), "--backend", "mpi"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _ranks_importing(str(plan), 2)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # Ctrl-C in a terminal: the whole process group
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, (proc.returncode, out, err)
    assert "Traceback" not in err and "error:" not in err, err
    said = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(said) == 1 and said[0].startswith(f"interrupted by {signame}: unity-eq run"), err
    assert "BAD TERMINATION" not in out, out
