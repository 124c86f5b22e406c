"""The lowering stage: ``lower`` checks a plan and prepares it (the stage of each collective, the plan's hash);
``write_plan_dir`` writes the plan directory, device files and plan.json, atomically; ``write_plan_only`` writes
plan.json alone (``optimize --plan-only``: no weight is read)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnx import helper

from unity_eq.errors import InternalError, ModelError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.ir import Graph
from unity_eq.lower.builder import lowered_opset
from unity_eq.lower.device import LoweredPlan, validate_device_file
from unity_eq.lower.record import plan_hash, plan_record
from unity_eq.plan import CollectiveStep, Plan, step_inputs, step_outputs
from unity_eq.planfile import write_plan_json


def collective_stages(plan: Plan) -> dict[str, int]:
    """Stage of every collective's output tensor: 1 + the stage of the collectives it depends on."""
    stage: dict[str, int] = {}
    result: dict[str, int] = {}
    for step in plan.steps:
        level = max((stage.get(i, 0) for i in step_inputs(step)), default=0)
        if isinstance(step, CollectiveStep) and step.kind.communicates:
            result[step.out] = level
            level += 1
        for out in step_outputs(step):
            stage[out] = level
    return result


def refuse_missing_weights(graph: Graph) -> None:
    """Raise a ModelError when a weight's data is absent (``Graph.missing_weights``): device files would
    otherwise hold stand-in zeros in place of the weights, a plan that runs and computes nonsense."""
    if not graph.missing_weights:
        return
    name, why = next(iter(graph.missing_weights.items()))
    others = len(graph.missing_weights) - 1
    more = f" (and {others} more weight{'s' if others > 1 else ''})" if others else ""
    raise ModelError(
        f"{graph.source or graph.name}: weight {name!r} has no data ({why}){more}; device files need every "
        "weight. Pass `--plan-only` to write plan.json alone, or put the weight data next to the model."
    )


def lower(plan: Plan, graph: Graph, plan_only: bool = False) -> LoweredPlan:
    """Check the plan and prepare it for writing (device models are built when written).

    ``plan_only``: for :func:`write_plan_only`; weights may then be absent, and the plan's hash covers
    their names, dtypes and shapes but not their bytes (no weight is read)."""
    if not plan_only:
        refuse_missing_weights(graph)
    problems = plan.validate()
    if problems:
        raise InternalError("the extracted plan is inconsistent: " + "; ".join(problems[:3]))
    opset = lowered_opset(plan, graph)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in graph.extra_opsets.items()]
    ir_version = min(max(graph.ir_version, 8), 10) if opset < 23 else 11  # opset 23 came with IR version 11
    digest = plan_hash(plan, graph, weights=not plan_only)
    return LoweredPlan(plan, graph, collective_stages(plan), opsets, ir_version, digest, plan_only)


def write_plan_dir(
    lowered: LoweredPlan, out_dir: str | Path, on_rank: Callable[[int, int], None] | None = None
) -> Path:
    """Write the plan directory atomically: everything goes to a temporary sibling that replaces ``out_dir``
    only when complete, so a failure never leaves a half-written plan. Ranks are built, saved and dropped
    one at a time; ``on_rank(done, total)`` hears each one written (a large model takes a while per rank)."""
    # resolved: `-o .` names the folder by its real name (its sibling temporary folder, not one inside it),
    # and `-o link` writes where the link points instead of replacing the link by a folder
    refuse_missing_weights(lowered.graph)  # a plan lowered with plan_only=True may have absent weights
    target = Path(out_dir).resolve()
    check_output_dir(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with plan_tempdir(target) as tmp:
        weight_bytes: list[int] = []
        collectives: list[dict[str, Any]] = []
        for rank in range(lowered.world_size):
            names, nbytes = lowered.write_rank(rank, tmp)
            path = tmp / f"device_{rank}.onnx"
            validate_device_file(path, target / path.name)
            weight_bytes.append(nbytes)
            if on_rank is not None:
                on_rank(rank + 1, lowered.world_size)
            if rank == 0:
                collectives = names
        write_plan_json(tmp / "plan.json", plan_record(lowered, collectives, weight_bytes))
        replace_plan_files(tmp, target)
    return target


def write_plan_only(lowered: LoweredPlan, out_dir: str | Path) -> Path:
    """Write plan.json alone, atomically (as :func:`write_plan_dir`), marked ``plan_only``: ``explain`` reads
    it, ``run`` and ``check`` refuse it. Only rank 0's graph is built, without its weights, for the tensor
    names the collectives cut; ``weight_bytes_per_rank`` is left empty (nothing was written)."""
    assert lowered.plan_only, "lower(..., plan_only=True) makes a plan for write_plan_only"
    target = Path(out_dir).resolve()
    check_output_dir(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with plan_tempdir(target) as tmp:
        collectives = lowered.collective_names()
        write_plan_json(tmp / "plan.json", plan_record(lowered, collectives, []))
        replace_plan_files(tmp, target)
    return target
