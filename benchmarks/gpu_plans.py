"""Whole plans run on this machine's GPU against their prediction (issue 24's plan-level figure):

    python -m benchmarks.gpu_plans --out benchmarks/results/gpu-h200/plans     # benchmarks/gpu.sh runs it

For each transformer block of :data:`MODELS` (examples/make_examples.py ``--transformer``, float32 and
bfloat16), ``optimize`` plans it for one device of ``--machine`` (default benchmarks/machines/h200.toml: the
datasheet, with the efficiencies and launch floor measured there), for inference and for training, and the plan
runs on the GPU:

- inference: the plan's device program (device_0.onnx) forward in the torch backend's interpreter
  (unity_eq.train.reference.OnnxModule; onnxruntime-gpu where installed is not used, so that both objectives are
  timed by one framework), the median of 20 runs after 3 warm-ups;
- training: ``unity-eq train --device cuda`` under torchrun (NCCL, one rank), 12 SGD steps, the median step
  after the first, as ``train`` prints it.

Against plan.json's predicted cost (``cost.total_s``). Writes ``OUT.json`` and ``OUT.md``. One GPU runs
one-device plans only; a multi-device plan's run needs as many GPUs.

Without a GPU, ``--repredict benchmarks/results/gpu-h200/plans.json --out OUT`` plans the same models again with
today's cost model and compares with the times measured then (a cost-model change's effect on the plan-level
error; the figures are the old measurements, not new ones).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: (batch, sequence, hidden, heads) and dtype of each block measured
MODELS: list[tuple[str, str]] = [
    ("8,1024,1024,16", "float32"),
    ("8,1024,1024,16", "bfloat16"),
    ("16,512,768,12", "float32"),
    ("4,2048,2048,16", "bfloat16"),
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done


def _predicted(plan: Path) -> float:
    return float(json.loads((plan / "plan.json").read_text())["cost"]["total_s"])


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _inference_s(plan: Path, device: str) -> float:
    """Median forward of the plan's one device program on ``device``, in the torch interpreter."""
    import numpy as np
    import onnx
    import torch

    from unity_eq.train.reference import OnnxModule
    from unity_eq.train.torch_ops import tensor_of

    program = onnx.load(str(plan / "device_0.onnx"))
    module = OnnxModule(program, device)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in program.graph.input:
        if value.name in {i.name for i in program.graph.initializer}:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = tensor_of(rng.standard_normal(shape).astype(np.float32).astype(dtype), device)
    samples = []
    with torch.no_grad():
        for k in range(23):
            _sync(device)
            start = time.perf_counter()
            module(feeds)
            _sync(device)
            if k >= 3:
                samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _training_s(plan: Path, device: str) -> float:
    done = _run(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "unity_eq", "train",
                str(plan), "--steps", "12", "--loss", "mean", "--device", device)  # fmt: skip
    said = re.search(r"step time: measured ([0-9.]+) ms", done.stdout + done.stderr)
    if said is None:
        raise RuntimeError(f"train printed no step time:\n{done.stderr[-2000:]}")
    return float(said.group(1)) / 1e3


def _block(size: str, dtype: str, work: Path) -> Path:
    model = work / f"block-{size.replace(',', 'x')}-{dtype}.onnx"
    _run(sys.executable, str(ROOT / "examples" / "make_examples.py"), "--transformer", size, "--dtype", dtype,
         "--out", str(model))  # fmt: skip
    return model


def _plan(model: Path, machine: str, objective: str, plan_only: bool = False) -> Path:
    plan = model.parent / f"{model.stem}-{objective}"
    _run(sys.executable, "-m", "unity_eq", "optimize", str(model), "--machine", machine, "--objective", objective,
         "-o", str(plan), "-q", *(["--plan-only"] if plan_only else []))  # fmt: skip
    return plan


def _row(model: str, objective: str, predicted: float, measured: float) -> dict[str, Any]:
    return {
        "model": model,
        "objective": objective,
        "predicted_s": predicted,
        "measured_s": measured,
        "measured_over_predicted": measured / predicted,
        "relative_error": abs(predicted - measured) / measured,
    }


def measure(size: str, dtype: str, machine: str, work: Path, device: str) -> list[dict[str, Any]]:
    model = _block(size, dtype, work)
    rows = []
    for objective in ("inference", "training"):
        plan = _plan(model, machine, objective)
        measured = _inference_s(plan, device) if objective == "inference" else _training_s(plan, device)
        predicted = _predicted(plan)
        rows.append(_row(f"block {size} {dtype}", objective, predicted, measured))
        print(f"{rows[-1]['model']} {objective}: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms",
              flush=True)  # fmt: skip
    return rows


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# Whole plans on {meta['device']}: predicted vs measured",
        "",
        f"Measured {meta['date']} with `python -m benchmarks.gpu_plans {meta['args']}` (torch {meta['torch']}); "
        f"predictions on `{meta['machine']}`. Inference: the plan's device program in the torch interpreter; "
        "training: `unity-eq train --device cuda` (NCCL, one rank), SGD.",
        *(
            [
                "",
                f"**Predicted again {meta['repredicted']}** (no GPU) by the cost model of that day with "
                f"`python -m benchmarks.gpu_plans {meta['repredict_args']}`: the measured times are the ones of "
                f"{meta['date']}.",
            ]
            if "repredicted" in meta
            else []
        ),
        "",
        "| model (B,S,H,heads) | objective | predicted | measured | measured / predicted | error |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["plans"]:
        lines.append(
            f"| {row['model']} | {row['objective']} | {row['predicted_s'] * 1e3:.2f} ms | "
            f"{row['measured_s'] * 1e3:.2f} ms | {row['measured_over_predicted']:.2f} | "
            f"{row['relative_error'] * 100:.0f} % |"
        )
    for objective, s in result["summary"].items():
        lines.append("")
        lines.append(
            f"{objective}: median error {s['median_relative_error'] * 100:.0f} %, largest "
            f"{s['max_relative_error'] * 100:.0f} % over {s['n']} plans."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--machine", default=str(ROOT / "benchmarks" / "machines" / "h200.toml"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu-plans"))
    parser.add_argument("--device", default="cuda", help="cuda; cpu only for a dry run of this script")
    parser.add_argument("--models", help="B,S,H,HEADS:dtype;... instead of MODELS (a small one for a dry run)")
    parser.add_argument("--repredict", metavar="PLANS_JSON",
                        help="no GPU: plan every model of a committed result again (the current cost model, "
                        "--machine) and compare with the times it measured")  # fmt: skip
    args = parser.parse_args(argv)
    if args.repredict:
        repredict(Path(args.repredict), args.machine, Path(args.out), argv)
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: benchmarks.gpu_plans runs plans on a CUDA GPU, and torch sees none here")
    models = [tuple(m.split(":")) for m in args.models.split(";")] if args.models else MODELS
    plans: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size, dtype in models:
            try:
                plans += measure(size, dtype, args.machine, Path(tmp), args.device)
            except RuntimeError as exc:  # one model failing leaves the others' figures; the failure is reported
                print(f"block {size} {dtype}: {exc}", flush=True)
                plans.append({"model": f"block {size} {dtype}", "error": str(exc)[:2000]})
            _write(Path(args.out), plans, args, argv)  # after each model: a run cut short keeps what it measured


def repredict(measured: Path, machine: str, out: Path, argv: list[str] | None) -> None:
    """Each model of a committed result planned again by today's cost model, against the times measured then:
    how a change of the cost model or of the machine file moves the plan-level error, without a GPU. The
    measurements stay what they were (the device programs they ran are planned the same way: a one-device plan
    of the block)."""
    old = json.loads(measured.read_text())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models: dict[str, Path] = {}
        for then in old["plans"]:
            if "error" in then:
                continue
            _, size, dtype = then["model"].split()
            model = models.get(then["model"]) or _block(size, dtype, Path(tmp))
            models[then["model"]] = model
            predicted = _predicted(_plan(model, machine, then["objective"], plan_only=True))
            rows.append(_row(then["model"], then["objective"], predicted, then["measured_s"]))
            was, ms = then["predicted_s"] * 1e3, then["measured_s"] * 1e3
            print(f"{then['model']} {then['objective']}: predicted {predicted * 1e3:.2f} ms (was {was:.2f}), "
                  f"measured {ms:.2f} ms", flush=True)  # fmt: skip
    result = {
        "meta": {
            **old["meta"],
            "machine": Path(machine).name,
            "repredicted": time.strftime("%Y-%m-%d"),
            "repredict_args": " ".join(argv if argv is not None else sys.argv[1:]),
        },
        "plans": rows,
        "summary": _summary(rows),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))


def _summary(plans: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {}
    for objective in ("inference", "training"):
        errors = [p["relative_error"] for p in plans if p["objective"] == objective]
        if errors:
            summary[objective] = {"n": len(errors), "median_relative_error": statistics.median(errors),
                                  "max_relative_error": max(errors)}  # fmt: skip
    return summary


def _write(out: Path, plans: list[dict[str, Any]], args: argparse.Namespace, argv: list[str] | None) -> None:
    import torch

    measured = [p for p in plans if "error" not in p]
    summary = _summary(measured)
    result = {
        "meta": {
            "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "the CPU (a dry run)",
            "torch": torch.__version__,
            "machine": Path(args.machine).name,
            "date": time.strftime("%Y-%m-%d"),
            "args": " ".join(argv if argv is not None else sys.argv[1:]),
        },
        "plans": plans,
        "summary": summary,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown({**result, "plans": measured}))


if __name__ == "__main__":
    main()
