"""``unity-eq explain plan/``: what a plan does and what it costs, read from plan.json alone.

The report has the mesh and how its axes sit on the machine, the cost split (compute, communication by axis
and phase, the training overlap, memory per device), the baselines priced at optimize time (one device,
data parallel, best single-axis tensor parallel) with their ratio to the plan, the meshes the search tried,
the sharding of every op, a text picture of the parallel computation graph and notes on ops that stayed
replicated. :func:`explain` returns it as plain data (``--json`` prints that); :func:`render` makes the text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing_extensions import assert_never

from unity_eq.errors import PlanError
from unity_eq.ops.registry import rule_file_for, spec_for
from unity_eq.planfile import (
    AxisRecord,
    BaselineRecord,
    CombineStepRecord,
    ComputeStepRecord,
    CostRecord,
    ExplainRecord,
    ExtractionRecord,
    InputStepRecord,
    MemoryUsageRecord,
    MeshSearchRecord,
    ParallelismRecord,
    PartitionStepRecord,
    ReduceStepRecord,
    ReplicateStepRecord,
    StepRecord,
    TensorRecord,
    WeightStepRecord,
    read_explain_record,
)

__all__ = [
    "Explanation",
    "OpInput",
    "OpRow",
    "TrafficRow",
    "explain",
    "load_plan",
    "reading_plan",
    "render",
    "report_of",
    "tensor_bytes",
]

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


# ----------------------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True)
class OpInput:
    tensor: str
    placement: Mapping[str, str]  # mesh axis -> placement


@dataclass(frozen=True)
class OpRow:
    """One compute step: its op, the tensor it makes (with the source model's name) and their placements."""

    step: int
    op: str
    output: str
    source: str | None
    placement: Mapping[str, str]
    shape: tuple[int, ...] | None
    local_shape: tuple[int, ...] | None
    inputs: tuple[OpInput, ...]
    compute_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "op": self.op,
            "output": self.output,
            "source": self.source,
            "placement": dict(self.placement),
            "shape": None if self.shape is None else list(self.shape),
            "local_shape": None if self.local_shape is None else list(self.local_shape),
            "inputs": [{"tensor": i.tensor, "placement": dict(i.placement)} for i in self.inputs],
            "compute_s": self.compute_s,
        }


@dataclass(frozen=True)
class TrafficRow:
    """One step that communicates: the collective, its mesh axis, the tensor it moves and its time."""

    step: int
    kind: str
    axis: str | None
    tensor: str | None
    of: str  # the source model's tensor it moves (a piece of)
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "kind": self.kind,
            "axis": self.axis,
            "tensor": self.tensor,
            "of": self.of,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class Explanation:
    """The explain report: what :func:`render` prints and ``--json`` writes (:meth:`to_json`)."""

    model: str
    machine: str | None
    objective: str | None
    mesh_label: str  # ``x=2,y=4``, and `` on devices 0-3`` when the plan leaves devices idle
    axis_names: tuple[str, ...]
    axes: tuple[AxisRecord, ...]  # how the mesh axes sit on the machine (none when plan.json has no machine)
    cost: CostRecord | None
    memory: MemoryUsageRecord | None
    baselines: tuple[tuple[str, BaselineRecord], ...]  # in BASELINE_ORDER
    mesh_search: MeshSearchRecord | None
    parallelism: ParallelismRecord | None
    extraction: ExtractionRecord | None
    ops: tuple[OpRow, ...]
    communication: tuple[TrafficRow, ...]
    pcg: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def total_s(self) -> float | None:
        return self.cost.total_s if self.cost else None

    @property
    def compute_s(self) -> float | None:
        return self.cost.compute_s if self.cost else None

    @property
    def communication_s(self) -> float | None:
        return self.cost.communication_s if self.cost else None

    def to_json(self) -> dict[str, Any]:
        axes = [a.to_json() for a in self.axes] if self.axes else [{"name": a} for a in self.axis_names]
        return {
            "model": self.model,
            "machine": self.machine,
            "objective": self.objective,
            "mesh": {"label": self.mesh_label, "axes": axes},
            "cost": self.cost.to_json() if self.cost else {},
            "memory": self.memory.to_json() if self.memory else {},
            "baselines": [{"name": name, **b.to_json()} for name, b in self.baselines],
            "plan_vs_baselines": {name: b.ratio for name, b in self.baselines},
            "mesh_search": self.mesh_search.to_json() if self.mesh_search else {},
            "parallelism": self.parallelism.to_json() if self.parallelism else {},
            "extraction": self.extraction.to_json() if self.extraction else {},
            "ops": [op.to_json() for op in self.ops],
            "communication": [row.to_json() for row in self.communication],
            "pcg": list(self.pcg),
            "notes": list(self.notes),
        }


def _kinds(steps: tuple[StepRecord, ...]) -> dict[str, str]:
    """'weight', 'input' or 'activation' for every tensor; slices and replicas keep their source's kind."""
    kinds: dict[str, str] = {}
    for step in steps:
        match step:
            case WeightStepRecord():
                kinds[step.out] = "weight"
            case InputStepRecord():
                kinds[step.out] = "input"
            case PartitionStepRecord() | ReplicateStepRecord():
                kinds[step.out] = kinds.get(step.src, "activation")
            case ComputeStepRecord():
                for out in step.outputs:
                    if out:
                        kinds[out] = "activation"
            case CombineStepRecord() | ReduceStepRecord():
                kinds[step.out] = "activation"
            case _:
                assert_never(step)
    return kinds


def explain(plan_dir: str | Path) -> Explanation:
    """The explain report of a plan directory (or a plan.json)."""
    plan = load_plan(plan_dir)
    with reading_plan(plan_dir):
        return report_of(plan)


def _placement(axes: tuple[str, ...], tensor: TensorRecord | None) -> dict[str, str]:
    return dict(zip(axes, tensor.placement if tensor else (), strict=False))


def _named(tensor: TensorRecord | None) -> str | None:
    """The source model's name of what a plan tensor holds, if it has one."""
    return (tensor.value or tensor.source) if tensor else None


#: how each step that communicates is shown (a replicated weight's gradient is all-reduced: said apart)
_TRAFFIC = {
    "combine": "all-gather",
    "reduce": "all-reduce",
    "partition": "gradient all-gather (backward)",
    "replicate": "gradient all-reduce",
}


def report_of(plan: ExplainRecord) -> Explanation:
    """The explain report of a plan.json already read (``explain --format html`` draws from both)."""
    axes = plan.mesh.axes
    tensors = plan.tensors
    kinds = _kinds(plan.steps)
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
                source=_named(t),
                placement=_placement(axes, t),
                shape=t.shape if t else None,
                local_shape=t.local_shape if t else None,
                inputs=tuple(
                    OpInput(i, _placement(axes, tensors[i])) for i in step.inputs if isinstance(i, str) and i in tensors
                ),
                compute_s=step.compute_s,
            )
        )

    communication = []
    for index, step in enumerate(plan.steps):
        seconds = step.communication_s or 0.0
        if seconds <= 0:
            continue
        moved = None if isinstance(step, ComputeStepRecord) else step.out
        src = step.src if isinstance(step, _MOVES) else ""
        kind = _TRAFFIC.get(step.KIND, step.KIND)
        if isinstance(step, ReplicateStepRecord):
            kind += " (weight)" if kinds.get(src) == "weight" else " (activation, backward)"
        communication.append(
            TrafficRow(
                step=index,
                kind=kind,
                axis=step.axis if isinstance(step, _MOVES) else None,
                tensor=moved,
                of=_named(tensors.get(src)) or src,
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
        notes=tuple(_notes(ops, total)),
    )


#: the steps that move a tensor along a mesh axis
_MOVES = PartitionStepRecord | CombineStepRecord | ReduceStepRecord | ReplicateStepRecord


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


def _fmt_placement(placement: tuple[str, ...], axes: tuple[str, ...]) -> str:
    return " ".join(f"{a}:{p}" for a, p in zip(axes, placement, strict=False))


def _fmt_shape(shape: tuple[int, ...] | None) -> str:
    return "[" + ",".join(str(d) for d in shape or []) + "]"


def pcg_lines(plan: ExplainRecord, kinds: dict[str, str] | None = None) -> list[str]:
    """A text picture of the PCG: one line per op and per collective, weights folded into their last slice.

    ``=>`` marks a collective in the forward pass, ``<=`` one in the backward pass (training only).
    """
    axes = plan.mesh.axes
    tensors = plan.tensors
    kinds = kinds or _kinds(plan.steps)
    training = plan.training
    name_of = {tid: _named(t) or tid for tid, t in tensors.items()}

    def label(tid: str) -> str:
        return name_of.get(tid, tid)

    gradients: dict[str, list[float]] = {}  # axis -> [count, bytes, seconds]
    summed: set[str] = set()  # weight pieces whose gradient is all-reduced
    lines = []
    for step in plan.steps:
        match step:
            case WeightStepRecord():
                pass
            case InputStepRecord():
                lines.append(f"  input  {step.name} {_fmt_shape(tensors[step.out].shape)}")
            case ComputeStepRecord():
                outs = [o for o in step.outputs if o]
                t = tensors[outs[0]] if outs else None
                args = []
                for i in step.inputs:
                    if isinstance(i, str) and i in tensors:
                        arg = label(i)
                        if kinds.get(i) == "weight":
                            arg += "{" + ",".join(tensors[i].placement) + "}" + ("Σ" if i in summed else "")
                        args.append(arg)
                lines.append(
                    f"  {step.op:<12} {label(outs[0]) if outs else '?'} "
                    f"{_fmt_placement(t.placement if t else (), axes)} "
                    f"local {_fmt_shape(t.local_shape if t else ())} <- {', '.join(args)}"
                )
            case PartitionStepRecord():
                if kinds.get(step.src) == "activation":
                    back = f", backward all-gather {_us(step)}" if training else ""
                    lines.append(f"  slice        {label(step.src)} dim {step.dim} on {step.axis}{back}")
            case CombineStepRecord():
                lines.append(
                    f"=> all-gather  {label(step.out)} dim {step.dim} on {step.axis} "
                    f"({_mib(tensors[step.out])}, {_us(step)})"
                )
            case ReduceStepRecord():
                lines.append(
                    f"=> all-reduce  {label(step.out)} on {step.axis} ({_mib(tensors[step.out])}, {_us(step)})"
                )
            case ReplicateStepRecord():
                if not (training and (step.communication_s or 0) > 0):
                    continue
                if kinds.get(step.src) == "weight":
                    summed.add(step.out)
                    entry = gradients.setdefault(step.axis, [0, 0.0, 0.0])
                    entry[0] += 1
                    entry[1] += tensor_bytes(tensors[step.src])
                    entry[2] += step.communication_s or 0.0
                else:
                    lines.append(
                        f"<= all-reduce  activation gradient of {label(step.src)} on {step.axis} "
                        f"({_mib(tensors[step.src])}, {_us(step)})"
                    )
            case _:
                assert_never(step)
    for axis, (count, nbytes, seconds) in gradients.items():
        lines.append(
            f"<= all-reduce  gradients of {int(count)} weights (marked Σ) on {axis} "
            f"({nbytes / 2**20:.2f} MiB, {seconds * 1e6:.1f} µs)"
        )
    return lines


_ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2}


def tensor_bytes(t: TensorRecord) -> float:
    """Bytes of one rank's piece of a plan.json tensor (its local shape)."""
    numel = 1
    for d in t.local_shape:
        numel *= d
    return float(numel * _ITEMSIZE.get(t.dtype, 1))


def _mib(t: TensorRecord) -> str:
    return f"{tensor_bytes(t) / 2**20:.2f} MiB"


def _us(step: StepRecord) -> str:
    return f"{(step.communication_s or 0.0) * 1e6:.1f} µs"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def render(report: Explanation, max_ops: int = 60) -> str:
    """The explain report as text."""
    out: list[str] = []
    out.append(f"plan for {report.model} on {report.machine} ({report.objective})")
    out.append(f"mesh {report.mesh_label}")
    for axis in report.axes:
        where = (
            f"across {axis.nodes} nodes, {axis.ranks_per_node} rank(s) per node"
            if axis.spans_nodes
            else "inside a node"
        )
        bandwidth = f", {axis.bandwidth_gbs:g} GB/s" if axis.bandwidth_gbs else ""
        out.append(f"  axis {axis.name}: {axis.size} devices, {where} ({axis.link}{bandwidth})")
    usage = report.parallelism
    if usage:
        out.append(
            f"devices used: {usage.devices_used} of {usage.machine_devices}"
            + (f": {usage.note}" if usage.note else ", every one doing distinct work")
        )

    cost = report.cost
    total, compute, communication = report.total_s, report.compute_s, report.communication_s
    out.append("")
    out.append(f"predicted cost per step: {_ms(total)} = compute {_ms(compute)} + communication {_ms(communication)}")
    for axis_name, parts in ((cost.communication_by_axis if cost else None) or {}).items():
        out.append(
            f"  axis {axis_name}: forward {_ms(parts.forward_s)}, backward {_ms(parts.backward_s)}, "
            f"weight gradients {_ms(parts.gradient_s)}"
        )
    overlap = cost.overlap if cost else None
    if overlap:
        out.append(
            f"  gradient all-reduce {_ms(overlap.gradient_all_reduce_s)}, of which "
            f"{_ms(overlap.overlappable_s)} can overlap the backward pass ({_ms(overlap.exposed_s)} exposed)"
        )
    memory = report.memory
    if memory:
        fits = "fits" if memory.fits else "DOES NOT FIT"
        out.append(
            f"memory per device: {_gib(memory.total_bytes)} of {_gib(memory.capacity_bytes)} usable "
            f"({fits}): weights {_gib(memory.weight_bytes)}, gradients + optimizer "
            f"{_gib(memory.weight_state_bytes)}, activations {_gib(memory.activation_bytes)}"
        )
    extraction = report.extraction
    if extraction:
        out.append(f"extraction: {extraction.method}; memory: {extraction.memory_handling}")
        choice, tie_break = extraction.plan_choice, extraction.tie_break
        cheaper = choice.cheaper_baseline
        for note in (choice.note, cheaper.note if cheaper else None, tie_break.note if tie_break else None):
            if note:
                out.append(f"note: {note}")

    if report.baselines:
        out.append("")
        out.append("baselines (same model, same cost model)        total       compute     comm        memory    ×plan")
        out.append(
            f"  {'this plan':<44} {_ms(total):>11} {_ms(compute):>11} "
            f"{_ms(communication):>11} {_gib(memory.total_bytes if memory else None):>9}  1.00"
        )
        for name, b in report.baselines:
            flag = "" if b.fits else " (does not fit)"
            out.append(
                f"  {name + ' [' + b.mesh + ']':<44} {_ms(b.total_s):>11} {_ms(b.compute_s):>11} "
                f"{_ms(b.communication_s):>11} {_gib(b.memory_bytes):>9}  "
                f"{'-' if b.ratio is None else f'{b.ratio:.2f}'}{flag}"
            )
            used, devices = b.devices_used, b.devices
            share = f" ({used} of {devices} devices do distinct work)" if used and devices and used < devices else ""
            out.append(f"      {b.description}{share}")

    search = report.mesh_search
    if search and search.tried:
        out.append("")
        out.append(f"meshes tried (chosen {search.chosen}):")
        width = max([14, *(len(t.mesh) for t in search.tried), *(len(t.mesh) for t in search.skipped)])
        for t in search.tried:
            cost_text = _ms(t.cost_s) if t.cost_s is not None else t.status
            extra = " (baseline only)" if t.baseline_only else ""
            if t.egraph_of:
                extra += f" (the e-graph of {t.egraph_of}, nothing partitioned)"
            saturate, extract = (t.seconds.saturate, t.seconds.extract) if t.seconds else (0, 0)
            out.append(
                f"  {t.mesh:<{width}} {cost_text:>12}  {t.enodes or 0:>7} e-nodes  "
                f"saturate {saturate:.2f} s, extract {extract:.2f} s{extra}"
            )
        for skipped in search.skipped:
            out.append(f"  {skipped.mesh:<{width}} skipped: {skipped.reason}")

    out.append("")
    out.append("sharding per op (placement per mesh axis, local shape):")
    ops = report.ops
    for op in ops[:max_ops]:
        placement = " ".join(f"{a}:{p}" for a, p in op.placement.items())
        out.append(f"  {op.op:<20} {(op.source or op.output)[:36]:<36} {placement:<16} {_fmt_shape(op.local_shape)}")
    if len(ops) > max_ops:
        out.append(f"  … {len(ops) - max_ops} more (`--json` lists them all)")

    out.append("")
    out.append("PCG (=> forward collective, <= backward collective; {…} a weight's placement):")
    pcg = report.pcg
    out.extend(pcg[: max_ops * 2])
    if len(pcg) > max_ops * 2:
        out.append(f"  … {len(pcg) - max_ops * 2} more lines")
    if report.notes:
        out.append("")
        out.append("notes:")
        out.extend(f"  {note}" for note in report.notes)
    return "\n".join(out)
