"""``profile_model``: the e-graph of a model on a mesh, every distinct op of it timed on this machine's device, and
the table's entries (with the roofline's prediction of each) and summary."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.cost import TRAINING, CostModel, op_flops
from unity_eq.egraph import Limits, encode, parse_serialized, saturate
from unity_eq.errors import OptionError
from unity_eq.ir import Graph, Mesh
from unity_eq.machine import Machine
from unity_eq.profile.backward import BackwardRunner, BackwardTiming, torch_device_for
from unity_eq.profile.instances import ProfiledOp, op_instances
from unity_eq.profile.models import single_op_model
from unity_eq.profile.timing import Progress, Runner, Timing, calibrate, calibrated_machine, measure
from unity_eq.profile.torch_timing import calibrate_torch, forward_timing
from unity_eq.profile_table import PROFILE_FORMAT_VERSION, ProfileTable, jsonable
from unity_eq.runtime.devices import DeviceChoice, available_cores, choose_device, cuda_problem
from unity_eq.version import __version__


def _mesh_devices(text: str) -> int:
    import re

    sizes = [int(v) for v in re.findall(r"(?:=|^|[x×*,])\s*(\d+)", text.strip())]
    if not sizes:
        raise OptionError(f"`--mesh`: expected sizes like `2x4` or `dp=2,tp=4`, got {text!r}")
    return math.prod(sizes)


def _relative_errors(entries: Iterable[Mapping[str, Any]], field_name: str, measured: str = "median_s") -> list[float]:
    return [
        abs(float(e[field_name]) - float(e[measured])) / float(e[measured])
        for e in entries
        if e.get(field_name) is not None and e.get(measured) is not None and float(e[measured]) > 0
    ]


def _summary(entries: Sequence[Mapping[str, Any]], has_machine: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": len(entries)}
    errors = _relative_errors(entries, "roofline_s")
    if errors:
        out["median_relative_error"] = statistics.median(errors)
        out["within_2x"] = sum(1 for e in entries if 0.5 <= float(e["roofline_s"]) / float(e["median_s"]) <= 2.0) / len(
            entries
        )
        by_op: dict[str, list[float]] = {}
        for e, err in zip(entries, errors, strict=True):
            by_op.setdefault(e["op"], []).append(err)
        out["median_relative_error_by_op"] = {op: statistics.median(v) for op, v in sorted(by_op.items())}
    backward_errors = _relative_errors(entries, "roofline_backward_s", "backward_s")
    if backward_errors:
        out["backward_entries"] = len(backward_errors)
        out["backward_median_relative_error"] = statistics.median(backward_errors)
    if has_machine:
        machine_errors = _relative_errors(entries, "machine_roofline_s")
        if machine_errors:
            out["machine_median_relative_error"] = statistics.median(machine_errors)
    return out


def profile_model(
    model: str | Path | Graph,
    *,
    devices: int | None = None,
    mesh: str | Mesh | None = None,
    machine: Machine | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    device: str = "cpu",
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 10,
    min_time: float = 0.05,
    limits: Limits | None = None,
    rule_files: Sequence[Path] | None = None,
    progress: Progress | None = None,
    backward: bool = True,
    framework: str = "auto",
) -> ProfileTable:
    """Measure every distinct compute op of ``model``'s e-graph on a mesh, on this machine's device.

    The mesh is ``mesh`` (``2x2``, ``dp=2,tp=2`` or a :class:`Mesh`) over ``devices`` devices, or over the
    devices of ``machine``; the machine's roofline is also compared with the measurements
    (``machine_roofline_s``). ``device`` is ``cpu``, ``cuda`` or ``auto`` (CUDA device 0 when usable).
    ``backward``: also time each op forward and forward + backward in PyTorch on the same device
    (:mod:`unity_eq.profile.backward`), the entries' ``backward_s``. ``framework`` times the forward pass in
    ``onnxruntime``, in ``torch`` (:mod:`unity_eq.profile.torch_timing`) or ``auto``: torch when a CUDA device
    is asked for and only torch can use it, onnxruntime otherwise.
    """
    from unity_eq.rulefile.manifest import load_rule_files

    say = progress or (lambda _m: None)
    if warmup < 0 or repeats < 1 or min_time < 0:
        raise OptionError("`--warmup` must be ≥ 0, `--repeats` ≥ 1 and `--min-time` ≥ 0.")
    if machine is not None:
        count = machine.device_count
        if devices is not None and devices != machine.device_count:
            raise OptionError(
                f"`--devices` {devices} disagrees with the machine {machine.name!r} ({machine.device_count} devices)."
            )
    elif devices is not None:
        count = devices
    elif isinstance(mesh, Mesh):
        count = mesh.size
    elif mesh is not None:
        count = _mesh_devices(mesh)
    else:
        raise OptionError("say which mesh to profile for: pass `--devices N` or `--mesh 2x2`.")
    if count < 1:
        raise OptionError(f"`--devices` must be at least 1, got {count}.")
    chosen_mesh = mesh if isinstance(mesh, Mesh) else Mesh.parse(mesh or str(count), count)

    started = time.perf_counter()
    if isinstance(model, Graph):
        graph = model
    else:
        from unity_eq.frontends.onnx import load_onnx

        say(f"loading {model}")
        graph = load_onnx(model, input_shapes)
    encoding = encode(graph, chosen_mesh)
    saturation = saturate(load_rule_files(list(rule_files) if rule_files is not None else None), encoding, limits)
    data = parse_serialized(saturation.serialized)
    instances, weights = op_instances(data, encoding, graph, chosen_mesh)
    runs: dict[tuple[Any, ...], list[ProfiledOp]] = {}
    for instance in instances:
        runs.setdefault(instance.run_key, []).append(instance)
    say(
        f"e-graph of {graph.name} on mesh {chosen_mesh}: {data.enode_count} e-nodes, "
        f"{len(instances)} distinct ops on local shapes ({len(runs)} to run)"
    )

    choice = choose_device(device, 0)
    framework, framework_device, framework_note = choose_framework(framework, device, choice)
    note = framework_note or choice.note
    if note:
        say(note)
    n_threads = threads or available_cores()
    runner = Runner(choice, n_threads, warmup, repeats, min_time)
    if framework == "torch":
        assert framework_device is not None
        torch_runner = BackwardRunner(framework_device, n_threads, warmup, repeats, min_time)
        calibration = calibrate_torch(torch_runner, n_threads, say)
        torch_device, backward_note = (framework_device, "") if backward else (None, "")
    else:
        calibration = calibrate(runner, say)
        torch_device, backward_note = torch_device_for(choice.cuda, runner.device[1]) if backward else (None, "")
    predictor = CostModel(calibrated_machine(calibration, chosen_mesh.size), chosen_mesh, TRAINING)
    machine_model = CostModel(machine, chosen_mesh, TRAINING) if machine is not None else None
    if backward_note:
        say(backward_note)
    backward_runner = (
        BackwardRunner(torch_device, n_threads, warmup, repeats, min_time) if torch_device is not None else None
    )

    rng = np.random.default_rng(0)
    opsets = {"": graph.opset, **graph.extra_opsets}
    entries: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for k, (_, group) in enumerate(runs.items()):
        first = group[0]
        try:
            if framework == "torch":
                timing = forward_timing(torch_runner, first, weights.get(first, {}), rng)
            else:
                model_proto, feeds = single_op_model(first, weights.get(first, {}), rng, opsets)
                timing = measure(runner, model_proto, feeds)
        except Exception as exc:  # the framework refuses the op on this device: the roofline prices it
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            skipped.append({"op": first.op, "inputs": [s.to_json() for s in first.inputs], "reason": reason})
            continue
        if timing is None:
            reason = "the torch timer does not build this op (unity_eq/profile/backward.py): the roofline prices it"
            skipped.append({"op": first.op, "inputs": [s.to_json() for s in first.inputs], "reason": reason})
            continue
        backward_timing = _backward(backward_runner, first, weights.get(first, {}), rng, skipped)
        if (k + 1) % 25 == 0:
            say(f"measured {k + 1} of {len(runs)} ops")
        for instance in group:
            entries.append(_entry(instance, timing, backward_timing, predictor, machine_model))
    if framework == "torch":
        provider = f"torch:{framework_device}"
    else:
        provider = "CUDAExecutionProvider" if choice.cuda else "CPUExecutionProvider"
    import onnxruntime as ort

    meta: dict[str, Any] = {
        "kind": "unity-eq-profile",
        "format_version": PROFILE_FORMAT_VERSION,
        "unity_eq_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": {
            "description": calibration.device,
            "framework": framework,
            "provider": provider,
            "device_id": runner.device[1],
            "onnxruntime": ort.__version__,
            "threads": n_threads,
            "host": platform.node(),
            "note": note,
        },
        "model": {"name": graph.name, "source": str(model) if not isinstance(model, Graph) else graph.name},
        "mesh": {"axes": list(chosen_mesh.axes), "sizes": list(chosen_mesh.sizes)},
        "machine": machine.describe() if machine is not None else None,
        "settings": {"warmup": warmup, "repeats": repeats, "min_time_s": min_time, "statistic": "median"},
        "backward": _backward_meta(torch_device, backward, backward_note),
        "calibration": calibration.to_json(),
        "summary": _summary(entries, machine is not None),
        "seconds": round(time.perf_counter() - started, 3),
    }
    return ProfileTable(meta, entries, skipped)


def choose_framework(framework: str, device: str, choice: DeviceChoice) -> tuple[str, str | None, str]:
    """The framework that times the forward pass, torch's device when it is torch, and a note when the choice
    is not the obvious one: ``auto`` is onnxruntime unless a CUDA device is asked for (``cuda``, ``auto``)
    that onnxruntime cannot use (no onnxruntime-gpu) and torch can."""
    if framework not in ("auto", "onnxruntime", "torch"):
        raise OptionError(f"`--framework`: expected auto, onnxruntime or torch, got {framework!r}.")
    if framework == "onnxruntime" or (framework == "auto" and (device == "cpu" or choice.cuda)):
        return "onnxruntime", None, ""
    try:
        import torch
    except ImportError:
        if framework == "torch":
            raise OptionError(
                "`--framework torch` needs PyTorch: `pip install -e '.[torch]'` (or `--framework onnxruntime`)."
            ) from None
        return "onnxruntime", None, ""
    wants_cuda = device in ("cuda", "auto")
    if wants_cuda and torch.cuda.is_available():
        target = "cuda:0"
        if framework == "auto":
            return (
                "torch",
                target,
                (
                    f"onnxruntime has no CUDA here ({cuda_problem(0) or 'no CUDA provider'}); PyTorch has: every "
                    f"op is timed forward and backward in PyTorch on {target} ({torch.cuda.get_device_name(0)})"
                ),
            )
        return "torch", target, ""
    if framework == "auto":
        return "onnxruntime", None, ""
    note = "torch sees no CUDA device; timing on the CPU" if device == "cuda" else ""
    return "torch", "cpu", note


def _backward(
    runner: BackwardRunner | None,
    instance: ProfiledOp,
    weights: Mapping[int, np.ndarray],
    rng: np.random.Generator,
    skipped: list[dict[str, Any]],
) -> BackwardTiming | None:
    """The op's torch timing, or None (no runner, an op not built in torch, or torch refused it: recorded in
    ``skipped`` with ``"pass": "backward"``, and the roofline's ratio prices its backward)."""
    if runner is None:
        return None
    try:
        return runner.measure(instance, weights, rng)
    except Exception as exc:  # torch refuses the op on these shapes or this device: say so, price it by ratio
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        skipped.append(
            {"op": instance.op, "pass": "backward", "inputs": [s.to_json() for s in instance.inputs], "reason": reason}
        )
        return None


def _backward_meta(torch_device: str | None, asked: bool, note: str) -> dict[str, Any]:
    """What measured the backward pass (docs/profile.md, "Backward")."""
    if torch_device is None:
        return {"framework": None, "device": None, "note": note if asked else "not asked (--no-backward)"}
    import torch

    return {"framework": "torch", "version": torch.__version__, "device": torch_device, "note": note}


def _entry(
    instance: ProfiledOp,
    timing: Timing,
    backward: BackwardTiming | None,
    predictor: CostModel,
    machine_model: CostModel | None,
) -> dict[str, Any]:
    share = 1.0 / instance.outputs  # the outputs of one node split its time (the extractor sums them)

    def roofline(model: CostModel) -> float:
        return model.forward(instance.priced)

    def roofline_backward(model: CostModel) -> float:
        return model.backward(instance.priced)

    entry: dict[str, Any] = {
        "op": instance.op,
        "domain": instance.domain,
        "attrs": {k: jsonable(v) for k, v in instance.attrs},
        "inputs": [s.to_json() for s in instance.inputs],
        "outputs": instance.outputs,
        "output_index": instance.output_index,
        "key": {
            "in_shapes": [list(s) for s in instance.in_shapes],
            "out_shape": list(instance.out_shape),
            "dtype": instance.dtype,
        },
        "flops": op_flops(instance.op, instance.in_shapes, instance.out_shape) * share,
        "bytes": (instance.priced.in_bytes + instance.priced.out_bytes) * share,
        "median_s": timing.median_s * share,
        "min_s": timing.min_s * share,
        "repeats": timing.repeats,
        "roofline_s": roofline(predictor),
        "roofline_backward_s": roofline_backward(predictor),
    }
    if backward is not None:
        entry["torch_forward_s"] = backward.forward_s * share
        entry["torch_forward_backward_s"] = backward.forward_backward_s * share
        entry["backward_s"] = backward.backward_s * share
    if machine_model is not None:
        entry["machine_roofline_s"] = roofline(machine_model)
        entry["machine_roofline_backward_s"] = roofline_backward(machine_model)
    return entry
