"""Runtime pieces: the in-process communicator, segmenting, comparisons, plan-directory validation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from unity_eq import runtime
from unity_eq.errors import PlanError, RuntimeBackendError
from unity_eq.ir import Mesh
from unity_eq.planfile import PLAN_FORMAT_VERSION, CollectiveRecord, read_run_record
from unity_eq.runtime import (
    Board,
    DeviceChoice,
    LocalCommunicator,
    all_to_all_pieces,
    choose_device,
    compare_outputs,
    cuda_device_for,
    cuda_providers,
    describe_devices,
    device_notes,
    load_plan_dir,
    random_inputs,
    reduce_scatter_pieces,
    run_collective,
    run_plan,
    sum_pieces,
)


def _run_ranks(world: int, body) -> list:  # type: ignore[no-untyped-def]
    board = Board(world, timeout=10)
    results: list = [None] * world

    def work(rank: int) -> None:
        try:
            results[rank] = body(LocalCommunicator(rank, board))
        except Exception as exc:
            results[rank] = exc
            board.fail(str(exc))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_all_gather_concatenates_in_axis_order() -> None:
    mesh = Mesh(("x", "y"), (2, 2))
    results = _run_ranks(4, lambda c: c.all_gather(np.full((1, 2), c.rank), mesh.group(c.rank, "x"), 0))
    assert results[1].tolist() == [[1, 1], [3, 3]]  # ranks 1 and 3 share y=1
    assert results[0].tolist() == [[0, 0], [2, 2]]


def test_all_reduce_sums_in_group_order_bit_for_bit() -> None:
    values = [np.float32(1e8), np.float32(1.0), np.float32(-1e8), np.float32(1.0)]
    results = _run_ranks(4, lambda c: c.all_reduce(np.array([values[c.rank]]), (0, 1, 2, 3)))
    expected = sum_pieces([np.array([v]) for v in values])
    assert all(r.tobytes() == expected.tobytes() for r in results)


def test_a_failing_rank_stops_the_others() -> None:
    def body(c: LocalCommunicator) -> np.ndarray:
        if c.rank == 1:
            raise ValueError("boom")
        return c.all_reduce(np.ones(2), (0, 1))

    results = _run_ranks(2, body)
    assert isinstance(results[1], ValueError)
    assert isinstance(results[0], RuntimeBackendError) and "boom" in str(results[0])


def test_collective_timeout_names_the_missing_rank() -> None:
    board = Board(2, timeout=0.2)
    with pytest.raises(RuntimeBackendError, match=r"ranks \[1\]"):
        LocalCommunicator(0, board).all_reduce(np.ones(1), (0, 1))


def test_compare_outputs() -> None:
    ref = {"y": np.array([1.0, 2.0, 4.0], np.float32)}
    assert compare_outputs(ref, {"y": ref["y"] * (1 + 1e-6)}).passed
    result = compare_outputs(ref, {"y": np.array([1.0, 2.0, 4.1], np.float32)})
    assert not result.passed and result.worst.index == (2,)
    assert "expected 4" in result.describe()
    assert not compare_outputs({"i": np.array([1, 2])}, {"i": np.array([1, 3])}).passed


def test_random_inputs_are_deterministic() -> None:
    specs = {"x": {"shape": [2, 3], "dtype": "float32"}, "ids": {"shape": [4], "dtype": "int64"}}
    a, b = random_inputs(specs, 3, {"ids": 5}), random_inputs(specs, 3, {"ids": 5})
    assert np.array_equal(a["x"], b["x"]) and a["ids"].max() < 5


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no plan.json"),
        ("{not json", "unreadable"),
        (json.dumps({"format_version": 99}), "format version"),
    ],
)
def test_plan_dir_validation(tmp_path: Path, content: str | None, needle: str) -> None:
    if content is not None:
        (tmp_path / "plan.json").write_text(content)
    with pytest.raises(PlanError, match=needle):
        load_plan_dir(tmp_path)


def test_mesh_groups() -> None:
    mesh = Mesh(("dp", "tp"), (2, 4))
    assert mesh.coords(6) == (1, 2) and mesh.rank_of((1, 2)) == 6
    assert mesh.group(6, "tp") == (4, 5, 6, 7) and mesh.group(6, "dp") == (2, 6)
    assert sorted(r for g in mesh.groups("dp") for r in g) == list(range(8))


def _pieces(world: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    rngs = [np.random.default_rng(r) for r in range(world)]
    return [(g.standard_normal(shape) * 10.0 ** g.integers(-3, 8, size=shape)).astype(np.float32) for g in rngs]


def test_reduce_scatter_is_a_chunk_of_the_group_order_sum() -> None:
    pieces = _pieces(4, (8, 3))
    results = _run_ranks(4, lambda c: c.reduce_scatter(pieces[c.rank], (0, 1, 2, 3), 0))
    total = sum_pieces(pieces)
    for rank, got in enumerate(results):
        assert got.tobytes() == total[2 * rank : 2 * rank + 2].tobytes()
        assert got.tobytes() == reduce_scatter_pieces(pieces, rank, 0).tobytes()


def test_all_to_all_moves_the_shard_dimension() -> None:
    """Shard(0) -> Shard(1): every rank sends its i-th chunk along dim 1 to rank i, which stacks them on dim 0."""
    full = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    rows = np.split(full, 2, axis=0)  # rank r holds rows of S(0)
    results = _run_ranks(2, lambda c: c.all_to_all(rows[c.rank], (0, 1), 1, 0))
    cols = np.split(full, 2, axis=1)
    assert [r.tolist() for r in results] == [c.tolist() for c in cols]
    assert results[1].tobytes() == all_to_all_pieces(rows, 1, 1, 0).tobytes()


def test_send_and_recv() -> None:
    def body(c: LocalCommunicator) -> np.ndarray:
        if c.rank == 0:
            c.send(np.arange(3), 1, tag=5)
            return c.recv(1, tag=6)
        got = c.recv(0, tag=5)
        c.send(got * 2, 0, tag=6)
        return got

    results = _run_ranks(2, body)
    assert results[0].tolist() == [0, 2, 4] and results[1].tolist() == [0, 1, 2]


def test_recv_timeout_names_the_sender() -> None:
    board = Board(2, timeout=0.2)
    with pytest.raises(RuntimeBackendError, match="waiting for rank 1"):
        LocalCommunicator(0, board).recv(1)


def _collective(kind: str, **fields: int) -> CollectiveRecord:
    return CollectiveRecord(3, kind, "x", ((0, 1),), "a", "b", 0, **fields)


def test_plan_collective_kinds() -> None:
    pieces = _pieces(2, (4, 2))
    gather = _run_ranks(2, lambda c: run_collective(c, _collective("all_gather", dim=1), pieces[c.rank], (0, 1)))
    assert gather[0].shape == (4, 4)
    scatter = _run_ranks(2, lambda c: run_collective(c, _collective("reduce_scatter", dim=0), pieces[c.rank], (0, 1)))
    assert scatter[1].tobytes() == sum_pieces(pieces)[2:].tobytes()
    with pytest.raises(PlanError, match="'all_gather' without its fields"):
        run_collective(LocalCommunicator(0, Board(1, 1)), _collective("all_gather"), pieces[0], (0,))


def test_plan_json_with_an_unknown_collective_is_one_error(tmp_path: Path) -> None:
    """An unknown collective or a mistyped field is refused when plan.json loads, naming the field."""
    meta = {
        "format_version": PLAN_FORMAT_VERSION,
        "model": {"name": "m", "inputs": {"x": {"shape": [2], "dtype": "float32"}}, "outputs": ["y"]},
        "mesh": {"axes": ["x"], "sizes": [1], "ranks": [{"rank": 0}]},
        "files": ["device_0.onnx"],
        "collectives": [
            {"id": 3, "kind": "broadcast", "axis": "x", "groups": [[0]], "src": "a", "dst": "b", "stage": 0}
        ],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(meta))
    with pytest.raises(PlanError, match=r"'collectives\[0\]\.kind': unknown collective 'broadcast'"):
        read_run_record(path)
    meta["collectives"][0].update(kind="all_gather", dim="1")
    path.write_text(json.dumps(meta))
    with pytest.raises(PlanError, match=r"'collectives\[0\]\.dim'"):
        read_run_record(path)
    meta["collectives"][0].update(dim=1)
    path.write_text(json.dumps(meta))
    assert read_run_record(path).collectives[0].dim == 1


def test_uneven_split_is_an_error() -> None:
    with pytest.raises(RuntimeBackendError, match="equal chunks"):
        runtime.split_chunks(np.ones((3, 2)), 2, 0)


# --- devices ------------------------------------------------------------------------------------------------


def test_ranks_share_the_cuda_devices_round_robin() -> None:
    """One rank per GPU gets its own; more ranks than GPUs share them (the local backend runs every rank in
    one process on a one-GPU machine) instead of falling back to the CPU."""
    assert [cuda_device_for(rank, 1) for rank in range(4)] == [0, 0, 0, 0]
    assert [cuda_device_for(rank, 4) for rank in range(4)] == [0, 1, 2, 3]
    assert [cuda_device_for(rank, 2) for rank in range(5)] == [0, 1, 0, 1, 0]


def test_cuda_providers_keep_float32_exact() -> None:
    """onnxruntime runs float32 MatMul in TF32 unless told not to: 2.4e-4 relative error on an H100."""
    cuda, cpu = cuda_providers(2)
    assert cuda == ("CUDAExecutionProvider", {"device_id": 2, "use_tf32": 0}) and cpu == "CPUExecutionProvider"


def test_run_and_check_on_cuda_where_there_is_one(examples: Path, tmp_path: Path) -> None:
    """Where onnxruntime can use CUDA: every rank of a 4-device plan runs on a GPU (sharing them when there are
    fewer), stdout carries only the outputs, and `check --device cuda` matches the model at the default
    tolerance."""
    import subprocess
    import sys

    from unity_eq import optimize

    if runtime.cuda_device_count() == 0:
        pytest.skip(f"no usable CUDA device here ({runtime.cuda_problem(0)})")
    optimize(examples / "transformer.onnx", devices=4, output_dir=tmp_path / "plan")
    base = [sys.executable, "-m", "unity_eq.cli"]
    run = subprocess.run([*base, "run", str(tmp_path / "plan"), "--device", "cuda"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1].startswith("Y: float32[8, 128, 256]"), run.stdout
    assert "CPU" not in run.stderr and "EP Error" not in run.stdout + run.stderr and "[W:" not in run.stderr
    check = [*base, "check", str(examples / "transformer.onnx"), str(tmp_path / "plan"), "--device", "cuda"]
    proc = subprocess.run(check, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cuda_probe_here_names_the_reason_without_onnxruntime_noise(capfd: pytest.CaptureFixture[str]) -> None:
    problem = runtime.cuda_problem(0)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    if problem is None:
        pytest.skip("this machine has a usable CUDA device")
    assert "\n" not in problem and problem


def test_device_messages() -> None:
    cpu = DeviceChoice(["CPUExecutionProvider"], "CPU", "CUDA is not usable (x); running on the CPU")
    assert device_notes([cpu, cpu]) == ["CUDA is not usable (x); running on the CPU"]
    gpu = DeviceChoice([], "CUDA:0")
    assert device_notes([gpu, cpu]) == ["ranks [1]: CUDA is not usable (x); running on the CPU"]
    assert describe_devices([gpu, cpu], ["a", "b"]) == "ranks run on 0→CUDA:0@a, 1→CPU@b"
    with pytest.raises(RuntimeBackendError, match="cpu, cuda or auto"):
        choose_device("tpu", 0)


def test_run_device_cuda_falls_back_to_the_cpu_with_one_message(examples: Path, tmp_path: Path) -> None:
    """`--device cuda` where onnxruntime cannot use CUDA: one clear line, a CPU run, exit 0."""
    import subprocess
    import sys

    from unity_eq import optimize

    if runtime.cuda_problem(0) is None:
        pytest.skip("this machine has a usable CUDA device")
    optimize(examples / "mlp.onnx", devices=2, output_dir=tmp_path / "plan")
    command = [sys.executable, "-m", "unity_eq.cli", "run", str(tmp_path / "plan"), "--device", "cuda"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Y: float32[8, 128, 256]" in proc.stdout
    cuda_lines = [line for line in proc.stderr.splitlines() if "CUDA" in line]
    assert len(cuda_lines) == 1 and cuda_lines[0].endswith("running on the CPU"), proc.stderr
    assert "[E:" not in proc.stderr and "[W:" not in proc.stderr and "Traceback" not in proc.stderr
    # `check` says it too (it fell back silently before issue 26's audit)
    command = [sys.executable, "-m", "unity_eq.cli", "check", str(examples / "mlp.onnx"), str(tmp_path / "plan")]
    proc = subprocess.run([*command, "--device", "cuda"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    cuda_lines = [line for line in proc.stderr.splitlines() if "CUDA" in line]
    assert len(cuda_lines) == 1 and cuda_lines[0].endswith("running on the CPU"), proc.stderr


def test_chained_collectives_lower_and_run(tmp_path: Path) -> None:
    """An all-gather of an all-gather's result (as plans priced by measured times contain): the second
    collective's source is the first one's result, a graph input of the device model."""
    from unity_eq.cost import ZERO
    from unity_eq.ir import Graph, Shard, TensorType
    from unity_eq.ir import Replicate as R
    from unity_eq.lower import lower, write_plan_dir
    from unity_eq.machine import default_machine
    from unity_eq.plan import AllGather, LoadInput, Plan, PlanTensor, Slice

    mesh = Mesh(("x", "y"), (2, 2))
    tensors = {
        "X": PlanTensor("X", (4, 4), "float32", (R(), R()), "X"),
        "a": PlanTensor("a", (4, 4), "float32", (Shard(0), R())),
        "b": PlanTensor("b", (4, 4), "float32", (Shard(0), Shard(1))),
        "c": PlanTensor("c", (4, 4), "float32", (Shard(0), R())),
        "d": PlanTensor("d", (4, 4), "float32", (R(), R())),
    }
    steps = [
        LoadInput("X", "X"),
        Slice("a", "X", 0, "x"),
        Slice("b", "a", 1, "y"),
        AllGather("c", "b", 1, "y"),
        AllGather("d", "c", 0, "x"),
    ]
    plan = Plan("chain", mesh, default_machine(4), "inference", tensors, steps, ["X"], {"Y": "d"}, ZERO)
    types = {"X": TensorType((4, 4), "float32"), "Y": TensorType((4, 4), "float32")}
    graph = Graph("chain", {"X": types["X"]}, ["Y"], [], {}, types, 18)
    write_plan_dir(lower(plan, graph), tmp_path / "plan")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert run_plan(tmp_path / "plan", {"X": x})["Y"].tolist() == x.tolist()


def test_run_outputs_path_errors_are_one_line(examples: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from unity_eq import optimize

    optimize(examples / "mlp.onnx", devices=2, output_dir=tmp_path / "plan")
    target = tmp_path / "missing" / "out.npz"
    command = [sys.executable, "-m", "unity_eq.cli", "run", str(tmp_path / "plan"), "--outputs", str(target)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        f"error: `--outputs` {target}: expected a file in an existing directory; {target.parent} does not exist."
    ]


# --- the mpi backend's decisions that need no MPI -----------------------------------------------------------


def test_mpi_outcome_names_the_failing_rank() -> None:
    from unity_eq.runtime.mpi_status import RankStatus, outcome

    ok = RankStatus(0, 1, True)
    boom = RankStatus(2, 1, False, "ValueError: boom", exit_code=2)
    stopped = RankStatus(1, 1, False, "stopped in all_reduce #3 because rank 2 failed", primary=False)
    assert outcome({0: ok, 1: ok}, [], 5) is None
    error = outcome({0: ok, 1: stopped, 2: boom}, [], 5)
    assert error is not None and str(error) == "rank 2: ValueError: boom"
    same = [RankStatus(r, 0, False, "world size: …", exit_code=2) for r in range(3)]
    assert str(outcome(dict(enumerate(same)), [], 5)) == "world size: …"
    hung = outcome({0: RankStatus(0, 1, False, "all_gather #1 did not complete within 5 s", primary=False)}, [1], 5)
    assert str(hung).startswith("rank 1 did not answer within 5 s (hung") and "rank 0: all_gather #1" in str(hung)
    two = outcome({0: boom, 1: RankStatus(1, 1, False, "KeyError: 'x'", exit_code=2)}, [], 5)
    assert str(two) == "rank 1: KeyError: 'x' (rank 2 failed too)"  # the lowest failing rank first


def test_mpi_backend_without_mpi4py_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from unity_eq.runtime.mpi_supervisor import import_mpi

    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(RuntimeBackendError, match=r"pip install 'unity-eq\[mpi\]'"):
        import_mpi()
