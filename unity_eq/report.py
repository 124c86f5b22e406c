"""What a plan costs, split by where the time goes: the plan.json ``cost`` breakdown and the training overlap.

Communication is split by mesh axis and by phase:

===================  ====================================================================================
phase                steps
===================  ====================================================================================
``forward``          Combine (all-gather) and Reduce (all-reduce) in the forward pass
``backward``         the gradient all-gather of a partitioned activation and the gradient all-reduce of a
                     replicated activation (Megatron's ``f``): both sit on the backward pass's critical path
``gradient``         the all-reduce of every weight gradient replicated across an axis (data parallelism)
===================  ====================================================================================

Overlap (training): a weight's gradient is ready once the backward pass has gone through its consumers, so
its all-reduce can run on a communication stream while the backward pass of the earlier layers computes. We
simulate that: the backward pass runs the steps in reverse order (each op's backward = 2/3 of its training
compute; backward collectives block), gradient all-reduces queue on one stream. ``exposed_s`` is how long that
stream runs past the end of the backward pass, ``overlappable_s`` the rest of the gradient traffic. The
objective the search minimizes does not subtract the overlap (it is a sum), so the predicted cost is an upper
bound by up to ``overlappable_s``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from typing_extensions import assert_never

from unity_eq.cost import ZERO, Cost, CostModel, OpInstance
from unity_eq.ir import Mesh, Replicate
from unity_eq.memory import tensor_kinds
from unity_eq.ops.registry import family_for, spec_for
from unity_eq.plan import CollectiveStep, Compute, LoadInput, LoadWeight, Plan, Step
from unity_eq.planfile import AxisTrafficRecord, CostRecord, OverlapRecord, ParallelismRecord

__all__ = ["cost_breakdown", "gradient_overlap", "parallelism", "price_plan", "step_phase"]


def step_phase(step: Step, kinds: dict[str, str]) -> str | None:
    """``forward``, ``backward`` or ``gradient`` for a communicating step, None for the others."""
    if isinstance(step, CollectiveStep):
        return step.kind.phase(kinds.get(step.src, "activation"))
    return None


def cost_breakdown(plan: Plan) -> CostRecord:
    """The plan.json ``cost`` object: totals, communication by axis and phase, and (training) overlap."""
    kinds = tensor_kinds(plan)
    by_axis: dict[str, dict[str, float]] = {
        a: {"forward": 0.0, "backward": 0.0, "gradient": 0.0} for a in plan.mesh.axes
    }
    for step, cost in zip(plan.steps, plan.step_costs, strict=True):
        phase = step_phase(step, kinds)
        if phase is None or cost.comm == 0 or not isinstance(step, CollectiveStep):
            continue
        by_axis[step.axis][phase] += cost.comm
    return CostRecord(
        total_s=plan.cost.total,
        compute_s=plan.cost.compute,
        communication_s=plan.cost.comm,
        communication_by_axis={
            axis: AxisTrafficRecord(forward_s=s["forward"], backward_s=s["backward"], gradient_s=s["gradient"])
            for axis, s in by_axis.items()
        },
        overlap=gradient_overlap(plan, kinds) if plan.objective.training else None,
    )


def gradient_overlap(plan: Plan, kinds: dict[str, str] | None = None) -> OverlapRecord:
    """How much of the gradient all-reduce traffic can hide behind the backward compute (module docstring)."""
    kinds = kinds if kinds is not None else tensor_kinds(plan)
    clock = 0.0  # the backward pass, from its start
    stream = 0.0  # when the gradient stream is free
    gradient = 0.0
    for step, cost in zip(reversed(plan.steps), reversed(plan.step_costs), strict=True):
        phase = step_phase(step, kinds)
        if isinstance(step, Compute):
            clock += cost.compute * 2.0 / 3.0
        elif phase == "backward":
            clock += cost.comm
        elif phase == "gradient":
            gradient += cost.comm
            stream = max(stream, clock) + cost.comm
    exposed = max(0.0, stream - clock)
    return OverlapRecord(
        gradient_all_reduce_s=gradient,
        overlappable_s=gradient - exposed,
        exposed_s=exposed,
        backward_s=clock,
        note=(
            "gradient all-reduces run on their own stream as the backward pass makes each gradient; the predicted "
            "cost counts them in full, so it is an upper bound by up to overlappable_s"
        ),
    )


def step_instance(plan: Plan, step: Compute, out: str, mesh: Mesh) -> OpInstance:
    """The op instance of one output of a compute step on ``mesh``: what its e-node was priced as."""
    refs = [i for i in step.inputs if isinstance(i, str)]
    # an absent optional input holds its position (None), as extraction priced it; literals are no operands
    in_shapes = tuple(plan.tensors[i].local_shape(mesh) if isinstance(i, str) else None for i in step.inputs
                      if isinstance(i, str) or i is None)  # fmt: skip
    in_bytes = sum(float(plan.tensors[i].local_bytes(mesh)) for i in refs)
    tensor = plan.tensors[out]
    out_bytes = float(tensor.local_bytes(mesh))
    return OpInstance(
        step.op_type,
        in_shapes,
        in_bytes,
        tensor.local_shape(mesh),
        out_bytes,
        tensor.dtype,
        len(step.outputs),
        priced_attrs(step.op_type, step.attrs),
    )


def priced_attrs(op_type: str, attrs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The attributes an op's family prices by (``OpFamily.priced_attrs``), from a plan step's ``attrs`` (an
    attribute the step leaves out takes its spec's default), as its e-node gave them to extraction's price."""
    family, spec = family_for(op_type), spec_for(op_type)
    if family is None or spec is None:
        return ()
    return tuple((n, attrs.get(n, spec.args[spec.arg_index(n)].default)) for n in family.priced_attrs)


def price_plan(plan: Plan, model: CostModel) -> list[Cost]:
    """Price every step of ``plan`` again under ``model`` (another machine or mesh placement of the same
    mesh shape), exactly as extraction prices the e-nodes the steps came from."""
    kinds = tensor_kinds(plan)
    mesh = model.mesh

    def nbytes(tid: str) -> float:
        return float(plan.tensors[tid].local_bytes(mesh))

    costs: list[Cost] = []
    for step in plan.steps:
        match step:
            case LoadInput() | LoadWeight():
                costs.append(ZERO)
            case Compute(outputs=outputs):
                total = ZERO
                for out in outputs:
                    if out:
                        total = total + model.compute(step_instance(plan, step, out, mesh))
                costs.append(total)
            case CollectiveStep(out=out, src=src, axis=axis):
                costs.append(step.kind.price(model, axis, nbytes(src), nbytes(out), kinds.get(src, "activation")))
            case _:
                assert_never(step)
    return costs


def parallelism(plan: Plan) -> ParallelismRecord:
    """Which mesh axes the plan really uses, and how many devices do distinct work (plan.json ``parallelism``).

    An axis along which every tensor is replicated (``R``) is unused: the ranks along it hold the same values
    and run the same ops, so all but one of them repeat the others' work. A cost ratio against a baseline on
    all devices means something else when the plan runs on a fraction of them, so the summary says so.
    """
    mesh = plan.mesh
    used = [
        axis
        for i, axis in enumerate(mesh.axes)
        if any(not isinstance(t.placement[i], Replicate) for t in plan.tensors.values())
    ]
    unused = [axis for axis in mesh.axes if axis not in used and mesh.axis_size(axis) > 1]  # size 1: nothing to use
    distinct = math.prod(mesh.axis_size(axis) for axis in used)
    notes = []
    if unused:
        notes.append(usage_note(mesh.size, distinct, {axis: mesh.axis_size(axis) for axis in unused}))
    machine = plan.machine
    idle_devices = None
    if mesh.size < machine.device_count:
        used_ids = sorted(set(mesh.devices))
        idle = sorted(set(range(machine.device_count)).difference(used_ids))
        idle_devices = len(idle)
        notes.append(
            f"the plan runs on {device_span(used_ids)} ({_kinds(machine, used_ids)}) of the machine's "
            f"{machine.device_count}; {device_span(idle)} ({_kinds(machine, idle)}) stay idle"
        )
    return ParallelismRecord(
        used_axes=tuple(used),
        unused_axes=tuple(unused),
        devices=mesh.size,
        devices_used=distinct,
        copies=mesh.size // distinct,
        machine_devices=machine.device_count,
        idle_devices=idle_devices,
        note="; ".join(notes) if notes else None,
    )


def _kinds(machine: Any, devices: Sequence[int]) -> str:
    """``4 × H100-SXM-80G``: how many devices of each kind."""
    kinds = Counter(machine.devices[d].name for d in devices)
    return " + ".join(f"{n} × {k}" for k, n in kinds.items())


def device_span(devices: Sequence[int]) -> str:
    """``devices 0-3``, ``device 5``, ``devices 0-3, 8-11``: machine devices as runs of consecutive ids."""
    runs: list[str] = []
    start = prev = devices[0]
    for d in [*devices[1:], None]:
        if d is not None and d == prev + 1:
            prev = d
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if d is not None:
            start = prev = d
    return ("device " if len(devices) == 1 else "devices ") + ", ".join(runs)


def usage_note(devices: int, distinct: int, unused_sizes: dict[str, int]) -> str:
    """``axis x (2 ranks) unused, every tensor replicated along it; the other 8 devices repeat the work of 8``:
    ``distinct`` of the mesh's ``devices`` do distinct work, the axes of ``unused_sizes`` being unused."""
    axes = ", ".join(f"{axis} ({size} ranks)" for axis, size in unused_sizes.items())
    word = "axes" if len(unused_sizes) > 1 else "axis"
    return (
        f"{word} {axes} unused, every tensor replicated along it; "
        f"the other {devices - distinct} devices repeat the work of {distinct}"
    )
