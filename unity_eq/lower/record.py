"""What plan.json records of a lowered plan (``plan_record``: model, mesh, machine, cost, tensors, steps,
collectives and the search's report) and the plan's hash, which plan.json and every device file carry."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from typing_extensions import assert_never

from unity_eq.cost import Cost
from unity_eq.ir import Graph, Shard
from unity_eq.lower.device import LoweredPlan
from unity_eq.lower.machine import machine_record
from unity_eq.plan import CollectiveStep, Compute, Const, LoadInput, LoadWeight, Plan, Step
from unity_eq.planfile import (
    PLAN_FORMAT_VERSION,
    STEP_RECORDS,
    CollectiveRecord,
    ComputeStepRecord,
    CostRecord,
    InputStepRecord,
    MeshRecord,
    ModelInputRecord,
    ModelOutputRecord,
    ModelRecord,
    PlanMemoryRecord,
    PlanRecord,
    RankRecord,
    StepRecord,
    TensorRecord,
    WeightRecord,
    WeightStepRecord,
    json_default,
)
from unity_eq.version import __version__
from unity_eq.weightfile import release_pages


def _contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy only when needed; unlike np.ascontiguousarray it keeps a scalar 0-dimensional."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def plan_hash(plan: Plan, graph: Graph, weights: bool = True) -> str:
    """A digest of what a plan computes: its steps, tensors, mesh and outputs, and the model's weights.

    Two plans share it only when their device files are interchangeable; ``run`` compares it between
    plan.json and every device file. Weights are hashed in place (no copy), one tensor at a time.
    ``weights=False`` (a plan-only plan, which has no device files) hashes their names, dtypes and shapes
    only: their bytes may be absent, and a 175B model's are not read to plan it."""
    digest = hashlib.blake2b(digest_size=16)
    structure = {
        "model": plan.model,
        "mesh": [list(plan.mesh.axes), list(plan.mesh.sizes), list(plan.mesh.devices)],
        "steps": [step_record(s).to_json() for s in plan.steps],
        "tensors": {tid: [list(t.shape), t.dtype, t.placement_str()] for tid, t in plan.tensors.items()},
        "outputs": plan.outputs,
        "inputs": {n: [list(t.shape), t.dtype] for n, t in graph.inputs.items()},
    }
    digest.update(json.dumps(structure, sort_keys=True, default=json_default).encode())
    for name in sorted(graph.initializers):
        array = np.asarray(graph.initializers[name])
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        if not weights:
            continue
        if array.dtype.kind == "O":  # string tensors
            digest.update(repr(array.tolist()).encode())
        elif array.size:  # as bytes: a buffer of bfloat16 or float8 (ml_dtypes) is refused, its bytes are not
            digest.update(_contiguous(array.reshape(-1)).view(np.uint8).data)
            release_pages(array)
    return digest.hexdigest()


def step_record(step: Step, cost: Cost | None = None, node: str = "") -> StepRecord:
    """A step as plan.json lists it, with its predicted seconds when the plan was priced step by step; ``node``
    names the source model's node a compute step is (:func:`source_nodes`) when the step does not."""
    seconds = {"compute_s": cost.compute, "communication_s": cost.comm} if cost is not None else {}
    match step:
        case Compute(outputs=outputs, op_type=op, inputs=inputs, attrs=attrs, domain=domain):
            refs = tuple(tuple(i.values) if isinstance(i, Const) else i for i in inputs)
            plain = {k: v for k, v in attrs.items() if isinstance(v, int | float | str | list)}
            return ComputeStepRecord(
                op=op, inputs=refs, outputs=outputs, attrs=plain, domain=domain, node=node or step.node, **seconds
            )
        case LoadInput(out=out, name=name):
            return InputStepRecord(out=out, name=name, **seconds)
        case LoadWeight(out=out, name=name):
            return WeightStepRecord(out=out, name=name, **seconds)
        case CollectiveStep(out=out, src=src, axis=axis):
            record = STEP_RECORDS[str(step.kind.record_kind)]  # a kind with a step has a record
            return record(out=out, src=src, axis=axis, **step.dims(), **seconds)
        case _:
            assert_never(step)


def source_nodes(plan: Plan, graph: Graph) -> list[str]:
    """For each step, the ONNX name of the source model's node it is ("" when none): a compute step whose
    output holds the value a node of the same op makes (as the device files name their nodes, lower/builder.py),
    so that ``explain`` names ops as Netron does."""
    producer = {out: node for node in graph.nodes for out in node.outputs if out}
    names = []
    for step in plan.steps:
        found = ""
        if isinstance(step, Compute):
            for out in step.outputs:
                t = plan.tensors.get(out) if out else None
                value = (t.value or t.source) if t is not None else None
                if value in producer and producer[value].op_type == step.op_type:
                    found = producer[value].name
                    break
        names.append(found)
    return names


def plan_record(lowered: LoweredPlan, device_collectives: list[dict[str, Any]], weight_bytes: list[int]) -> PlanRecord:
    """The content of plan.json (see the module docstring): ``device_collectives`` names the tensors each
    collective cuts (the same on every rank), ``weight_bytes`` is the weights written for each rank."""
    plan, graph, stages = lowered.plan, lowered.graph, lowered.stages
    mesh, machine = plan.mesh, plan.machine
    ranks = tuple(
        RankRecord(
            rank=rank,
            coords=mesh.coords(rank),
            device=mesh.devices[rank],
            device_kind=machine.devices[mesh.devices[rank]].name,
            node=machine.node_of[mesh.devices[rank]],
        )
        for rank in range(mesh.size)
    )
    plan_collectives = plan.collectives()
    collectives = tuple(
        CollectiveRecord(
            id=index,
            kind=step.kind.name,
            axis=step.axis,
            **step.dims(),
            src=names["src"],
            dst=names["dst"],
            groups=tuple(tuple(g) for g in mesh.groups(step.axis)),
            bytes=plan.tensors[step.out].local_bytes(mesh),
            stage=stages[step.out],
        )
        for index, (step, names) in enumerate(zip(plan_collectives, device_collectives, strict=True))
    )
    tensors = {
        tid: TensorRecord(
            shape=t.shape,
            dtype=t.dtype,
            placement=tuple(t.placement_str()),
            local_shape=t.local_shape(mesh),
            source=t.source or None,
            value=t.value or None,
        )
        for tid, t in plan.tensors.items()
    }
    model = ModelRecord(
        name=plan.model,
        source=graph.source,
        fingerprint=graph.fingerprint or None,
        inputs={n: ModelInputRecord(shape=t.shape, dtype=t.dtype) for n, t in graph.inputs.items()},
        outputs={
            n: ModelOutputRecord(shape=graph.types[n].shape, dtype=graph.types[n].dtype, tensor=plan.outputs[n])
            for n in graph.outputs
        },
    )
    report = plan.report
    return PlanRecord(
        format_version=PLAN_FORMAT_VERSION,
        unity_eq_version=__version__,
        model=model,
        objective=plan.objective.name,
        mesh=MeshRecord(axes=mesh.axes, sizes=mesh.sizes, devices=mesh.devices, ranks=ranks),
        machine=machine_record(plan),
        cost=report.cost
        or CostRecord(total_s=plan.cost.total, compute_s=plan.cost.compute, communication_s=plan.cost.comm),
        files=tuple(f"device_{r}.onnx" for r in range(mesh.size)),
        plan_only=lowered.plan_only,
        tensors=tensors,
        steps=tuple(
            step_record(s, c, n) for s, c, n in zip(plan.steps, _costs(plan), source_nodes(plan, graph), strict=True)
        ),
        collectives=collectives,
        shardings={
            tid: tuple(t.placement_str())
            for tid, t in plan.tensors.items()
            if any(isinstance(p, Shard) for p in t.placement)
        },
        mesh_search=report.mesh_search,
        baselines=report.baselines,
        extraction=report.extraction,
        blocks=report.blocks,
        parallelism=report.parallelism,
        stats=plan.stats,
        plan_hash=lowered.plan_hash,
        memory=PlanMemoryRecord(usage=report.memory, weight_bytes_per_rank=tuple(weight_bytes)),
        training_search=report.training_search,
        weights=weight_records(plan, graph),
    )


def weight_records(plan: Plan, graph: Graph) -> dict[str, WeightRecord]:
    """plan.json's ``weights``: every weight the plan loads, trainable or a constant, the source parameters it
    is made of and how (``Plan.origin``), and why it may be merged parameters (``Graph.ambiguous_weights``)."""
    ambiguous = graph.ambiguous_weights()
    out: dict[str, WeightRecord] = {}
    for step in plan.steps:
        if isinstance(step, LoadWeight) and step.name not in out:
            origin = plan.origin(step)
            out[step.name] = WeightRecord(
                trainable=origin.trainable,
                how=origin.how,
                sources=origin.sources,
                ops=origin.ops,
                merged=origin.merged,
                ambiguous=ambiguous.get(step.name, ""),
            )
    return out


def _costs(plan: Plan) -> list[Cost | None]:
    return list(plan.step_costs) if len(plan.step_costs) == len(plan.steps) else [None] * len(plan.steps)
