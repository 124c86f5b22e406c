"""The lowering stage: ``lower`` checks a plan and prepares it (the stage of each collective, the plan's hash);
``write_plan_dir`` writes the plan directory, device files and plan.json, atomically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnx import helper

from unity_eq.errors import PlanError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.ir import Graph
from unity_eq.lower.device import LoweredPlan, validate_device_file
from unity_eq.lower.record import plan_hash, plan_record
from unity_eq.plan import AllGather, AllReduce, Plan, step_inputs, step_outputs
from unity_eq.planfile import write_plan_json


def collective_stages(plan: Plan) -> dict[str, int]:
    """Stage of every collective's output tensor: 1 + the stage of the collectives it depends on."""
    stage: dict[str, int] = {}
    result: dict[str, int] = {}
    for step in plan.steps:
        level = max((stage.get(i, 0) for i in step_inputs(step)), default=0)
        if isinstance(step, AllGather | AllReduce):
            result[step.out] = level
            level += 1
        for out in step_outputs(step):
            stage[out] = level
    return result


def lower(plan: Plan, graph: Graph) -> LoweredPlan:
    """Check the plan and prepare it for writing (device models are built when written)."""
    problems = plan.validate()
    if problems:
        raise PlanError("internal error: the extracted plan is inconsistent: " + "; ".join(problems[:3]))
    opsets = [helper.make_opsetid("", graph.opset)] + [helper.make_opsetid(d, v) for d, v in graph.extra_opsets.items()]
    ir_version = min(max(graph.ir_version, 8), 10)
    return LoweredPlan(plan, graph, collective_stages(plan), opsets, ir_version, plan_hash(plan, graph))


def write_plan_dir(
    lowered: LoweredPlan, out_dir: str | Path, on_rank: Callable[[int, int], None] | None = None
) -> Path:
    """Write the plan directory atomically: everything goes to a temporary sibling that replaces ``out_dir``
    only when complete, so a failure never leaves a half-written plan. Ranks are built, saved and dropped
    one at a time; ``on_rank(done, total)`` hears each one written (a large model takes a while per rank)."""
    # resolved: `-o .` names the folder by its real name (its sibling temporary folder, not one inside it),
    # and `-o link` writes where the link points instead of replacing the link by a folder
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
