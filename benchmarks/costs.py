"""Predicted vs measured op and plan times on this machine's device, forward and backward (issue 24):

    python -m benchmarks.costs                                   # the CPU, examples/transformer.onnx on 2 devices
    python -m benchmarks.costs --device cuda --model M.onnx --devices 8 --out benchmarks/results/costs-gpu

1. ``unity-eq profile``'s measurement of every distinct op of the model's e-graph on the mesh's local shapes:
   forward in onnxruntime, forward and forward + backward in PyTorch (``backward_s``), on ``--device``; with
   ``--framework torch`` (``auto`` picks it where only PyTorch has CUDA) the forward in PyTorch too, and the
   whole model in the torch backend's interpreter.
2. Per op: the roofline's prediction on the calibrated device (``calibrated_machine``: the device's measured
   peak, bandwidth and per-op floor, so the comparison tests the model's formulas, not a datasheet) against
   those measurements; the median relative error ``|predicted − measured| / measured`` and the share within 2×,
   per op type, forward, backward and forward + backward.
3. Per plan: ``optimize`` on that calibrated machine for ``inference`` and ``training``; each plan's compute
   re-priced step by step with the roofline (predicted) and with the measured table (measured: the sum of its
   steps' measured times; steps the table lacks keep the roofline and are counted as ``unmeasured``). Also the
   whole original model run end to end in onnxruntime on one device against the one-device plan's prediction
   (``whole_model``): what a sum of separately timed ops misses (caches, fusion, overlap) shows there.

Writes ``OUT.json``, ``OUT.md`` and the measured table ``OUT.profile.json`` (``optimize --profile`` reads it).
Communication is not measured here (one process, no collectives).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def _stats(pairs: Sequence[tuple[float, float]]) -> dict[str, Any]:
    pairs = [(p, m) for p, m in pairs if m > 0]
    if not pairs:
        return {"n": 0}
    errors = [_error(p, m) for p, m in pairs]
    return {
        "n": len(pairs),
        "median_relative_error": statistics.median(errors),
        "max_relative_error": max(errors),
        "within_2x": sum(1 for p, m in pairs if 0.5 <= p / m <= 2.0) / len(pairs),
        "median_ratio": statistics.median(p / m for p, m in pairs),
    }


def per_op(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Forward, backward and forward + backward errors, over all ops and per op type."""
    passes: dict[str, dict[str, list[tuple[float, float]]]] = {"forward": {}, "backward": {}, "training": {}}
    for e in entries:
        op = e["op"]
        passes["forward"].setdefault(op, []).append((e["roofline_s"], e["median_s"]))
        if e.get("backward_s") is not None:
            passes["backward"].setdefault(op, []).append((e["roofline_backward_s"], e["backward_s"]))
            measured = e["torch_forward_backward_s"]
            passes["training"].setdefault(op, []).append((e["roofline_s"] + e["roofline_backward_s"], measured))
    out: dict[str, Any] = {}
    for name, by_op in passes.items():
        every = [pair for pairs in by_op.values() for pair in pairs]
        out[name] = {"all": _stats(every), "by_op": {op: _stats(p) for op, p in sorted(by_op.items())}}
    return out


def per_plan(model: str, devices: int, table: Any, threads: int | None) -> dict[str, Any]:
    """Each objective's plan on the calibrated machine: its compute predicted vs measured step by step."""
    from unity_eq import optimize
    from unity_eq.cost import CostModel
    from unity_eq.profile import calibrated_machine
    from unity_eq.report import price_plan

    machine = calibrated_machine(table.calibration, devices)
    out: dict[str, Any] = {}
    for objective in ("inference", "training"):
        plan = optimize(model, machine=machine, objective=objective).plan
        predicted = sum(c.compute for c in price_plan(plan, CostModel(machine, plan.mesh, objective)))
        table.hits = table.misses = 0
        measured = sum(c.compute for c in price_plan(plan, CostModel(machine, plan.mesh, objective, profile=table)))
        out[objective] = {
            "mesh": str(plan.mesh),
            "predicted_compute_s": predicted,
            "measured_compute_s": measured,
            "relative_error": _error(predicted, measured),
            "measured_ops": table.hits,
            "unmeasured_ops": table.misses,
        }
    out["whole_model"] = whole_model(model, table, threads)
    return out


def whole_model(model: str, table: Any, threads: int | None) -> dict[str, Any]:
    """The original model end to end in onnxruntime on one device vs the one-device plan's predicted forward."""
    import numpy as np
    import onnx

    from unity_eq import optimize
    from unity_eq.profile import calibrated_machine
    from unity_eq.profile.timing import Runner
    from unity_eq.runtime.devices import available_cores, choose_device

    one = optimize(model, machine=calibrated_machine(table.calibration, 1), objective="inference").plan
    proto = onnx.load(model)
    rng = np.random.default_rng(0)
    initializers = {i.name for i in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    device = table.meta["device"]
    if device.get("framework") == "torch":
        measured = _whole_model_torch(proto, feeds, device["provider"].removeprefix("torch:"), threads)
        return {
            "framework": "torch (unity_eq.train.reference.OnnxModule, the original model's nodes one by one)",
            "predicted_s": one.cost.compute,
            "measured_s": measured,
            "relative_error": _error(one.cost.compute, measured),
        }
    choice = choose_device("cuda" if device["provider"] == "CUDAExecutionProvider" else "cpu", 0)
    runner = Runner(choice, threads or available_cores(), 3, 10, 0.2)
    timing = runner.time(runner.session(proto), feeds)
    return {
        "framework": "onnxruntime",
        "predicted_s": one.cost.compute,
        "measured_s": timing.median_s,
        "relative_error": _error(one.cost.compute, timing.median_s),
    }


def _whole_model_torch(proto: Any, feeds: Mapping[str, Any], device: str, threads: int | None) -> float:
    """Median seconds of the original model's forward in the torch backend's interpreter on ``device``."""
    import statistics

    import torch

    from unity_eq.profile.backward import BackwardRunner
    from unity_eq.runtime.devices import available_cores
    from unity_eq.train.reference import OnnxModule
    from unity_eq.train.torch_ops import tensor_of

    module = OnnxModule(proto, device)
    inputs = {k: tensor_of(v, device) for k, v in feeds.items()}
    runner = BackwardRunner(device, threads or available_cores(), 3, 10, 0.2)
    with torch.no_grad():
        return statistics.median(runner.samples(lambda: module(inputs)))


def markdown(result: Mapping[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# Predicted vs measured: {meta['model']} on {meta['devices']} device(s)",
        "",
        f"Measured {meta['date']} on {meta['device']} (forward: {meta['provider']}; backward: "
        f"{meta['backward']}), with `python -m benchmarks.costs {meta['args']}`. Predictions: the roofline on the "
        "calibrated device (its measured peak, bandwidth and per-op floor).",
        "",
        "## Per op (median relative error |predicted − measured| / measured; share within 2×)",
        "",
        "| op | forward | backward | forward + backward |",
        "|---|---|---|---|",
    ]
    ops = result["per_op"]

    def cell(s: Mapping[str, Any] | None) -> str:
        if not s or not s.get("n"):
            return "–"
        return f"{s['median_relative_error']:.2f} ({s['within_2x'] * 100:.0f} %, ×{s['median_ratio']:.2f}, n={s['n']})"

    names = sorted(ops["forward"]["by_op"])
    for name in names:
        row = [cell(ops[p]["by_op"].get(name)) for p in ("forward", "backward", "training")]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append("| **all** | " + " | ".join(cell(ops[p]["all"]) for p in ("forward", "backward", "training")) + " |")
    lines += ["", "(×r: median predicted / measured.)", "", "## Per plan (compute)", ""]
    lines += [
        "| plan | mesh | predicted | measured (sum of its ops) | error | ops measured |",
        "|---|---|---|---|---|---|",
    ]
    for objective in ("inference", "training"):
        p = result["per_plan"][objective]
        lines.append(
            f"| {objective} | {p['mesh']} | {p['predicted_compute_s'] * 1e3:.3f} ms | "
            f"{p['measured_compute_s'] * 1e3:.3f} ms | {p['relative_error'] * 100:.0f} % | "
            f"{p['measured_ops']} of {p['measured_ops'] + p['unmeasured_ops']} |"
        )
    w = result["per_plan"]["whole_model"]
    lines += [
        "",
        f"Whole model end to end on one device ({w.get('framework', 'onnxruntime')}): "
        f"predicted {w['predicted_s'] * 1e3:.3f} ms, measured "
        f"{w['measured_s'] * 1e3:.3f} ms ({w['relative_error'] * 100:.0f} % error).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default=str(ROOT / "examples" / "transformer.onnx"))
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda (falls back to the CPU with a note) or auto")
    parser.add_argument("--framework", default="auto", help="auto, onnxruntime or torch (unity-eq profile's)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--min-time", type=float, default=0.05)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "costs"))
    args = parser.parse_args(argv)

    from unity_eq.profile import profile_model

    started = time.perf_counter()
    table = profile_model(
        args.model,
        devices=args.devices,
        device=args.device,
        threads=args.threads,
        repeats=args.repeats,
        min_time=args.min_time,
        progress=print,
        framework=args.framework,
    )
    backward = table.meta["backward"]
    result = {
        "meta": {
            "model": Path(args.model).name,
            "devices": args.devices,
            "device": table.meta["device"]["description"],
            "provider": table.meta["device"]["provider"],
            "backward": f"torch {backward.get('version')} on {backward.get('device')}"
            if backward.get("framework")
            else backward.get("note"),
            "date": time.strftime("%Y-%m-%d"),
            "args": " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        },
        "per_op": per_op(table.entries),
        "per_plan": per_plan(args.model, args.devices, table, args.threads),
        "seconds": time.perf_counter() - started,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    table.save(out.with_suffix(".profile.json"))  # the measured table, for `optimize --profile`
    print(markdown(result))


if __name__ == "__main__":
    main()
