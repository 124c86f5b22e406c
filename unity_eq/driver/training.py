"""``optimize --objective training``: one planner for training, over SPMD plans and pipelines.

The SPMD search (``unity_eq.driver.spmd``) finds the best plan of the whole batch on the whole machine; the stage
search (``unity_eq.stages``) the best pipeline of two or more stages over the model's pieces. The SPMD plan is
the one-stage case: its step is priced as the stage search prices one (its forward and backward pass, with
its gradient all-reduces, once per microbatch it accumulates, plus the optimizer's update of the state a
device keeps: ``CostModel.optimizer_update``), and the cheaper of the two is written — the SPMD plan
directory, or the pipeline plan directory as ``optimize --pipeline`` writes it. On a tie the SPMD plan wins,
so the choice is never worse than the SPMD search's on the same workload.

Pipelines are not considered (the SPMD search alone runs, as before) when the model does not split into
pieces, when dimension 0 of its inputs is not a batch, or when an option forces the SPMD search (``--mesh``,
``--profile``, ``--weight-input``): the result says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from unity_eq.cost import CROSS_SEARCH_EPSILON, CostModel, cheaper
from unity_eq.driver.request import OptimizeRequest, load_rules
from unity_eq.driver.spmd import OptimizeResult, plan_spmd, with_training, write_spmd
from unity_eq.driver.staged import lower_stages
from unity_eq.errors import InfeasiblePlanError, OptionError
from unity_eq.files import plan_tempdir, replace_plan_files
from unity_eq.ir import Graph
from unity_eq.lower import refuse_missing_weights
from unity_eq.machine import Machine
from unity_eq.plan import Plan
from unity_eq.planfile import TrainingSearchRecord
from unity_eq.planfile.pipeline import SpmdRecord, write_pipeline_json
from unity_eq.progress import Tracker
from unity_eq.report import cost_breakdown
from unity_eq.split import split_graph
from unity_eq.stages.config import static_batch_note
from unity_eq.stages.run import BatchedModel, PipelineResult, batch_blocker, graph_at_batch, plan_stages

__all__ = ["TrainingResult", "optimize_training", "spmd_step_s"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TrainingResult:
    """What the training search chose (``pipeline`` or ``spmd``) and what it compared."""

    chosen: str
    spmd: OptimizeResult | None  # the SPMD search's plan (None: no plan fits)
    spmd_step_s: float | None  # its step priced as the stage search prices one
    passes: int  # passes of the SPMD plan per step (a static batch smaller than the step's accumulates)
    staged: PipelineResult | None  # the stage search's best pipeline (None: none considered, or none fits)
    notes: tuple[str, ...] = field(default_factory=tuple)  # why pipelines were not considered, the static batch
    plan_dir: Path | None = None

    @property
    def pipeline_step_s(self) -> float | None:
        return self.staged.search.best.step_s if self.staged is not None else None

    @property
    def step_s(self) -> float:
        """The chosen plan's step."""
        step = self.pipeline_step_s if self.chosen == "pipeline" else self.spmd_step_s
        assert step is not None
        return step


def spmd_step_s(plan: Plan, machine: Machine, passes: int = 1) -> float:
    """The SPMD plan's training step as the stage search prices one: ``passes`` forward and backward passes
    (a static batch accumulated), their gradient all-reduces once, and the optimizer's update of the weights
    and state each device keeps, at the slowest device's memory bandwidth."""
    breakdown = cost_breakdown(plan)
    gradient = sum(t.gradient_s for t in (breakdown.communication_by_axis or {}).values())
    memory = plan.report.memory
    assert memory is not None  # the search records it
    trainable = memory.weight_bytes if memory.gradient_bytes is None else memory.gradient_bytes  # constants: no update
    update = CostModel(machine, plan.mesh, plan.objective).optimizer_update(trainable + memory.weight_state_bytes)
    return passes * (plan.cost.total - gradient) + gradient + update


def optimize_training(
    model: str | Path, request: OptimizeRequest, say: Progress, tracker: Tracker | None = None
) -> TrainingResult:
    """Plan ``model``'s training over SPMD plans and pipelines and write the cheaper (module docstring).
    ``request.batch``: samples per step (a dynamic batch needs it, or ``input_shapes`` giving it; a static
    batch is the default and the microbatch). InfeasiblePlanError when neither an SPMD plan nor a pipeline
    fits."""
    path = Path(model)
    notes: list[str] = []
    say(f"loading {path}")
    graph, batched = _load(path, request, notes)
    static = batched.static_batch if batched is not None else None
    passes = batched.batch // static if batched is not None and static else 1
    if batched is not None and batched.static_batch is not None:
        notes.append(static_batch_note(batched.static_batch))
    if batched is not None and split_graph(graph) is None:
        notes.append(
            "pipelines not considered: the model does not split into pieces (no tensor is alone live between "
            "its layers)"
        )
        batched = None
    if request.lowers:
        refuse_missing_weights(graph)  # before the searches: lowering would refuse it, minutes later
    spmd, spmd_error = None, None
    try:
        spmd = plan_spmd(graph, request, say, tracker, write=False)
    except InfeasiblePlanError as exc:  # reported: a pipeline may fit where no SPMD plan does
        spmd_error = str(exc)
        say(f"SPMD search: {exc}")
    spmd_step = spmd_step_s(spmd.plan, request.machine, passes) if spmd is not None else None
    staged = _stage_search(batched, request, say, notes) if batched is not None else None
    piped = staged.search.best.step_s if staged is not None else None
    if spmd_step is None and piped is None:
        raise InfeasiblePlanError(" ".join(m for m in (spmd_error, *notes[-1:]) if m) or "no plan fits.")
    chosen = (
        "pipeline"
        if piped is not None and (spmd_step is None or cheaper(piped, spmd_step, CROSS_SEARCH_EPSILON))
        else "spmd"
    )
    if chosen == "spmd" and passes > 1:
        notes.append(
            f"the SPMD plan is one pass of {static} samples (the model's static batch): a step runs it {passes} "
            "times, accumulating the gradients"
        )
    if staged is not None:
        staged = replace(staged, record=replace(staged.record, spmd=_spmd_record(spmd, spmd_step, passes, spmd_error)))
    result = TrainingResult(chosen, spmd, spmd_step, passes, staged, tuple(notes))
    if request.output_dir is not None:
        return _write(result, request, batched, say, tracker)
    return result


def _load(path: Path, request: OptimizeRequest, notes: list[str]) -> tuple[Graph, BatchedModel | None]:
    """The model at the step's batch (or its static one), and the model at any microbatch when it can be cut
    into microbatches (else None, with a note saying why)."""
    blocker = batch_blocker(path)
    if blocker is not None:
        if request.batch is not None:
            raise OptionError(f"`--batch`: {blocker}")
        notes.append(f"pipelines not considered: {blocker}")
        from unity_eq.frontends.onnx import load_onnx

        graph = load_onnx(path, request.input_shapes)
        return (graph if request.parameters is None else graph.with_parameters(request.parameters)), None
    batched = graph_at_batch(path, request.input_shapes, request.batch, request.parameters)
    return batched.graph_at(batched.static_batch or batched.batch), batched  # the whole batch, or the static one


def _stage_search(
    batched: BatchedModel, request: OptimizeRequest, say: Progress, notes: list[str]
) -> PipelineResult | None:
    """The stage search over pipelines of two or more stages; None (with a note saying why) when no layout has
    two stages or none fits."""
    try:
        return plan_stages(
            batched.graph_at,
            batched.batch,
            batched.micro_sizes,
            request.machine,
            request.objective,
            load_rules(request),
            request.limits,
            None,
            say,
            min_stages=2,
            static_batch=batched.static_batch,
            extractor=request.extractor.value,
        )
    except (OptionError, InfeasiblePlanError) as exc:  # reported: the summary says why no pipeline was chosen
        notes.append(f"no pipeline: {exc}")
        say(f"stage search: {exc}")
        return None


def _spmd_record(spmd: OptimizeResult | None, step: float | None, passes: int, error: str | None) -> SpmdRecord:
    if spmd is None or step is None:
        return SpmdRecord(mesh=None, step_s=None, cost_s=None, passes=passes, note=error)
    return SpmdRecord(mesh=str(spmd.plan.mesh), step_s=step, cost_s=spmd.plan.cost.total, passes=passes)


def _write(
    result: TrainingResult,
    request: OptimizeRequest,
    batched: BatchedModel | None,
    say: Progress,
    tracker: Tracker | None,
) -> TrainingResult:
    """The chosen plan's directory: the SPMD plan's, or the pipeline's (plan.json alone with ``plan_only``)."""
    target = request.output_dir
    assert target is not None
    if result.chosen == "spmd":
        assert result.spmd is not None and result.spmd_step_s is not None
        best = result.staged.search.best.config.describe() if result.staged is not None else None
        record = TrainingSearchRecord(
            step_s=result.spmd_step_s,
            passes=result.passes,
            pipeline_step_s=result.pipeline_step_s,
            pipeline=best,
            notes=result.notes,
        )
        spmd = write_spmd(with_training(result.spmd, record), target, request.plan_only, say, tracker)
        return replace(result, spmd=spmd, plan_dir=spmd.plan_dir)
    staged = result.staged
    assert staged is not None and batched is not None
    if request.plan_only:
        with plan_tempdir(target) as tmp:
            write_pipeline_json(tmp / "plan.json", staged.record)
            replace_plan_files(tmp, target)
        staged = replace(staged, plan_dir=target)
    else:
        staged = lower_stages(staged, batched.graph_at, request.machine, target, say)
    return replace(result, staged=staged, plan_dir=target)
