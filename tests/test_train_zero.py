"""ZeRO 1-3 and recomputation (unity_eq.train.zero, unity_eq.train.recompute): each against plain data-parallel
training on gloo (2 and 3 CPU processes, a small torch module, microbatches accumulated), counting the
collectives the stage search prices; then `check --training` of the bundled transformer's data-parallel plan
with each ZeRO level and recomputation set by hand, against one-device training."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from conftest import EXAMPLES, run_cli, torchrun  # noqa: E402

from unity_eq.collectives import torch_autograd as coll  # noqa: E402
from unity_eq.errors import OptionError  # noqa: E402
from unity_eq.train.check import TrainingCheck, check_training, free_port, init_rank  # noqa: E402
from unity_eq.train.checkpoint import read_checkpoint, write_checkpoint  # noqa: E402
from unity_eq.train.recompute import Recomputed, checkpointed_sequence  # noqa: E402
from unity_eq.train.zero import Zero3Module, ZeroOptimizer, zero_collectives  # noqa: E402


class _Net(torch.nn.Module):
    """Two layers, one of them float64 (two dtype buckets), 6*8+8+8*3 = 80 float32 and 3 float64 elements (not
    a multiple of 3: the flat buffer is padded), each read by the backward (ZeRO-3 gathers both again); the
    second layer's weight is used twice (a tied weight)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(6, 8, generator=gen))
        self.b1 = torch.nn.Parameter(torch.randn(8, generator=gen))
        self.w2 = torch.nn.Parameter(torch.randn(8, 3, generator=gen))
        self.b2 = torch.nn.Parameter(torch.randn(3, generator=gen, dtype=torch.float64))
        self.calls = 0  # forwards run: a recomputed one runs again in the backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = torch.tanh(x @ self.w1 + self.b1)
        y = (h @ self.w2).double() * self.b2  # b2 saved for the backward
        return (y**2).mean() + 0.1 * (self.w2**2).sum() / 4  # the tie: w2 read again, outside the data


def _batch(rank: int, micro: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(100 * rank + micro).standard_normal((5, 6)).astype(np.float32))


def _train(rank: int, world: int, how: str, level: int, steps: int, micro: int) -> dict[str, Any]:
    """``steps`` AdamW steps of ``micro`` accumulated microbatches on this rank's data, plain data parallel
    (``how="dp"``: each gradient all-reduced through the plan's replicate op) or with ZeRO ``level`` /
    recomputation (``how="zero"``, ``"recompute"``, ``"zero+recompute"``; ``"unordered"``: ZeRO with torch's
    reduce-scatter, as on NCCL)."""
    ledger = coll.Ledger()
    ordered = "unordered" not in how  # unordered: torch's reduce-scatter (NCCL's path), not the group-order sum
    group = coll.AxisGroup("d", tuple(range(world)), rank, dist.new_group(list(range(world))), ledger, ordered)
    net = _Net()
    recompute = "recompute" in how
    module: torch.nn.Module = net
    if level == 3:
        module = Zero3Module(net, group, recompute=recompute)
    elif recompute:
        module = Recomputed(net, ledger)

    def make(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=0.05)

    opt: Any = make(module.parameters()) if level in (0, 3) else ZeroOptimizer(net.parameters(), group, level, make)
    losses, rows = [], []
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            loss = module(_batch(rank, m)) / (world * micro)
            loss.backward()
            losses.append(float(loss))
        if level == 0:  # plain data parallel: the plan's gradient all-reduce of each weight
            for p in net.parameters():
                p.grad = coll._sum(p.grad, group, coll.GRADIENT)
        if step == 0:
            if level == 0:
                grads = [p.grad.clone() for p in net.parameters()]
            else:  # gathered back from the shards (a diagnostic, not counted)
                grads = [g.clone() for g in (module if level == 3 else opt).full_gradients()]
        opt.step()
        if step == 0:
            rows = ledger.as_rows()
    weights = module.full_weights() if level == 3 else [p.detach().clone() for p in net.parameters()]
    return {"losses": losses, "grads": grads, "weights": weights, "ledger": rows, "calls": net.calls}


def _rank(rank: int, world: int, port: int, out: str, runs: list[tuple[str, int]]) -> None:
    init_rank(rank, world, port)
    results = {run: _train(rank, world, run[0], run[1], steps=3, micro=2) for run in runs}
    torch.save(results, Path(out) / f"{rank}.pt")
    dist.destroy_process_group()


def _spawn(world: int, runs: list[tuple[str, int]]) -> list[dict[Any, Any]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(world, free_port(), out, runs), nprocs=world, start_method="fork")
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]


RUNS = [("dp", 0), ("zero", 1), ("zero", 2), ("zero", 3), ("recompute", 0), ("zero+recompute", 3), ("unordered", 2)]


@pytest.fixture(scope="module", params=[2, 3])
def trained(request: pytest.FixtureRequest) -> tuple[int, list[dict[Any, Any]]]:
    return request.param, _spawn(request.param, RUNS)


@pytest.mark.parametrize("run", RUNS[1:], ids=lambda r: f"{r[0]}-{r[1]}")
def test_zero_and_recompute_train_as_plain_data_parallel(
    trained: tuple[int, list[dict[Any, Any]]], run: tuple[str, int]
) -> None:
    """Same losses, summed gradients and AdamW weights after 3 steps of 2 microbatches as the all-reduce, on
    every rank; float32 rounding apart (ZeRO-2 and -3 sum each microbatch's gradients over the group before
    adding the microbatches, plain data parallel the other way round)."""
    _world, ranks = trained
    for rank in ranks:
        want, got = rank[("dp", 0)], rank[run]
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-6)
        for g, w in zip(got["grads"], want["grads"], strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
        for g, w in zip(got["weights"], want["weights"], strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    assert ranks[0][run]["calls"] == (12 if "recompute" in run[0] else 6)  # 3 steps of 2 microbatches, run again
    for name in ("weights",):  # the replicas agree bit for bit
        for rank in ranks[1:]:
            for g, w in zip(rank[run][name], ranks[0][run][name], strict=True):
                assert torch.equal(g, w)


def test_zero_1_sums_the_gradients_bit_for_bit_as_plain_data_parallel(
    trained: tuple[int, list[dict[Any, Any]]],
) -> None:
    """ZeRO-1 accumulates the microbatches, then sums the same gradients in the same (group) order as the
    all-reduce: the summed gradients are equal bits, and so are the AdamW weights after 3 steps (the optimizer's
    arithmetic is elementwise, on a flat shard or on each parameter alike)."""
    _world, ranks = trained
    for rank in ranks:
        for name in ("grads", "weights"):
            for g, w in zip(rank[("zero", 1)][name], rank[("dp", 0)][name], strict=True):
                assert torch.equal(g, w), name


@pytest.mark.parametrize("run", RUNS[1:], ids=lambda r: f"{r[0]}-{r[1]}")
def test_the_collectives_are_the_ones_the_stage_search_prices(
    trained: tuple[int, list[dict[Any, Any]]], run: tuple[str, int]
) -> None:
    """Per step of 2 microbatches: the cost model's ZeRO terms (zero_collectives) for the ZeRO level, and a
    recomputed forward issues nothing here (the module has no collectives of its own)."""
    _world, ranks = trained
    net = _Net()
    buckets = [4 * (6 * 8 + 8 + 8 * 3), 8 * 3]
    assert sum(p.numel() * p.element_size() for p in net.parameters()) == sum(buckets)
    want = zero_collectives(run[1], "d", buckets, microbatches=2)
    if run[1] == 0:  # recomputation alone: plain data parallel's all-reduce of each of the 4 weights' gradients
        want = {("all_reduce", "d", "gradient"): [4, sum(buckets)]}
    for rank in ranks:
        got = {(k, a, p): [c, b] for k, a, p, c, b in rank[run]["ledger"]}
        assert got == want


# --- plans: `check --training` with ZeRO and recomputation set by hand (SPMD plans choose neither) -------------
@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The transformer data parallel on 4 devices (axis x), the MLP on a 2x2 mesh (one tensor axis, one data
    axis: :func:`_data_and_tensor_axes`)."""
    out = tmp_path_factory.mktemp("zero-plans")
    made = {}
    for name, model, mesh in [("tf4", "transformer", "4"), ("mlp22", "mlp", "2x2")]:
        result = run_cli("optimize", str(EXAMPLES / f"{model}.onnx"), "--objective", "training", "--devices", "4",
                         "--mesh", mesh, "-o", str(out / name), "-q")  # fmt: skip
        assert result.returncode == 0, result.stderr
        made[name] = out / name
    return made


def _data_and_tensor_axes(plan: Path) -> tuple[str, str]:
    """The 2 x 2 MLP plan's data axis (the weights replicated over it) and tensor axis (a weight partitioned
    over it): the two axes are alike, so which one the extraction makes which is a tie the cost model breaks."""
    record = json.loads((plan / "plan.json").read_text())
    weights = {s["out"] for s in record["steps"] if s["kind"] == "weight"}
    tensor = next(s["axis"] for s in record["steps"] if s["kind"] == "partition" and s["src"] in weights)
    return next(a for a in record["mesh"]["axes"] if a != tensor), tensor


def _lines(result: TrainingCheck) -> dict[str, bool]:
    return {text: ok for ok, text in result.lines}


@pytest.mark.parametrize(("zero", "recompute"), [(1, False), (0, True), (3, True)])
def test_check_training_a_data_parallel_transformer_with_zero_and_recomputation(
    plans: dict[str, Path], zero: int, recompute: bool
) -> None:
    """Loss, every gradient and the AdamW weights after 2 steps match one device; the weights' gradient
    all-reduces on x (without ZeRO 2: the 13 weights in one 25 MiB bucket, and q/k/v's concatenation, computed
    from weights, in autograd; plan.json prices the 14 one by one) are replaced by ZeRO's reduce-scatter and
    all-gather(s) of the same 3159040 bytes; recomputation issues the forward's all-gather again."""
    result = check_training(EXAMPLES / "transformer.onnx", plans["tf4"], None, steps=2, optimizer="adamw", lr=1e-3,
                            loss="mean", zero=zero, recompute=recompute)  # fmt: skip
    assert result.passed, result.first_failure()
    lines = _lines(result)
    w = 3159040  # bytes of the transformer's weights
    assert any(t.startswith("gradient of 'attn.q.weight'") for t in lines)
    if zero == 0:
        assert _counted("all_reduce on axis x (gradient)", 2, w) in lines
    else:
        assert not any("all_reduce on axis x (gradient)" in t for t in lines)
        assert _counted("reduce_scatter on axis x (gradient)", 1, w) in lines
    if zero == 3:  # the forward's own all-gather of an activation, and ZeRO-3's of the weights; again in the backward
        assert _counted("all_gather on axis x (forward)", 2, w + 1048576) in lines
        assert _counted("all_gather on axis x (backward)", 1, w) in lines
    if zero == 1:
        assert _counted("all_gather on axis x (gradient)", 1, w) in lines
    if recompute:
        assert _counted("all_gather on axis x (recompute)", 1, 1048576) in lines


def _counted(what: str, count: int, nbytes: int) -> str:
    """check's line for a collective issued as plan.json prices it."""
    return f"collectives {what}, rank 0: issued {count} ({nbytes} bytes), plan.json prices {count} ({nbytes} bytes)"


def test_zero_over_the_data_axis_of_a_2x2_mesh_and_not_over_the_tensor_axis(plans: dict[str, Path]) -> None:
    """ZeRO-2 over the data axis (the batch is split there, the weights replicated) trains as one device; over
    the tensor axis (fc1 and fc2 sharded, each rank's gradient is its own shard's) a reduce-scatter would sum
    different weights' gradients: no weight is data-parallel there, and it is refused (unity_eq.train.zero_plan;
    it used to run and fail the check on a gradient)."""
    model = EXAMPLES / "mlp.onnx"
    data, tensor = _data_and_tensor_axes(plans["mlp22"])
    good = check_training(model, plans["mlp22"], None, steps=1, loss="mean", zero=2, zero_axis=data)
    assert good.passed, good.first_failure()
    said = f"collectives reduce_scatter on axis {data} (gradient), rank 0: issued 1"
    assert any(t.startswith(said) for t in _lines(good))
    with pytest.raises(OptionError, match=f"ZeRO-2 on axis '{tensor}': no weight of .* is data-parallel"):
        check_training(model, plans["mlp22"], None, steps=1, loss="mean", zero=2, zero_axis=tensor)


def _pooled_model(path: Path) -> Path:
    """x[64,16,256] + bias, @ encoder.weight, relu, @ Transpose(mixer.weight) (the frontend folds the transpose
    into an initializer), relu, the first token (a Gather of a scalar index), @ head.weight, tanh: a BERT
    pooler's shape, small."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(shape: tuple[int, ...], name: str) -> Any:
        return numpy_helper.from_array((0.05 * rng.standard_normal(shape)).astype(np.float32), name)

    node = helper.make_node
    nodes = [
        node("Add", ["x", "encoder.bias"], ["xb"]),
        node("MatMul", ["xb", "encoder.weight"], ["h"]),
        node("Relu", ["h"], ["r"]),
        node("Transpose", ["mixer.weight"], ["mixer.weight_t"], perm=[1, 0]),
        node("MatMul", ["r", "mixer.weight_t"], ["m"]),
        node("Relu", ["m"], ["mr"]),
        node("Gather", ["mr", "first"], ["cls"], axis=1),
        node("MatMul", ["cls", "head.weight"], ["p"]),
        node("Tanh", ["p"], ["y"]),
    ]
    inits = [weight((256,), "encoder.bias"), weight((256, 256), "encoder.weight"),
             weight((256, 256), "mixer.weight"), weight((256, 256), "head.weight"),
             numpy_helper.from_array(np.array(0, dtype=np.int64), "first")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_zero_shards_only_the_weights_the_plan_sums_over_its_axis(tmp_path: Path) -> None:
    """ZeRO sums each replica's gradient over its axis, which is right for a data-parallel weight only. Here the
    plan reads ``head.weight`` after the batch is gathered (every replica computes its whole gradient: summed
    over 2 replicas it doubled, and `check --training --zero 1` failed on the loss), and trains the folded
    ``Transpose(mixer.weight)`` whose all-reduce plan.json prices at the folded tensor's bytes. ZeRO now shards
    the encoder's weights alone (unity_eq.train.zero_plan); the others keep the plan's all-reduce and a whole
    optimizer state, and every level trains as one device with the collectives plan.json prices. Also the
    scalar Gather index: the torch backend made a 0-d initializer 1-d and the rank crashed."""
    from unity_eq.planfile import CombineStepRecord, ComputeStepRecord
    from unity_eq.train.session import read_training_plan
    from unity_eq.train.torch_ops import tensor_of
    from unity_eq.train.zero_plan import zero_sharding

    assert tensor_of(np.array(3, dtype=np.int64)).shape == ()
    model = _pooled_model(tmp_path / "pooled.onnx")
    plan = tmp_path / "plan"
    made = run_cli("optimize", str(model), "--devices", "4", "--mesh", "2x2", "--objective", "training",
                   "--input-shape", "x=64x16x256", "-o", str(plan), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    record = read_training_plan(plan)
    gathered = {s.out for s in record.steps if isinstance(s, CombineStepRecord)}
    (head,) = [s for s in record.steps if isinstance(s, ComputeStepRecord) and "head.weight" in s.inputs]
    assert set(head.inputs) & gathered, "precondition: the plan reads head.weight after a combine"
    sharding = zero_sharding(record, "x")
    assert sharding.params == {"encoder.weight", "encoder.bias"}
    for level in (1, 2, 3):
        result = check_training(model, plan, None, steps=2, loss="mean", zero=level, zero_axis="x")
        assert result.passed, (level, result.first_failure())
        said = "collectives reduce_scatter on axis x (gradient), rank 0: issued 1 (263168 bytes)"  # 256·257 floats
        assert any(t.startswith(said) for t in _lines(result)), _lines(result)
    # a plan.json without its `weights` section (an older unity-eq's) cannot tell mixer.weight_t from a
    # parameter: ZeRO on it left the folded weight's gradient unsummed (an audit found it); it is refused
    meta = json.loads((plan / "plan.json").read_text())
    del meta["weights"]
    (plan / "plan.json").write_text(json.dumps(meta))
    with pytest.raises(OptionError, match="has no `weights` section"):
        check_training(model, plan, None, steps=1, loss="mean", zero=1, zero_axis="x")


def test_zero_options_are_checked_before_any_rank_starts(plans: dict[str, Path]) -> None:
    model = EXAMPLES / "mlp.onnx"
    with pytest.raises(OptionError, match="ZeRO level: expected one of 0, 1, 2, 3, got 4"):
        check_training(model, plans["mlp22"], None, zero=4, zero_axis="y")
    with pytest.raises(OptionError, match="say which is the data axis"):
        check_training(model, plans["mlp22"], None, zero=1)
    with pytest.raises(OptionError, match="has no axis 'd'"):
        check_training(model, plans["mlp22"], None, zero=1, zero_axis="d")


def _torchrun(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*torchrun(n), "-m", "unity_eq", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)


def test_train_under_torchrun_with_zero_3_loads_and_saves_the_whole_model(
    plans: dict[str, Path], tmp_path: Path
) -> None:
    """`train --zero 3 --recompute`: a checkpoint (random weights) loaded into the shards, one step at learning
    rate 0 and saved (gathered from the shards) is the checkpoint, bit for bit; rank 0 reports ZeRO-3's
    collectives."""
    rng = np.random.default_rng(1)
    shapes = {"fc1.weight": (256, 1024), "fc1.bias": (1024,), "fc2.weight": (1024, 256), "fc2.bias": (256,)}
    first = write_checkpoint(
        tmp_path / "a.pt", {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    )
    second = tmp_path / "b.pt"
    data, _tensor = _data_and_tensor_axes(plans["mlp22"])
    run = _torchrun(4, "train", str(plans["mlp22"]), "--steps", "1", "--loss", "mean", "--zero", "3", "--zero-axis",
                    data, "--recompute", "--lr", "0", "--load", str(first), "--save", str(second))  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"reduce_scatter on axis {data} (gradient): 1 per step" in run.stderr
    assert f"all_gather on axis {data} (backward): 1 per step" in run.stderr
    a, b = read_checkpoint(first), read_checkpoint(second)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_recomputing_segments_keeps_their_inputs_and_gives_the_same_gradients() -> None:
    """checkpointed_sequence: each segment runs again in the backward (once), the gradients are those without
    recomputation, and a segment's collectives would count as ``recompute`` (the ledger's relabel is on only
    while a segment runs again)."""
    ledger = coll.Ledger()
    calls: list[tuple[str, str | None]] = []
    gen = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(4, 4, generator=gen, requires_grad=True), torch.randn(4, 2, generator=gen, requires_grad=True)

    def first(x: torch.Tensor) -> torch.Tensor:
        calls.append(("first", ledger.relabel))
        return torch.tanh(x @ w1)

    def second(x: torch.Tensor) -> torch.Tensor:
        calls.append(("second", ledger.relabel))
        return torch.sin(x @ w2)

    x = torch.randn(3, 4, generator=gen)
    plain = second(first(x)).square().sum()
    want = torch.autograd.grad(plain, (w1, w2))
    calls.clear()
    again = checkpointed_sequence([first, second], x, ledger).square().sum()
    got = torch.autograd.grad(again, (w1, w2))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert calls == [("first", None), ("second", None), ("second", "recompute"), ("first", "recompute")]
    assert ledger.relabel is None
