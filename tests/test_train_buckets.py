"""An SPMD plan's weight-gradient all-reduces in the cost model's buckets (unity_eq.train.buckets.BucketedSync):
issued from hooks while autograd runs a user's own backward, checked on gloo against plain data parallel (each
weight's gradient all-reduced alone) with a tied weight, a weight the backward does not reach and two
microbatches accumulated; then `check --training` of the bundled transformer's plans with small buckets, and
with a bucket dropped."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from conftest import EXAMPLES, run_cli  # noqa: E402

from unity_eq.collectives import torch_autograd as coll  # noqa: E402
from unity_eq.planfile import read_explain_record  # noqa: E402
from unity_eq.train import buckets  # noqa: E402
from unity_eq.train.check import check_training, free_port, init_rank  # noqa: E402
from unity_eq.train.predict import predicted_collectives  # noqa: E402

MODEL = EXAMPLES / "transformer.onnx"


class _Net(torch.nn.Module):
    """w1 [6, 8] (192 bytes), b1 [8] (32), w2 [8, 3] (96, read twice: a tied weight), u [4] (16, read by no
    loss: its gradient never reaches it), b2 [3] float64 (24)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(6, 8, generator=gen))
        self.b1 = torch.nn.Parameter(torch.randn(8, generator=gen))
        self.w2 = torch.nn.Parameter(torch.randn(8, 3, generator=gen))
        self.u = torch.nn.Parameter(torch.randn(4, generator=gen))
        self.b2 = torch.nn.Parameter(torch.randn(3, generator=gen, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.w1 + self.b1)
        y = (h @ self.w2).double() * self.b2
        return (y**2).mean() + 0.1 * (self.w2**2).sum()


def _batch(rank: int, micro: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(100 * rank + micro).standard_normal((5, 6)).astype(np.float32))


def _train(rank: int, world: int, bucketed: bool) -> dict[str, Any]:
    """One step of 2 accumulated microbatches (two backwards) on this rank's data: the gradients summed over
    the ranks by BucketedSync's hooks, or (``bucketed`` False) each weight's accumulated gradient all-reduced
    alone after the backwards."""
    ledger = coll.Ledger()
    group = coll.AxisGroup("d", tuple(range(world)), rank, dist.new_group(list(range(world))), ledger)
    net = _Net()
    params = list(net.parameters())
    if bucketed:
        buckets.BucketedSync(params, {i: ["d"] for i in range(len(params))}, {"d": group})
    for micro in range(2):
        net(_batch(rank, micro)).backward()
    if not bucketed:
        for p in params:
            if p.grad is not None:
                p.grad = coll._sum(p.grad, group, coll.GRADIENT)
    return {"grads": [None if p.grad is None else p.grad.clone() for p in params], "ledger": ledger.as_rows()}


def _rank(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    results = {bucketed: _train(rank, world, bucketed) for bucketed in (True, False)}
    torch.save(results, Path(out) / f"{rank}.pt")
    dist.destroy_process_group()


def test_bucketed_sync_sums_each_backward_in_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets of 128 bytes, packed in parameter order (float32: w1 alone, 192 bytes; b1 + w2, 128; u; the
    float64 b2 alone): 4 all-reduces per backward, 8 for the two microbatches, where each weight alone would
    be 5 per backward. The tied w2 is summed once per backward (after both its uses accumulate), u (never
    reached) gets zeros without a deadlock, and the accumulated gradients are plain data parallel's (each
    microbatch summed, then added: float rounding apart), with equal bits on both ranks."""
    import torch.multiprocessing as mp

    monkeypatch.setattr(buckets, "bucket_size", lambda: 128)
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(2, free_port(), out), nprocs=2, start_method="fork")
        ranks = [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(2)]
    nbytes = 192 + 32 + 96 + 16 + 24
    assert ranks[0][True]["ledger"] == [("all_reduce", "d", "gradient", 8, 2 * nbytes)]
    bucketed, plain = ranks[0][True]["grads"], ranks[0][False]["grads"]
    for name, got, want in zip(["w1", "b1", "w2", "u", "b2"], bucketed, plain, strict=True):
        if name == "u":
            assert want is None and got is not None and not got.any()
            continue
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), name
    for got, other in zip(bucketed, ranks[1][True]["grads"], strict=True):
        assert torch.equal(got, other)


def test_post_accumulate_hook_runs_once_for_a_weight_read_three_times() -> None:
    """What BucketedSync relies on: a leaf's AccumulateGrad pre-hook and post-accumulate hook run once per
    backward, after every use's gradient is summed, and not for torch.autograd.grad."""
    p = torch.nn.Parameter(torch.ones(3))
    seen: list[tuple[str, list[float]]] = []
    accumulator = p.view_as(p).grad_fn.next_functions[0][0]
    accumulator.register_prehook(lambda grads: seen.append(("pre", grads[0].tolist())))
    p.register_post_accumulate_grad_hook(lambda t: seen.append(("post", t.grad.tolist())))
    ((p * 2).sum() + (p * 3).sum() + p.sum()).backward()
    assert seen == [("pre", [6.0] * 3), ("post", [6.0] * 3)]
    torch.autograd.grad((p * 5).sum(), p)
    assert len(seen) == 2


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The transformer's training plans: data parallel on 4 devices, data x tensor parallel on a 2x2 mesh."""
    out = tmp_path_factory.mktemp("bucket-plans")
    for name, mesh in (("tf4", "4"), ("tf22", "2x2")):
        result = run_cli("optimize", str(MODEL), "--objective", "training", "--devices", "4", "--mesh", mesh,
                         "-o", str(out / name), "-q")  # fmt: skip
        assert result.returncode == 0, result.stderr
    return {name: out / name for name in ("tf4", "tf22")}


def _gradient_lines(texts: list[str], rank: int) -> dict[str, str]:
    return {
        axis: text
        for text in texts
        for axis in ("x", "y")
        if f"all_reduce on axis {axis} (gradient), rank {rank}:" in text
    }


def test_a_2x2_plan_trains_like_one_device_with_small_buckets(
    plans: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets of 300 KiB (the cost model's 25 MiB hold every gradient of the transformer): the loss, every
    gradient and every weight after 2 SGD steps match one device, and on both axes the ranks issue the
    weight-gradient all-reduces plan.json predicts, fewer than the weights it prices one by one."""
    monkeypatch.setattr(buckets, "bucket_size", lambda: 300 * 1024)
    result = check_training(MODEL, plans["tf22"], None, steps=2, loss="mean")
    assert result.passed, result.first_failure()
    texts = [text for _, text in result.lines]
    assert any(text.startswith("weight after 2 sgd step(s) of 'ffn.down.weight'") for text in texts)
    one_by_one = predicted_collectives(read_explain_record(plans["tf22"] / "plan.json"))
    lines = _gradient_lines(texts, 0)  # every rank is compared; a line for each other rank only on a mismatch
    assert set(lines) == {"x", "y"}, texts
    for axis, line in lines.items():
        issued = int(line.split("issued ")[1].split()[0])
        priced = one_by_one[("all_reduce", axis, "gradient")][0]
        assert 1 < issued < priced, (line, priced)


def test_a_dropped_bucket_fails_the_check(plans: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The data-parallel plan's 13 weights fill one 25 MiB bucket (3159040 bytes with the q/k/v weights'
    concatenation, whose all-reduce autograd issues: 2 all-reduces); the ranks (forked, so the fault reaches
    them) skip their last bucket: the weights' gradients are each replica's own and the count is short."""
    original = buckets.axis_buckets
    monkeypatch.setattr(buckets, "axis_buckets", lambda params, axes: original(params, axes)[:-1])
    result = check_training(MODEL, plans["tf4"], None, steps=1, loss="mean")
    assert not result.passed
    texts = [text for ok, text in result.lines if not ok]
    assert any(text.startswith("gradient of 'ffn.down.weight'") for text in texts), texts
    line = _gradient_lines(texts, 0)["x"]
    assert "issued 1 (786432 bytes), plan.json prices 2 (3159040 bytes)" in line, line
