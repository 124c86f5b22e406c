"""The pipeline driver (``optimize --pipeline``): the stage search alone (unity_eq.stages) over pipeline stages,
data replicas and tensor groups, microbatches, schedule, recomputation and ZeRO, then the plan directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from unity_eq.driver.request import OptimizeRequest, load_rules
from unity_eq.errors import InternalError
from unity_eq.ir import Graph
from unity_eq.lower import refuse_missing_weights
from unity_eq.machine import Machine
from unity_eq.stages.run import PipelineResult, graph_at_batch, plan_stages

__all__ = ["lower_stages", "optimize_pipeline"]

Progress = Callable[[str], None]


def optimize_pipeline(model: str | Path, request: OptimizeRequest, say: Progress) -> PipelineResult:
    """The stage search of ``request``. With an output folder, a plan directory: plan.json and one SPMD plan
    directory per pipeline stage (``stage<s>/``, unity_eq.lower.pipeline) that ``run`` and ``check`` run;
    ``plan_only`` writes plan.json alone (weights may then be absent). ``request.batch``: samples per step
    (default: the model's batch, dimension 0 of its inputs); ``request.only`` restricts the search to
    configurations with that many stages, devices per tensor group or microbatches per step."""
    rules = load_rules(request)
    say(f"loading {model}")
    batched = graph_at_batch(Path(model), request.input_shapes, request.batch, request.parameters)
    if request.lowers:  # before the search: lowering would refuse it, minutes later
        refuse_missing_weights(batched.graph_at(batched.micro_sizes[0]))
    say(f"machine {request.machine.describe()}; batch {batched.batch} per step")
    result = plan_stages(
        batched.graph_at,
        batched.batch,
        batched.micro_sizes,
        request.machine,
        request.objective,
        rules,
        request.limits,
        None if request.lowers else request.output_dir,
        say,
        request.only,
        static_batch=batched.static_batch,
        extractor=request.extractor.value,
    )
    if request.lowers:
        assert request.output_dir is not None
        return lower_stages(result, batched.graph_at, request.machine, request.output_dir, say)
    return result


def lower_stages(
    result: PipelineResult, graph_at: Callable[[int], Graph], machine: Machine, target: Path, say: Progress
) -> PipelineResult:
    """Write the chosen pipeline as a plan directory per pipeline stage and the top plan.json
    (unity_eq.lower.pipeline), each stage stitched from the piece plans the stage search priced (no second
    search): the result with the lowered record and the directory."""
    from unity_eq.lower.pipeline import lower_pipeline
    from unity_eq.split import split_graph

    best = result.search.best
    say(f"lowering {len(best.cuts)} stage(s), each on a tensor group of {best.config.tensor} device(s)")
    split = split_graph(graph_at(best.config.microbatch))
    if split is None:
        raise InternalError(f"the model no longer splits at microbatch {best.config.microbatch}")
    record = lower_pipeline(result.record, best, split, machine, target, say)
    return replace(result, record=record, plan_dir=target)
