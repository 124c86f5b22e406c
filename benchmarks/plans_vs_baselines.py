"""The plan's predicted cost against the baselines, for the examples and onnx's light models, on 8 and 16 GPUs.

    python benchmarks/plans_vs_baselines.py [--objective inference,training] [--out results.jsonl]

Machines: ``h100x8`` (one node of 8 H100 on NVLink) and ``h100x8 --nodes 2 --interconnect ib400``. For every
model it runs ``unity_eq.optimize`` (mesh search, real saturation and extraction) and prints one markdown
row: the chosen mesh, the predicted cost per step, each baseline's cost divided by the plan's (one device,
data parallel, best single-axis tensor parallel; ``=1dev`` when a baseline could shard nothing, e.g. data
parallelism at batch 1) and the wall-clock time of ``optimize``. Light models get random weights as in the
tests. ``--blocks`` adds one transformer layer at Megatron's sizes (H=4096, FFN 16384, batch 1 × 512).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from model_zoo import light_model_paths, randomized_light_model  # noqa: E402

from unity_eq import optimize  # noqa: E402

MACHINES = {"8": {"machine": "h100x8"}, "16": {"machine": "h100x8", "nodes": 2, "interconnect": "ib400"}}


def _ratio(baseline: dict[str, Any]) -> str:
    if not baseline["sharded"]:
        return "=1dev"
    text = f"{baseline['ratio']:.2f}"
    return text if baseline["fits"] else text + " (no fit)"


def run(models: list[tuple[str, Any]], objectives: list[str], out: Path | None) -> None:
    print(
        "| model | GPUs | objective | mesh | plan (ms) | ×one device | ×data parallel | ×tensor parallel "
        "| optimize (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    sink = out.open("w") if out else None
    for objective in objectives:
        for name, model in models:
            for gpus, machine in MACHINES.items():
                start = time.perf_counter()
                result = optimize(model, objective=objective, **machine)
                seconds = time.perf_counter() - start
                report = result.plan.report
                b = report["baselines"]
                print(
                    f"| {name} | {gpus} | {objective} | {report['mesh_search']['chosen']} | "
                    f"{result.plan.cost.total * 1e3:.3f} | {b['one_device']['ratio']:.2f} | "
                    f"{_ratio(b['data_parallel'])} | {_ratio(b['tensor_parallel'])} | {seconds:.1f} |",
                    flush=True,
                )
                if sink:
                    row = {"model": name, "gpus": gpus, "objective": objective, "seconds": seconds, **report}
                    sink.write(json.dumps(row, default=str) + "\n")
                    sink.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objective", default="inference,training")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--blocks", action="store_true", help="add a transformer layer at Megatron's sizes")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="unity-eq-bench-"))
    models: list[tuple[str, Any]] = [
        ("mlp", ROOT / "examples" / "mlp.onnx"),
        ("transformer", ROOT / "examples" / "transformer.onnx"),
    ]
    models += [(p.stem.removeprefix("light_"), randomized_light_model(p, tmp)) for p in light_model_paths()]
    if args.blocks:
        from blocks import transformer_graph

        models.append(("layer H=4096 1×512", transformer_graph("am", batch=1, seq=512, hidden=4096, ffn=16384)))
    run(models, args.objective.split(","), args.out)


if __name__ == "__main__":
    main()
