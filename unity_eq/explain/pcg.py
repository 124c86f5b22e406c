"""The parallel computation graph as text (:func:`pcg_lines`: one line per op and per collective), and what the
report builds on too: each tensor's kind (:func:`tensor_kinds`), the source model's name of what it holds
(:func:`named`), its bytes per rank (:func:`tensor_bytes`, which the pictures use as well)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from typing_extensions import assert_never

from unity_eq.collectives import BY_RECORD_KIND
from unity_eq.planfile import (
    CollectiveStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    InputStepRecord,
    StepRecord,
    TensorRecord,
    WeightStepRecord,
)


def tensor_kinds(steps: tuple[StepRecord, ...]) -> dict[str, str]:
    """'weight', 'input' or 'activation' for every tensor; slices and replicas keep their source's kind."""
    kinds: dict[str, str] = {}
    for step in steps:
        match step:
            case WeightStepRecord():
                kinds[step.out] = "weight"
            case InputStepRecord():
                kinds[step.out] = "input"
            case CollectiveStepRecord():
                local = BY_RECORD_KIND[step.KIND].local  # a slice or replica keeps its source's kind
                kinds[step.out] = kinds.get(step.src, "activation") if local else "activation"
            case ComputeStepRecord():
                for out in step.outputs:
                    if out:
                        kinds[out] = "activation"
            case _:
                assert_never(step)
    return kinds


def named(tensor: TensorRecord | None) -> str | None:
    """The source model's name of what a plan tensor holds, if it has one."""
    return (tensor.value or tensor.source) if tensor else None


def _fmt_placement(placement: tuple[str, ...], axes: tuple[str, ...]) -> str:
    return " ".join(f"{a}:{p}" for a, p in zip(axes, placement, strict=False))


def fmt_shape(shape: tuple[int, ...] | None) -> str:
    return "[" + ",".join(str(d) for d in shape or []) + "]"


def pcg_lines(plan: ExplainRecord, kinds: dict[str, str] | None = None) -> list[str]:
    """A text picture of the PCG: one line per op and per collective, weights folded into their last slice.

    ``=>`` marks a collective in the forward pass, ``<=`` one in the backward pass (training only).
    """
    axes = plan.mesh.axes
    tensors = plan.tensors
    kinds = kinds or tensor_kinds(plan.steps)
    training = plan.training
    name_of = {tid: named(t) or tid for tid, t in tensors.items()}

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
                lines.append(f"  input  {step.name} {fmt_shape(tensors[step.out].shape)}")
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
                    f"local {fmt_shape(t.local_shape if t else ())} <- {', '.join(args)}"
                )
            case CollectiveStepRecord():
                lines.extend(_collective_line(step, kinds, tensors, training, label, summed, gradients))
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


def comm_us(step: StepRecord | CollectiveStepRecord) -> str:
    """A step's predicted communication time in µs, as the text and the picture label collectives."""
    return f"{(step.communication_s or 0.0) * 1e6:.1f} µs"


def _collective_line(
    step: CollectiveStepRecord,
    kinds: dict[str, str],
    tensors: Mapping[str, TensorRecord],
    training: bool,
    label: Callable[[str], str],
    summed: set[str],
    gradients: dict[str, list[float]],
) -> list[str]:
    """A collective's line, in its kind's words: ``=>`` a forward collective, ``<=`` a backward one; a weight's
    gradient all-reduce is counted in ``gradients`` (one line per axis at the end) and marks the weight ``Σ``."""
    kind = BY_RECORD_KIND[step.KIND]
    dims = "".join(f" {name.replace('_', ' ')} {getattr(step, name)}" for name in kind.dims)
    if kind.communicates:
        return [
            f"=> {kind.label:<12}{label(step.out)}{dims} on {step.axis} ({_mib(tensors[step.out])}, {comm_us(step)})"
        ]
    if not kind.weight_gradient:  # a local slice: its backward gathers an activation's gradient
        if kinds.get(step.src) != "activation":
            return []
        back = f", backward {kind.backward_op} {comm_us(step)}" if training and kind.backward_op else ""
        return [f"  {kind.label:<13}{label(step.src)}{dims} on {step.axis}{back}"]
    if not (training and (step.communication_s or 0) > 0):
        return []
    if kinds.get(step.src) == "weight":
        summed.add(step.out)
        entry = gradients.setdefault(step.axis, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += tensor_bytes(tensors[step.src])
        entry[2] += step.communication_s or 0.0
        return []
    return [
        f"<= {kind.backward_op:<12}activation gradient of {label(step.src)} on {step.axis} "
        f"({_mib(tensors[step.src])}, {comm_us(step)})"
    ]
