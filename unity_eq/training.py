"""``optimize --objective training``: one planner for training, over SPMD plans and pipelines.

The SPMD search (``pipeline.optimize``) finds the best plan of the whole batch on the whole machine; the stage
search (``unity_eq.stages``) the best pipeline of two or more stages over the model's pieces. The SPMD plan is
the one-stage case: its step is priced as the stage search prices one (its forward and backward pass, with
its gradient all-reduces, once per microbatch it accumulates, plus the optimizer's update of the state a
device keeps: ``stages.state.optimizer_update_s``), and the cheaper of the two is written — the SPMD plan
directory, or the pipeline plan directory as ``optimize --pipeline`` writes it. On a tie the SPMD plan wins,
so the choice is never worse than the SPMD search's on the same workload.

Pipelines are not considered (the SPMD search alone runs, as before) when the model does not split into
pieces, when dimension 0 of its inputs is not a batch, or when an option forces the SPMD search (``--mesh``,
``--profile``, ``--weight-input``): the result says which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from unity_eq.cost import TRAINING
from unity_eq.egraph import Limits
from unity_eq.errors import InfeasiblePlanError, OptionError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.lower import refuse_missing_weights
from unity_eq.machine import Machine
from unity_eq.pipeline import (
    OptimizeResult,
    Progress,
    check_rule_files,
    lower_stages,
    machine_for,
    optimize,
    write_spmd,
)
from unity_eq.plan import Plan
from unity_eq.planfile import TrainingSearchRecord
from unity_eq.planfile.pipeline import SpmdRecord, write_pipeline_json
from unity_eq.progress import Tracker
from unity_eq.report import cost_breakdown
from unity_eq.rulesets import default_rule_files, load_rule_files
from unity_eq.split import split_graph
from unity_eq.stages.run import BatchedModel, PipelineResult, batch_blocker, graph_at_batch, plan_stages
from unity_eq.stages.search import static_batch_note
from unity_eq.stages.state import optimizer_update_s

__all__ = ["TrainingResult", "optimize_training", "spmd_step_s"]


@dataclass
class TrainingResult:
    """What the training search chose (``pipeline`` or ``spmd``) and what it compared."""

    chosen: str
    spmd: OptimizeResult | None  # the SPMD search's plan (None: no plan fits)
    spmd_step_s: float | None  # its step priced as the stage search prices one
    passes: int  # passes of the SPMD plan per step (a static batch smaller than the step's accumulates)
    staged: PipelineResult | None  # the stage search's best pipeline (None: none considered, or none fits)
    notes: list[str] = field(default_factory=list)  # why pipelines were not considered, the static batch, ...
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
    bandwidth = min(machine.devices[d].memory_bandwidth for d in plan.mesh.devices) * machine.efficiency
    update = optimizer_update_s(memory.weight_bytes + memory.weight_state_bytes, bandwidth)
    return passes * (plan.cost.total - gradient) + gradient + update


def optimize_training(
    model: str | Path,
    *,
    devices: int | None = None,
    machine: Machine | str | Path | None = None,
    nodes: int | None = None,
    interconnect: str | None = None,
    output_dir: str | Path | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    limits: Limits | None = None,
    rule_files: Sequence[Path] | None = None,
    generated_rules: bool = True,
    progress: Progress | None = None,
    plan_only: bool = False,
    max_axes: int = 3,
    blocks: str = "auto",
    extractor: str = "greedy",
    ilp_time_limit: float = 60.0,
    tracker: Tracker | None = None,
) -> TrainingResult:
    """Plan ``model``'s training over SPMD plans and pipelines and write the cheaper (module docstring).
    ``batch``: samples per step (a dynamic batch needs it, or ``input_shapes`` giving it; a static batch is
    the default and the microbatch). InfeasiblePlanError when neither an SPMD plan nor a pipeline fits."""
    say = progress or (lambda _msg: None)
    chosen_machine = machine_for(devices, machine, nodes, interconnect)
    if batch is not None and batch < 1:
        raise OptionError(f"`--batch` must be at least 1, got {batch}.")
    target = Path(output_dir) if output_dir is not None else None
    if target is not None:
        check_output_dir(target)
    if rule_files is not None:
        check_rule_files(rule_files)
    path = Path(model)
    notes: list[str] = []
    say(f"loading {path}")
    blocker = batch_blocker(path)
    batched: BatchedModel | None = None
    if blocker is not None:
        if batch is not None:
            raise OptionError(f"`--batch`: {blocker}")
        notes.append(f"pipelines not considered: {blocker}")
        from unity_eq.frontends.onnx import load_onnx

        graph = load_onnx(path, input_shapes)
    else:
        batched = graph_at_batch(path, input_shapes, batch)
        graph = batched.graph_at(batched.static_batch or batched.batch)  # the whole batch, or the static one
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
    if target is not None and not plan_only:
        refuse_missing_weights(graph)  # before the searches: lowering would refuse it, minutes later
    spmd, spmd_error = None, None
    try:
        spmd = optimize(
            graph,
            machine=chosen_machine,
            objective="training",
            max_axes=max_axes,
            limits=limits,
            rule_files=rule_files,
            generated_rules=generated_rules,
            progress=say,
            blocks=blocks,
            extractor=extractor,
            ilp_time_limit=ilp_time_limit,
            tracker=tracker,
        )
    except InfeasiblePlanError as exc:  # reported: a pipeline may fit where no SPMD plan does
        spmd_error = str(exc)
        say(f"SPMD search: {exc}")
    spmd_step = spmd_step_s(spmd.plan, chosen_machine, passes) if spmd is not None else None
    staged = None
    if batched is not None:
        staged = _stage_search(batched, chosen_machine, say, notes, limits, rule_files, generated_rules, extractor)
    piped = staged.search.best.step_s if staged is not None else None
    if spmd_step is None and piped is None:
        raise InfeasiblePlanError(" ".join(m for m in (spmd_error, *notes[-1:]) if m) or "no plan fits.")
    chosen = "pipeline" if piped is not None and (spmd_step is None or piped < spmd_step * (1 - 1e-9)) else "spmd"
    if chosen == "spmd" and passes > 1:
        notes.append(
            f"the SPMD plan is one pass of {static} samples (the model's static batch): a step runs it {passes} "
            "times, accumulating the gradients"
        )
    result = TrainingResult(chosen, spmd, spmd_step, passes, staged, notes)
    if staged is not None:
        staged.record = replace(staged.record, spmd=_spmd_record(spmd, spmd_step, passes, spmd_error))
    if target is not None:
        _write(result, target, plan_only, batched, chosen_machine, say, tracker, limits, rule_files, generated_rules)
    return result


def _stage_search(
    batched: BatchedModel,
    machine: Machine,
    say: Progress,
    notes: list[str],
    limits: Limits | None,
    rule_files: Sequence[Path] | None,
    generated_rules: bool,
    extractor: str = "greedy",
) -> PipelineResult | None:
    """The stage search over pipelines of two or more stages; None (with a note saying why) when no layout has
    two stages or none fits."""
    rules = load_rule_files(list(rule_files) if rule_files is not None else default_rule_files(generated_rules))
    try:
        return plan_stages(
            batched.graph_at,
            batched.batch,
            batched.micro_sizes,
            machine,
            TRAINING,
            rules,
            limits,
            None,
            say,
            min_stages=2,
            static_batch=batched.static_batch,
            extractor=extractor,
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
    target: Path,
    plan_only: bool,
    batched: BatchedModel | None,
    machine: Machine,
    say: Progress,
    tracker: Tracker | None,
    limits: Limits | None,
    rule_files: Sequence[Path] | None,
    generated_rules: bool,
) -> None:
    """The chosen plan's directory: the SPMD plan's, or the pipeline's (plan.json alone with ``plan_only``)."""
    if result.chosen == "spmd":
        spmd = result.spmd
        assert spmd is not None and result.spmd_step_s is not None
        best = result.staged.search.best.config.describe() if result.staged is not None else None
        record = TrainingSearchRecord(
            step_s=result.spmd_step_s,
            passes=result.passes,
            pipeline_step_s=result.pipeline_step_s,
            pipeline=best,
            notes=tuple(result.notes),
        )
        spmd.plan.report = replace(spmd.plan.report, training_search=record)
        write_spmd(spmd, target, plan_only, say, tracker)
        result.plan_dir = spmd.plan_dir
        return
    staged = result.staged
    assert staged is not None and batched is not None
    if plan_only:
        with plan_tempdir(target) as tmp:
            write_pipeline_json(tmp / "plan.json", staged.record)
            replace_plan_files(tmp, target)
        staged.plan_dir = target
    else:
        lower_stages(staged, batched.graph_at, machine, target, say)
    result.plan_dir = target
