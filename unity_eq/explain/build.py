"""Reading a plan for ``explain`` (:func:`load_plan`, :func:`reading_plan`) and building its report
(:func:`report_of`, :func:`explain`): the ops and their sharding, the traffic, the baselines in order, the PCG and
notes on ops that stayed replicated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from unity_eq.collectives import BY_RECORD_KIND
from unity_eq.errors import PlanError
from unity_eq.explain.explanation import Explanation, OpInput, OpRow, TrafficRow
from unity_eq.explain.pcg import named, pcg_lines, tensor_kinds
from unity_eq.ops.registry import rule_file_for, spec_for
from unity_eq.planfile import (
    CollectiveStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    TensorRecord,
    read_explain_record,
)

BASELINE_ORDER = ("one_device", "data_parallel", "tensor_parallel")


def plan_json_path(plan_dir: str | Path) -> Path:
    root = Path(plan_dir)
    return root / "plan.json" if root.is_dir() else root


def load_plan(plan_dir: str | Path) -> ExplainRecord:
    """The records explain reads from the plan.json of ``plan_dir`` (or that plan.json), checked."""
    root = Path(plan_dir)
    path = plan_json_path(root)
    if not path.exists():
        raise PlanError(f"{root}: no plan.json. Pass the directory written by `unity-eq optimize`.")
    return read_explain_record(path)  # the checks `run` makes, and the types of every field explain reads


@contextmanager
def reading_plan(plan_dir: str | Path) -> Iterator[None]:
    """Last resort around code that reads a checked plan.json: a field of a shape `read_explain_record` does
    not cover becomes a PlanError naming the file, with the original exception chained (``__cause__``), so a
    bug in explain is not hidden: its message says to report it when plan.json is as optimize wrote it."""
    try:
        yield
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise PlanError(
            f"{plan_json_path(plan_dir)}: a field has an unexpected value ({type(exc).__name__}: {exc}). "
            "Re-run `unity-eq optimize`; if plan.json is as optimize wrote it, report this as a bug."
        ) from exc


def explain(plan_dir: str | Path) -> Explanation:
    """The explain report of a plan directory (or a plan.json)."""
    plan = load_plan(plan_dir)
    with reading_plan(plan_dir):
        return report_of(plan)


def _placement(axes: tuple[str, ...], tensor: TensorRecord | None) -> dict[str, str]:
    return dict(zip(axes, tensor.placement if tensor else (), strict=False))


#: how each step that communicates is shown (a replicated weight's gradient is all-reduced: said apart)
def _traffic(step: CollectiveStepRecord, source: str | None) -> str:
    """What a communicating step's traffic is, in its kind's words: ``all-gather`` in the forward pass,
    ``gradient all-gather (backward)``, ``gradient all-reduce (weight)``…"""
    kind = BY_RECORD_KIND[step.KIND]
    if kind.communicates or kind.backward_op is None:
        return kind.label
    if kind.weight_gradient:
        return f"gradient {kind.backward_op} ({'weight' if source == 'weight' else 'activation, backward'})"
    return f"gradient {kind.backward_op} (backward)"


def report_of(plan: ExplainRecord) -> Explanation:
    """The explain report of a plan.json already read (``explain --format html`` draws from both)."""
    axes = plan.mesh.axes
    tensors = plan.tensors
    kinds = tensor_kinds(plan.steps)
    total = (plan.cost.total_s if plan.cost else None) or 0.0

    ops = []
    for index, step in enumerate(plan.steps):
        if not isinstance(step, ComputeStepRecord):
            continue
        outs = [o for o in step.outputs if o]
        out = outs[0] if outs else ""
        t = tensors.get(out)
        ops.append(
            OpRow(
                step=index,
                op=step.op,
                output=out,
                source=named(t),
                placement=_placement(axes, t),
                shape=t.shape if t else None,
                local_shape=t.local_shape if t else None,
                inputs=tuple(
                    OpInput(i, _placement(axes, tensors[i])) for i in step.inputs if isinstance(i, str) and i in tensors
                ),
                compute_s=step.compute_s,
                node=step.node,
            )
        )

    communication = []
    for index, step in enumerate(plan.steps):
        seconds = step.communication_s or 0.0
        if seconds <= 0:
            continue
        moved = None if isinstance(step, ComputeStepRecord) else step.out
        src = step.src if isinstance(step, CollectiveStepRecord) else ""
        kind = _traffic(step, kinds.get(src)) if isinstance(step, CollectiveStepRecord) else step.KIND
        communication.append(
            TrafficRow(
                step=index,
                kind=kind,
                axis=step.axis if isinstance(step, CollectiveStepRecord) else None,
                tensor=moved,
                of=named(tensors.get(src)) or src,
                seconds=seconds,
            )
        )

    baselines = tuple((name, plan.baselines[name]) for name in BASELINE_ORDER if name in plan.baselines)
    return Explanation(
        model=plan.model.name,
        machine=plan.machine.name if plan.machine else None,
        objective=plan.objective,
        mesh_label=plan.mesh.label + _on_devices(plan),
        axis_names=axes,
        axes=plan.machine.mesh_axes if plan.machine else (),
        cost=plan.cost,
        memory=plan.memory.usage if plan.memory else None,
        baselines=baselines,
        mesh_search=plan.mesh_search,
        parallelism=plan.parallelism,
        extraction=plan.extraction,
        ops=tuple(ops),
        communication=tuple(communication),
        pcg=tuple(pcg_lines(plan, kinds)),
        notes=tuple(([PLAN_ONLY_NOTE] if plan.plan_only else []) + _training_notes(plan) + _notes(ops, total)),
    )


def _training_notes(plan: ExplainRecord) -> list[str]:
    """What ``optimize --objective training`` compared this SPMD plan with (docs/pipeline.md)."""
    found = plan.training_search
    if found is None:
        return []
    passes = f" over {found.passes} accumulated passes" if found.passes > 1 else ""
    text = (
        f"the training search chose this SPMD plan: {found.step_s * 1e3:.3f} ms per step{passes} with the "
        "optimizer's update"
    )
    if found.pipeline_step_s is not None:
        text += (
            f"; the best pipeline ({found.pipeline}) {found.pipeline_step_s * 1e3:.3f} ms, "
            f"{found.pipeline_step_s / found.step_s:.2f}×"
        )
    return [text, *found.notes]


#: explain's note on a plan written by ``optimize --plan-only`` (its plan.json says ``plan_only: true``)
PLAN_ONLY_NOTE = (
    "plan only: `optimize --plan-only` wrote plan.json alone, no device files; to run or check the plan, "
    "re-run `unity-eq optimize` without `--plan-only`, with the model's weight data present"
)


def _on_devices(plan: ExplainRecord) -> str:
    """`` on devices 0-3`` when the plan leaves some of the machine's devices idle, else ""."""
    if not (plan.parallelism and plan.parallelism.idle_devices):
        return ""
    from unity_eq.report import device_span

    return " on " + device_span([r.device for r in plan.mesh.ranks])


def _notes(ops: list[OpRow], total: float) -> list[str]:
    """Op types that stayed replicated on every axis while the plan shards others, with the file to extend."""
    sharded_any = any(any(p != "R" for p in op.placement.values()) for op in ops)
    if not sharded_any:
        return []
    by_type: dict[str, list[OpRow]] = {}
    for op in ops:
        by_type.setdefault(op.op, []).append(op)
    notes = []
    for op_type, found in sorted(by_type.items()):
        if any(any(p != "R" for p in op.placement.values()) for op in found):
            continue
        share = sum(op.compute_s or 0.0 for op in found)
        if total and share < 0.01 * total:
            continue
        spec = spec_for(op_type)
        if spec is None:
            where = "it has no typed constructor: add its family to unity_eq/ops/ (docs/architecture.md)"
        else:
            where = f"extend {rule_file_for(op_type)}"
        notes.append(
            f"{op_type} ×{len(found)} stayed replicated on every axis ({share * 1e3:.3f} ms of compute); "
            f"to shard it, {where}"
        )
    return notes
