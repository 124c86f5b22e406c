"""The cost model: collective formulas (flat and hierarchical), gradient buckets, memory, re-pricing, and the
monotonicity properties (more bandwidth never costs more; more devices never change a one-device plan)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unity_eq import optimize
from unity_eq.collectives import COLLECTIVES, REPLICATE
from unity_eq.cost import TIE_TOLERANCE, CostModel, OpInstance, cheaper, within
from unity_eq.extract import Restriction
from unity_eq.ir import Mesh
from unity_eq.machine import DeviceSpec, LinkSpec, Machine, NodeSpec, default_machine, load_machine
from unity_eq.memory import weight_state_factor
from unity_eq.plan import Plan
from unity_eq.report import price_plan

GPU = DeviceSpec("G", {"float32": 20e12, "float16": 300e12}, 2e12, 80 * 2**30)
NODE_LINK = LinkSpec(300e9, 2e-6, "node")
NIC = LinkSpec(25e9, 5e-6, "nic")
MiB = 2**20


def _machine(nodes: int, per_node: int, link: LinkSpec = NODE_LINK, nic: LinkSpec = NIC, nics: int = 0) -> Machine:
    specs = tuple(NodeSpec(f"n{i}", link, nic, nics or per_node) for i in range(nodes))
    return Machine(
        "m",
        (GPU,) * (nodes * per_node),
        tuple(i // per_node for i in range(nodes * per_node)),
        link,
        nic,
        nodes=specs,
    )


# ----------------------------------------------------------------------------------------------------------
# Formulas


def test_flat_collectives_follow_the_nccl_ring_formulas() -> None:
    model = CostModel(_machine(1, 8), Mesh(("x",), (8,)))
    s, b, a, n = 64 * MiB, 300e9, 2e-6, 8
    assert model.all_reduce("x", s) == pytest.approx(2 * (n - 1) * a + 2 * (n - 1) / n * s / b)
    assert model.all_gather("x", s) == pytest.approx((n - 1) * a + (n - 1) / n * s / b)
    assert model.reduce_scatter("x", s) == pytest.approx((n - 1) * a + (n - 1) / n * s / b)
    assert model.all_to_all("x", s) == pytest.approx((n - 1) * a + (n - 1) / n * s / b)
    assert model.send("x", s) == pytest.approx(a + s / b)


def test_hierarchical_all_reduce_is_an_intra_step_an_inter_step_and_an_intra_step() -> None:
    # 2 nodes × 8; one axis over all 16: k = 8 ranks per node, m = 2 nodes; each rank gets 8 × 25 / 8 GB/s.
    model = CostModel(_machine(2, 8), Mesh(("x",), (16,)))
    s, k, m = 64 * MiB, 8, 2
    intra = (k - 1) * 2e-6 + (k - 1) / k * s / 300e9
    inter = 2 * (m - 1) * 5e-6 + 2 * (m - 1) / m * (s / k) / 25e9
    assert model.all_reduce("x", s) == pytest.approx(2 * intra + inter)
    gather = (m - 1) * 5e-6 + (m - 1) / m * (s / k) / 25e9 + (k - 1) * 2e-6 + (k - 1) / k * s / 300e9
    assert model.all_gather("x", s) == pytest.approx(gather)
    # far cheaper than a flat ring over the network
    assert model.all_reduce("x", s) < 2 * 15 / 16 * s / 25e9


def test_an_axis_across_nodes_shares_the_nics_of_every_rank_on_the_node() -> None:
    mesh = Mesh(("x", "y"), (2, 8))  # x: one rank per node, 8 groups at once; y: inside a node
    model = CostModel(_machine(2, 8, nics=2), mesh)
    (top,) = model.group_topologies("x")
    assert (top.k, top.m) == (1, 2) and top.network is not None
    assert top.network.bandwidth == pytest.approx(2 * 25e9 / 8)
    assert not model.spans_nodes("y") and model.spans_nodes("x")
    s = 8 * MiB
    assert model.all_reduce("x", s) == pytest.approx(2 * 5e-6 + s / (2 * 25e9 / 8))


def test_one_rank_costs_nothing() -> None:
    model = CostModel(_machine(1, 1), Mesh(("x",), (1,)))
    for fn in (model.all_reduce, model.all_gather, model.reduce_scatter, model.all_to_all, model.send):
        assert fn("x", 1e9) == 0.0


def test_weight_gradients_pay_their_share_of_a_bucket_latency() -> None:
    model = CostModel(_machine(1, 8), Mesh(("x",), (8,)), "training")
    small = 1 * MiB
    transfer = 2 * 7 / 8 * small / 300e9
    assert model.gradient_all_reduce("x", small) == pytest.approx(transfer + small / (25 * MiB) * 14 * 2e-6)
    assert REPLICATE.price(model, "x", small, small, "weight").comm == model.gradient_all_reduce("x", small)
    assert REPLICATE.price(model, "x", small, small, "activation").comm == model.all_reduce("x", small)
    assert REPLICATE.price(model, "x", small, small, "input").comm == 0.0
    big = 100 * MiB
    assert model.gradient_all_reduce("x", big) == pytest.approx(model.all_reduce("x", big))
    inference = CostModel(_machine(1, 8), Mesh(("x",), (8,)), "inference")
    assert REPLICATE.price(inference, "x", big, big, "weight").comm == 0


def test_compute_is_a_roofline_plus_the_launch_floor() -> None:
    machine = _machine(1, 1)
    model = CostModel(machine, Mesh(("x",), (1,)))
    flops = 2 * 1024 * 1024 * 1024
    bound = model.compute(OpInstance("MatMul", ((1024, 1024), (1024, 1024)), 0.0, (1024, 1024), 0.0, "float16")).total
    assert bound == pytest.approx(flops / (300e12 * 0.75) + 5e-6)
    memory_bound = model.compute(OpInstance("Relu", ((1 << 20,),), 4 * 2**20, (1 << 20,), 4 * 2**20, "float32")).total
    assert memory_bound == pytest.approx(8 * 2**20 / (2e12 * 0.75) + 5e-6)
    training = CostModel(machine, Mesh(("x",), (1,)), "training")
    # Relu's backward is one kernel (it reads the gradient and the saved output, writes the input's gradient):
    # on a tiny tensor forward + backward are two launch floors (the flat "3 × forward" charged three)
    assert training.compute(OpInstance("Relu", ((8,),), 32, (8,), 32, "float32")).total == pytest.approx(
        2 * 5e-6, rel=1e-3
    )


def test_the_optimizer_update_streams_the_kept_state_at_the_slowest_memory() -> None:
    """The update reads and writes every byte a device keeps (weights and state) once, at the mesh's slowest
    memory bandwidth × efficiency: one price for a pipeline stage and the SPMD plan (``CostModel`` term)."""
    slow = replace(GPU, name="S", memory_bandwidth=1e12)
    machine = replace(_machine(1, 2), devices=(GPU, slow))
    assert CostModel(machine, Mesh(("x",), (1,), (0,))).optimizer_update(2**30) == 2 * 2**30 / (2e12 * 0.75)
    assert CostModel(machine, Mesh(("x",), (2,))).optimizer_update(2**30) == 2 * 2**30 / (1e12 * 0.75)


def test_the_tie_rule_separates_noise_from_differences() -> None:
    """``cheaper``: by more than the tolerance (1e-12 by default, rounding noise); ``within``: 1 % by default."""
    assert not cheaper(1.0, 1.0) and not cheaper(1.0 - 1e-13, 1.0) and cheaper(1.0 - 1e-11, 1.0)
    assert not cheaper(0.995, 1.0, TIE_TOLERANCE) and cheaper(0.98, 1.0, TIE_TOLERANCE)
    assert within(1.0099, 1.0) and not within(1.0101, 1.0)


def test_training_state_per_weight_byte() -> None:
    assert weight_state_factor(4) == 3  # gradient + two fp32 moments
    assert weight_state_factor(2) == 7  # gradient + fp32 master + two fp32 moments


# ----------------------------------------------------------------------------------------------------------
# Properties


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, tuple[int, ...]]:
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    n = nodes * per_node
    sizes = draw(st.sampled_from([s for s in _factorizations(n) if len(s) <= 3]))
    return nodes, per_node, sizes


def _factorizations(n: int) -> list[tuple[int, ...]]:
    from unity_eq.search.meshes import _factorizations as factor

    return factor(n, 3)


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts(),
    faster_link=st.floats(1.0, 100.0),
    faster_nic=st.floats(1.0, 100.0),
    lower_latency=st.floats(0.0, 1.0),
    nbytes=st.floats(1.0, 1e10),
    objective=st.sampled_from(["inference", "training"]),
)
def test_more_bandwidth_never_costs_more(
    layout: tuple[int, int, tuple[int, ...]],
    faster_link: float,
    faster_nic: float,
    lower_latency: float,
    nbytes: float,
    objective: str,
) -> None:
    nodes, per_node, sizes = layout
    mesh = Mesh(("x", "y", "z")[: len(sizes)], sizes)
    slow = CostModel(_machine(nodes, per_node), mesh, objective)
    link = LinkSpec(NODE_LINK.bandwidth * faster_link, NODE_LINK.latency * lower_latency, "node")
    nic = LinkSpec(NIC.bandwidth * faster_nic, NIC.latency * lower_latency, "nic")
    fast = CostModel(_machine(nodes, per_node, link, nic), mesh, objective)
    for axis in mesh.axes:
        for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "gradient_all_reduce"):
            assert getattr(fast, name)(axis, nbytes) <= getattr(slow, name)(axis, nbytes) * (1 + 1e-12)
        for collective in COLLECTIVES:  # every kind's price, through the formulas above
            for kind in ("weight", "activation", "input"):
                fast_s = collective.price(fast, axis, nbytes, nbytes, kind).total
                assert fast_s <= collective.price(slow, axis, nbytes, nbytes, kind).total * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(layout=layouts(), nbytes=st.floats(1.0, 1e10), more=st.floats(1.0, 10.0))
def test_more_bytes_never_cost_less(layout: tuple[int, int, tuple[int, ...]], nbytes: float, more: float) -> None:
    nodes, per_node, sizes = layout
    mesh = Mesh(("x", "y", "z")[: len(sizes)], sizes)
    model = CostModel(_machine(nodes, per_node), mesh, "training")
    for axis in mesh.axes:
        for name in ("all_reduce", "all_gather", "all_to_all", "gradient_all_reduce"):
            assert getattr(model, name)(axis, nbytes) <= getattr(model, name)(axis, nbytes * more) * (1 + 1e-12)


@pytest.fixture(scope="module")
def mlp_plans(examples: Path) -> dict[str, Plan]:
    """The MLP example on a 2×4 mesh of 8 A100s, extracted several ways, for training."""
    result = optimize(examples / "mlp.onnx", devices=8, mesh="2x4", objective="training")
    assert result.search is not None
    extractor = result.search.extractors["x=2,y=4"]
    plans = {"chosen": result.plan}
    for restriction in (Restriction.tensor_parallel("x"), Restriction.tensor_parallel("y"), Restriction.one_device()):
        plans[restriction.name] = extractor.extract(restriction).plan
    plans["weights_whole"] = extractor.extract(Restriction.data_parallel(strict=False)).plan
    return plans


def test_repricing_a_plan_reproduces_its_extracted_costs(mlp_plans: dict[str, Plan]) -> None:
    for plan in mlp_plans.values():
        again = price_plan(plan, CostModel(plan.machine, plan.mesh, plan.objective))
        assert [c.total for c in again] == pytest.approx([c.total for c in plan.step_costs], rel=1e-9, abs=1e-15)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(faster=st.floats(1.0, 50.0), latency=st.floats(0.0, 1.0))
def test_more_bandwidth_never_makes_a_plan_or_the_best_of_plans_cost_more(
    mlp_plans: dict[str, Plan], faster: float, latency: float
) -> None:
    slow_machine = default_machine(8)
    link = slow_machine.intra_link
    fast_machine = replace(
        slow_machine, intra_link=LinkSpec(link.bandwidth * faster, link.latency * latency, link.name)
    )
    best_slow, best_fast = math.inf, math.inf
    for plan in mlp_plans.values():
        slow = sum(c.total for c in price_plan(plan, CostModel(slow_machine, plan.mesh, "training")))
        fast = sum(c.total for c in price_plan(plan, CostModel(fast_machine, plan.mesh, "training")))
        assert fast <= slow * (1 + 1e-12)
        best_slow, best_fast = min(best_slow, slow), min(best_fast, fast)
    assert best_fast <= best_slow * (1 + 1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(devices=st.integers(1, 64), nodes=st.integers(1, 4), objective=st.sampled_from(["inference", "training"]))
def test_more_devices_never_change_a_one_device_plan(
    mlp_plans: dict[str, Plan], devices: int, nodes: int, objective: str
) -> None:
    one = replace(mlp_plans["one_device"], objective=objective)
    alone = sum(c.total for c in price_plan(one, CostModel(default_machine(1), Mesh(("x", "y"), (1, 1)), objective)))
    many = default_machine(devices)
    assert sum(c.total for c in price_plan(one, CostModel(many, Mesh(("x", "y"), (1, devices)), objective))) == (
        pytest.approx(alone, rel=1e-12)
    )
    cluster = load_machine("a100x8", nodes=nodes)
    mesh = Mesh(("x", "y"), (nodes, 8))
    assert sum(c.total for c in price_plan(one, CostModel(cluster, mesh, objective))) == pytest.approx(alone, rel=1e-12)


def test_the_one_device_baseline_is_the_same_on_any_device_count(examples: Path) -> None:
    costs = set()
    for devices in (2, 4, 8):
        report = optimize(examples / "mlp.onnx", devices=devices, max_axes=1).plan.report
        costs.add(round(report.baselines["one_device"].total_s, 15))
    assert len(costs) == 1


def test_gpu_plans_repredicts_committed_measurements_without_a_gpu(tmp_path: Path) -> None:
    """``benchmarks.gpu_plans --repredict``: the models of a measured result planned again by today's cost model,
    each against the time measured then (kept as it was); the error is recomputed from the new prediction."""
    import json

    from benchmarks import gpu_plans

    measured = tmp_path / "plans.json"
    meta = {"device": "a GPU", "torch": "x", "machine": "h200.toml", "date": "2026-01-01", "args": "--out x"}
    rows = [{"model": "block 2,16,32,4 float32", "objective": o, "predicted_s": 1.0, "measured_s": 1e-3}
            for o in ("inference", "training")]  # fmt: skip
    measured.write_text(json.dumps({"meta": meta, "plans": rows, "summary": {}}))
    machine = str(Path(__file__).resolve().parents[1] / "benchmarks" / "machines" / "h200.toml")
    gpu_plans.main(["--repredict", str(measured), "--machine", machine, "--out", str(tmp_path / "again")])
    again = json.loads((tmp_path / "again.json").read_text())
    assert [r["measured_s"] for r in again["plans"]] == [1e-3, 1e-3]
    inference, training = (r["predicted_s"] for r in again["plans"])
    assert 0 < inference < training < 1.0  # planned again: not the recorded 1.0 s
    row = again["plans"][0]
    assert row["relative_error"] == pytest.approx(abs(inference - 1e-3) / 1e-3)
    assert again["meta"]["date"] == "2026-01-01" and "repredicted" in again["meta"]
    assert "Predicted again" in (tmp_path / "again.md").read_text()
