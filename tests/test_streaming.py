"""Weights are streamed: writing a plan holds one tensor at a time, `run` and `check` hold no copies.

The memory tests measure whole commands in fresh processes (``big_models.peak_rss_bytes``) on a 128 MiB MLP
with external data, against the same commands on a tiny MLP of the same structure (the interpreter and
libraries: the floor). Before streaming, `optimize` grew ~10 × one rank's weights above the floor and `run`
~2.5 × the plan's weights (benchmarks/results/memory.json, 1 GiB model). ``benchmarks/memory.py`` measures
the 1 GiB case.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from big_models import MlpModel, Peak, peak_rss_bytes, write_external_fanout, write_external_mlp
from onnx import numpy_helper

from unity_eq import optimize
from unity_eq.cli import main
from unity_eq.errors import PlanError
from unity_eq.lower import EXTERNAL_DATA_BYTES
from unity_eq.runtime import check, random_inputs, run_plan
from unity_eq.weightfile import release_pages

MIB = 1 << 20
DEVICES = 4
# 2 × (2048→4096, 4096→2048) float32 = 4 weights of 32 MiB; split 4 ways, 32 MiB per rank (streamed: > 16 MiB).
BIG = {"hidden": 2048, "ffn": 4096, "pairs": 2}
TINY = {"hidden": 64, "ffn": 128, "pairs": 2}


@dataclass
class Measured:
    model: MlpModel
    plan: Path
    optimize: Peak
    tiny_model: MlpModel
    tiny_plan: Path
    tiny_optimize: Peak

    @property
    def weight_bytes_per_rank(self) -> list[int]:
        return list(json.loads((self.plan / "plan.json").read_text())["memory"]["weight_bytes_per_rank"])


def _optimize_args(model: Path, plan: Path) -> list[str]:
    return ["optimize", str(model), "--devices", str(DEVICES), "--mesh", str(DEVICES), "-o", str(plan), "-q"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Measured:
    root = tmp_path_factory.mktemp("streaming")
    tiny = write_external_mlp(root / "tiny", **TINY)
    tiny_peak = peak_rss_bytes(_optimize_args(tiny.path, root / "tiny.plan"))
    big = write_external_mlp(root / "big", **BIG)
    big_peak = peak_rss_bytes(_optimize_args(big.path, root / "big.plan"))
    return Measured(big, root / "big.plan", big_peak, tiny, root / "tiny.plan", tiny_peak)


def test_a_large_plan_is_written_as_a_small_model_and_a_weight_file_per_rank(measured: Measured) -> None:
    ranks = measured.weight_bytes_per_rank
    assert len(ranks) == DEVICES and min(ranks) > EXTERNAL_DATA_BYTES  # the case under test: streamed ranks
    for rank, nbytes in enumerate(ranks):
        assert (measured.plan / f"device_{rank}.onnx").stat().st_size < MIB
        assert (measured.plan / f"device_{rank}.onnx.data").stat().st_size >= nbytes
    assert not list(measured.tiny_plan.glob("*.data"))  # small ranks stay one self-contained file


def test_writing_a_plan_holds_about_one_tensor_not_the_ranks(measured: Measured) -> None:
    """Reading, hashing, slicing and writing 128 MiB of weights into 4 ranks of 32 MiB: the peak above the
    floor stays under two tensors (the source tensor being read and the slice being written), where holding
    a rank's model in memory and serializing it (as before) costs several ranks."""
    growth = measured.optimize.self_bytes - measured.tiny_optimize.self_bytes
    bound = 2 * measured.model.largest_tensor_bytes
    assert growth < bound, f"optimize grew {growth / MIB:.0f} MiB above the floor; bound {bound / MIB:.0f} MiB"


def test_run_and_check_hold_the_weights_once(measured: Measured) -> None:
    """onnxruntime reads external weights from the plan folder: `run` holds each rank's weights once (in
    onnxruntime), not also as protos and serialized bytes; `check` closes the original model before the plan
    loads, so it holds one of the two at a time."""
    plan_bytes = sum(measured.weight_bytes_per_rank)
    run = peak_rss_bytes(["run", str(measured.plan)]).self_bytes
    run_floor = peak_rss_bytes(["run", str(measured.tiny_plan)]).self_bytes
    assert run - run_floor < 1.5 * plan_bytes, f"run grew {(run - run_floor) / MIB:.0f} MiB"
    checked = peak_rss_bytes(["check", str(measured.model.path), str(measured.plan)]).self_bytes
    check_floor = peak_rss_bytes(["check", str(measured.tiny_model.path), str(measured.tiny_plan)]).self_bytes
    held = max(plan_bytes, measured.model.weight_bytes)
    assert checked - check_floor < 1.5 * held, f"check grew {(checked - check_floor) / MIB:.0f} MiB"


@pytest.mark.parametrize("kind", ["mlp", "fanout"])
def test_streamed_plan_equals_the_in_memory_one_bit_for_bit(tmp_path: Path, kind: str) -> None:
    """The streamed files hold the same weights as the in-memory build (``LoweredPlan.build_rank``), and
    running them gives the same outputs bit for bit: for sliced weights (the MLP: column and row pieces)
    and for a weight lowering computes (the fan-out's three projections merged into one MatMul over their
    Concat, made only when written)."""
    if kind == "mlp":
        model = write_external_mlp(tmp_path / "model", hidden=1024, ffn=8192, pairs=1)  # 2 × 32 MiB
        inputs = {"x": {"shape": [8, 1024], "dtype": "float32"}}
    else:
        model = write_external_fanout(tmp_path / "model", hidden=2048, width=2048, branches=3)  # 3 × 16 MiB
        inputs = {"x": {"shape": [8, 2048], "dtype": "float32"}}
    streamed = tmp_path / "streamed"
    result = optimize(model.path, devices=2, mesh="2", output_dir=streamed)
    assert result.lowered is not None
    embedded = tmp_path / "embedded"
    embedded.mkdir()
    shutil.copy(streamed / "plan.json", embedded / "plan.json")
    for rank in range(2):
        in_memory = result.lowered.build_rank(rank)[0]
        onnx.save_model(in_memory, embedded / f"device_{rank}.onnx")
        written = onnx.load(str(streamed / f"device_{rank}.onnx"))  # loads device_<rank>.onnx.data
        pointers = onnx.load(str(streamed / f"device_{rank}.onnx"), load_external_data=False).graph.initializer
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in pointers)  # streamed, not embedded
        expected = {t.name: numpy_helper.to_array(t) for t in in_memory.graph.initializer}
        got = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
        assert expected.keys() == got.keys()
        for name, value in expected.items():
            assert value.dtype == got[name].dtype and value.tobytes() == got[name].tobytes(), name
        if kind == "fanout":  # the case under test: one weight wider than any source weight, i.e. a Concat
            assert max(t.dims[-1] for t in pointers if len(t.dims) == 2) > 2048
    feeds = random_inputs(inputs, seed=3)
    a, b = run_plan(streamed, feeds), run_plan(embedded, feeds)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert np.abs(a["y" if kind == "mlp" else "y0"]).max() > 0  # a real result, not an empty or zero one
    assert check(model.path, streamed).passed  # and the original model's


@pytest.mark.parametrize("damage", ["elsewhere", "missing", "short"])
def test_run_refuses_weights_outside_the_ranks_own_file(
    measured: Measured, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(measured.plan, plan, copy_function=os.link)  # hard links: the 128 MiB are not copied
    device = plan / "device_1.onnx"
    if damage == "missing":
        (plan / "device_1.onnx.data").unlink()
        expected = "weight file device_1.onnx.data is missing"
    elif damage == "short":
        data = plan / "device_1.onnx.data"
        data.unlink()
        data.write_bytes((measured.plan / data.name).read_bytes()[: 5 * MIB])  # an interrupted copy
        expected = "is cut short"
    else:
        model = onnx.load(str(device), load_external_data=False)
        tensor = next(t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
        next(e for e in tensor.external_data if e.key == "location").value = "../big/model.onnx.data"
        device.unlink()  # a new file, not the fixture's hard-linked one
        onnx.save_model(model, device)
        expected = "is stored in '../big/model.onnx.data'"
    assert main(["run", str(plan)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "device_1.onnx" in lines[0] and expected in lines[0], lines


def test_run_refuses_a_weight_file_of_another_rank_or_another_plan(tmp_path: Path) -> None:
    """A data file carries its plan hash and rank in a header no tensor points at: a copy of another rank's
    file (same size: equal shards) or of the same rank of another plan (same model structure, other weights)
    loads fine in onnxruntime and computes garbage, so `run` refuses it, naming the file."""
    plans = []
    for seed in (0, 1):
        model = write_external_mlp(tmp_path / f"model{seed}", hidden=1024, ffn=8192, pairs=1, seed=seed)
        plans.append(tmp_path / f"plan{seed}")
        optimize(model.path, devices=2, mesh="2", output_dir=plans[-1])
    first, other = plans
    ours = [(first / f"device_{r}.onnx.data").read_bytes() for r in range(2)]
    assert len(ours[0]) == len(ours[1]) == (other / "device_1.onnx.data").stat().st_size  # only the header tells
    for source, expected in (
        (first / "device_0.onnx.data", "holds the weights of rank 0, expected rank 1"),
        (other / "device_1.onnx.data", "holds the weights of another plan"),
    ):
        (first / "device_1.onnx.data").write_bytes(source.read_bytes())
        with pytest.raises(PlanError, match=expected) as raised:
            run_plan(first, random_inputs({"x": {"shape": [8, 1024], "dtype": "float32"}}, seed=0))
        assert "device_1.onnx.data" in str(raised.value)
    (first / "device_1.onnx.data").write_bytes(ours[1])
    assert run_plan(first, random_inputs({"x": {"shape": [8, 1024], "dtype": "float32"}}, seed=0))


def _resident_file_bytes() -> int:
    with Path("/proc/self/status").open() as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssFile:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc/self/status")
def test_release_pages_gives_a_read_weight_back_and_keeps_its_values(tmp_path: Path) -> None:
    """Reading a memory-mapped weight makes it resident; ``release_pages`` drops it from this process (the
    values stay readable); a copy-on-write map is left alone, since dropping its pages would lose edits."""
    values = np.arange(16 * MIB // 4, dtype=np.float32)
    values.tofile(tmp_path / "w.bin")
    weight = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="r", shape=values.shape)
    before = _resident_file_bytes()
    assert float(weight.sum(dtype=np.float64)) == float(values.sum(dtype=np.float64))  # reads every page
    read = _resident_file_bytes()
    assert read - before > 12 * MIB
    release_pages(weight[3:])  # a view, as lowering holds them
    assert read - _resident_file_bytes() > 12 * MIB
    assert weight[-1] == values[-1]
    edited = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="c", shape=values.shape)
    edited[0] = -1.0
    release_pages(edited)
    assert edited[0] == -1.0
