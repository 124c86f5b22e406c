"""Per-family forward and backward costs (issue 24, items 2 and 4): what each op family says its passes read and
write, checked against the formulas and, in order of magnitude, against the ratios measured on an H200 (issue
24: the old price was "3 × forward" with a whole-table Gather and a copied Reshape); efficiencies per op class
and device kind from machine files."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from unity_eq.cost import CostModel, OpInstance
from unity_eq.cost.model import backward_work, forward_work, op_class
from unity_eq.errors import MachineError
from unity_eq.ir import Mesh
from unity_eq.machine import Machine, load_machine, machine_from_toml
from unity_eq.ops.family import OpFamily, Work
from unity_eq.ops.registry import FAMILIES
from unity_eq.profile_table import ProfileTable

MESH = Mesh(("x",), (1,))
T, H, V = 4096, 4096, 50257  # a GPT layer at h=4096 on 2 × 2048 tokens, fp16: the shapes


def _op(op: str, ins: list[tuple[int, ...]], out: tuple[int, ...], itemsize: int = 2, outputs: int = 1) -> OpInstance:
    in_bytes = sum(math.prod(s) for s in ins) * itemsize
    return OpInstance(op, tuple(ins), in_bytes, out, math.prod(out) * itemsize, "float16", outputs)


def _old_forward(machine: Machine, op: OpInstance) -> float:
    """The price before per-family costs: every input read, the output written, at the machine's efficiency."""
    device = machine.devices[0]
    moved = op.in_bytes / op.outputs + op.out_bytes
    return moved / (device.memory_bandwidth * machine.efficiency) + machine.launch_overhead / op.outputs


@pytest.fixture(scope="module")
def h100() -> Machine:
    return load_machine("h100x8")


def test_views_are_free_forward_and_backward(h100: Machine) -> None:
    model = CostModel(h100, MESH, "training")
    for op, out in (("Reshape", (2, 2048, 32, 128)), ("Flatten", (T, H)), ("Unsqueeze", (1, 2, 2048, H))):
        assert model.compute(_op(op, [(2, 2048, H)], out)).total == 0.0
    assert model.compute(_op("Identity", [(2, 2048, H)], (2, 2048, H))).total == 0.0


def test_gather_reads_the_rows_it_gathers_and_scatters_into_the_table(h100: Machine) -> None:
    lookup = OpInstance("Gather", ((V, H), (2, 2048)), V * H * 2 + T * 8, (2, 2048, H), T * H * 2, "float16")
    work = forward_work(lookup)
    assert (work.read, work.written) == (T * H + T, T * H)  # the rows and the indices; never the table
    ratio = CostModel(h100, MESH).compute(lookup).total / _old_forward(h100, lookup)
    assert 0.1 < ratio < 0.25  # measured on an H200: 0.17 of the old price
    backward = backward_work(lookup)
    assert backward is not None and backward.written == V * H + T * H  # zero-fill the table's gradient, add rows


def test_broadcast_operands_pay_the_reduction_of_their_gradient() -> None:
    same = backward_work(_op("Add", [(2, 2048, H), (2, 2048, H)], (2, 2048, H)))
    bias = backward_work(_op("Add", [(2, 2048, H), (H,)], (2, 2048, H)))
    assert same == Work(kernels=0.0)  # both gradients are the output's gradient itself
    assert bias == Work(T * H, T * H, H)  # read the whole gradient once, write the bias's
    scale = backward_work(_op("Mul", [(2, 32, 2048, 128), ()], (2, 32, 2048, 128)))
    n = 2 * 32 * 2048 * 128
    assert scale is not None and (scale.read, scale.written) == (n + 1, n)  # a constant scale gets no gradient


def test_layernorm_backward_rereads_the_input_and_costs_more_than_the_flat_price(h100: Machine) -> None:
    ln = _op("LayerNormalization", [(2, 2048, H), (H,), (H,)], (2, 2048, H))
    work = backward_work(ln)
    assert work is not None and work.kernels == 2 and work.read >= 4 * T * H and work.written >= T * H
    flat = 3 * _old_forward(h100, ln)
    assert CostModel(h100, MESH, "training").compute(ln).total > flat  # measured 3.8× the flat price


def test_softmax_and_transpose_backward(h100: Machine) -> None:
    n = 2 * 32 * 2048 * 128
    assert backward_work(_op("Softmax", [(2, 32, 2048, 128)], (2, 32, 2048, 128))) == Work(4.0 * n, 2.0 * n, n)
    transpose = _op("Transpose", [(2, 2048, 32, 128)], (2, 32, 2048, 128))
    assert backward_work(transpose) == Work(0.0, n, n)
    # a layout copy at the layout efficiency: 0.75 / 0.40 of the old forward price (measured 1.7-2.1×)
    ratio = CostModel(h100, MESH).compute(transpose).total / _old_forward(h100, transpose)
    assert 1.6 < ratio < 2.1


def test_matmul_backward_is_two_gemms(h100: Machine) -> None:
    mm = _op("MatMul", [(2, 2048, H), (H, 4 * H)], (2, 2048, 4 * H))
    model = CostModel(h100, MESH, "training")
    forward = CostModel(h100, MESH).compute(mm).total
    assert model.compute(mm).total == pytest.approx(3 * forward, rel=0.01)  # compute bound: 2 × forward FLOPs
    assert op_class("MatMul") == "gemm" and op_class("Transpose") == "layout" and op_class("Gather") == "memory"


def test_a_family_without_the_hook_keeps_the_flat_backward(h100: Machine) -> None:
    """A plug-in that states no backward (SpaceToDepth; attention's until it does) is priced 3 × forward."""
    model = CostModel(h100, MESH, "training")
    op = _op("SpaceToDepth", [(8, 16, 32, 32)], (8, 64, 16, 16))
    assert backward_work(op) is None
    assert model.compute(op).total == pytest.approx(3 * CostModel(h100, MESH).compute(op).total)
    opaque = _op("Einsum", [(64, 64)], (64, 64))
    assert model.compute(opaque).total == pytest.approx(3 * CostModel(h100, MESH).compute(opaque).total)


def test_every_family_states_or_defaults_its_backward() -> None:
    """Each built-in family answers for its ops on a small instance without raising, with non-negative work."""
    shapes = {
        "MatMul": ([(4, 8), (8, 6)], (4, 6)),
        "Gemm": ([(4, 8), (8, 6), (6,)], (4, 6)),
        "Conv": ([(1, 3, 8, 8), (4, 3, 3, 3), (4,)], (1, 4, 6, 6)),
        "Gather": ([(10, 4), (3,)], (3, 4)),
        "Where": ([(4, 6), (4, 6), (4, 6)], (4, 6)),
        "LayerNormalization": ([(4, 6), (6,), (6,)], (4, 6)),
        "BatchNormalization": ([(2, 3, 4, 4), (3,), (3,), (3,), (3,)], (2, 3, 4, 4)),
        "ReduceSum": ([(4, 6)], (4, 1)),
    }
    for family in FAMILIES:
        assert isinstance(family, OpFamily)
        for spec in family.specs:
            ins, out = shapes.get(spec.name, ([(4, 6)], (4, 6)))
            work = backward_work(_op(spec.name, ins, out))
            assert work is None or min(work.flops, work.read, work.written, work.kernels) >= 0, spec.name


def test_efficiency_per_op_class_and_device_kind() -> None:
    base = {
        "name": "m",
        "devices": {"A": {"peak_tflops": {"float32": 10}, "memory_bandwidth_gbs": 1000, "memory_gib": 8}},
        "nodes": [{"devices": {"A": 2}, "link": "l"}],
        "links": {"l": {"bandwidth_gbs": 100, "latency_us": 1}},
    }
    plain = machine_from_toml({**base, "efficiency": 0.5})
    device = plain.devices[0]
    assert plain.efficiency_for(device, "gemm") == plain.efficiency_for(device, "layout") == 0.5
    per_class = machine_from_toml({**base, "efficiency": {"gemm": 0.8, "layout": 0.3}})
    assert per_class.efficiency_for(per_class.devices[0], "gemm") == 0.8
    assert per_class.efficiency_for(per_class.devices[0], "layout") == 0.3
    assert per_class.efficiency_for(per_class.devices[0], "memory") == 0.75  # the default for what it leaves out
    devices = {"A": {**base["devices"]["A"], "efficiency": {"memory": 0.6}}}  # type: ignore[dict-item]
    kind = machine_from_toml({**base, "efficiency": {"memory": 0.9}, "devices": devices})
    assert kind.efficiency_for(kind.devices[0], "memory") == 0.6  # the device kind's own value comes first
    with pytest.raises(MachineError, match=r"unknown field `efficiency.tensor`"):
        machine_from_toml({**base, "efficiency": {"tensor": 0.5}})
    with pytest.raises(MachineError, match=r"field `efficiency.gemm`: expected a fraction"):
        machine_from_toml({**base, "efficiency": {"gemm": 1.5}})
    preset = load_machine("a100x8")
    assert preset.efficiency_for(preset.devices[0], "layout") == 0.40  # source: docs/machines.md


def test_the_layout_efficiency_prices_a_transpose_and_not_a_gemm(h100: Machine) -> None:
    slow = replace(h100, efficiencies={**h100.efficiencies, "layout": 0.1})
    transpose = _op("Transpose", [(2, 2048, 32, 128)], (2, 32, 2048, 128))
    mm = _op("MatMul", [(2, 2048, H), (H, H)], (2, 2048, H))
    assert CostModel(slow, MESH).compute(transpose).total > 3 * CostModel(h100, MESH).compute(transpose).total
    assert CostModel(slow, MESH).compute(mm).total == CostModel(h100, MESH).compute(mm).total


def test_a_table_with_backward_times_prices_training_with_them(h100: Machine) -> None:
    add = _op("Add", [(4, 8), (8,)], (4, 8))
    key = {"in_shapes": [[4, 8], [8]], "out_shape": [4, 8], "dtype": "float16"}
    measured = ProfileTable({}, [{"op": "Add", "attrs": {}, "key": key, "median_s": 1e-3, "backward_s": 5e-3}])
    assert CostModel(h100, MESH, "training", profile=measured).compute(add).total == pytest.approx(6e-3)
    forward_only = ProfileTable({}, [{"op": "Add", "attrs": {}, "key": key, "median_s": 1e-3}])
    model = CostModel(h100, MESH, "training", profile=forward_only)
    ratio = model.roofline(add, backward_work(add) or Work()) / model.roofline(add, forward_work(add))
    assert model.compute(add).total == pytest.approx(1e-3 * (1 + ratio))  # the roofline's ratio scales it
    assert CostModel(h100, MESH, profile=measured).compute(add).total == pytest.approx(1e-3)


def test_an_eager_derivative_chain_pays_each_kernel() -> None:
    """Erf's PyTorch derivative is five eager kernels (pow, neg, exp, a scale, the product), not one: on the H200
    machine file its backward at 8 × 1024 × 4096 float32 is priced near the 422 µs measured there
    (benchmarks/results/gpu-h200/costs-1.profile.json), where one kernel's price was 110 µs; Tanh's is one fused
    kernel (tanh_backward)."""
    h200 = load_machine(str(Path(__file__).resolve().parents[1] / "benchmarks" / "machines" / "h200.toml"))
    shape = (8, 1024, 4096)
    erf = _op("Erf", [shape], shape, itemsize=4)
    erf = replace(erf, dtype="float32")
    model = CostModel(h200, MESH, "training")
    assert model.backward(erf) == pytest.approx(422e-6, rel=0.1)
    chain = backward_work(erf)
    tanh = backward_work(_op("Tanh", [shape], shape))
    assert chain is not None and tanh is not None and (chain.kernels, tanh.kernels) == (5, 1)
    pow_base = backward_work(_op("Pow", [shape, ()], shape))
    assert pow_base is not None and pow_base.kernels == 4  # the one-element exponent gets no gradient
