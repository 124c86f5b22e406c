"""Runtime pieces: the in-process communicator, segmenting, comparisons, plan-directory validation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from unity_eq.errors import PlanError, RuntimeBackendError
from unity_eq.ir import Mesh
from unity_eq.runtime import (
    LocalCommunicator,
    _Board,
    compare_outputs,
    load_plan_dir,
    random_inputs,
    sum_pieces,
)


def _run_ranks(world: int, body) -> list:  # type: ignore[no-untyped-def]
    board = _Board(world, timeout=10)
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
    board = _Board(2, timeout=0.2)
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
