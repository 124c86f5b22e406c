"""Benchmarks of `optimize`: `python -m benchmarks.run [--suite core|scale|layers|hf|megatron|all] [options]`.

Suites (each case runs `benchmarks.measure` in a fresh subprocess, so peak memory is per case):

* ``core``: the examples and onnx's light CNNs on 8, 16 and 64 GPUs (h100x8; 2 and 8 × h100x8 over InfiniBand 400),
  inference and training: the plan's predicted cost against the one-device, data-parallel and best
  single-axis tensor-parallel baselines, optimize time and peak memory.
* ``scale``: transformers exported from PyTorch with BERT-Base, BERT-Large and GPT-2-XL-depth shapes (and
  one layer at Megatron-LM's sizes) on 8, 16 and 64 GPUs, training: wall time, peak memory, e-graph size,
  the plan's cost and its ratio to data and tensor parallelism, greedy against ILP (cost and time).
* ``layers``: BERT with hidden 768 and 3 to 48 layers on 8 GPUs: how optimize time grows with depth.
* ``megatron``: GPT rows of Megatron-LM's scaling study (1.7B on 32 GPUs to 1T on 3,072) planned by the stage
  search (pipeline stages, microbatches, recomputation, ZeRO): benchmarks/megatron.py.

Results are written as JSON (default benchmarks/results/<suite>.json) and printed as tables; a markdown
version goes to benchmarks/results/<suite>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.models import MODELS, ROOT, SUITES, layer_sweep_model

MACHINES = {8: "h100x8", 16: "h100x8:2:ib400", 64: "h100x8:8:ib400"}


def run_case(model: str, gpus: int, objective: str, extractor: str, timeout: int, ilp_limit: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.measure",
        model,
        "--machine",
        MACHINES[gpus],
        "--objective",
        objective,
        "--extractor",
        extractor,
        "--ilp-time-limit",
        str(ilp_limit),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail[-200:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(record: dict[str, Any], name: str) -> str:
    b = (record.get("baselines") or {}).get(name)
    if not b or b.get("ratio") is None:
        return "—"
    if name != "one_device" and not b.get("sharded"):
        return "=1dev"  # the baseline could shard nothing: it is the one-device plan
    return f"{b['ratio']:.2f}" + ("" if b.get("fits", True) else " (no fit)")


def core_rows(rows: Iterable[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | GPUs | objective | mesh | plan ms | ×one device | ×data parallel | ×tensor parallel "
        "| optimize s | peak MiB | worker MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['gpus']} | {r['objective']} | error: {r['error']} |||||||")
            continue
        lines.append(
            f"| {r['model']} | {r['gpus']} | {r['objective']} | {r['mesh']} | {r['cost_s'] * 1e3:.3f} | "
            f"{_ratio(r, 'one_device')} | {_ratio(r, 'data_parallel')} | {_ratio(r, 'tensor_parallel')} | "
            f"{r['wall_s']:.1f} | {r['peak_mib']:.0f} | {r['worker_peak_mib'] or 0:.0f} |"
        )
    return lines


def scale_rows(rows: Iterable[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | layers | GPUs | mesh | optimize s (greedy) | peak MiB | pieces (distinct) | e-nodes | plan ms "
        "| ×DP | ×TP | ILP ms (gap) | + ILP s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('layers', '')} | {r['gpus']} | error: {r['error']} ||||||||||")
            continue
        blocks = r.get("blocks") or {}
        pieces = f"{blocks['pieces']} ({blocks['distinct']})" if blocks else "whole"
        ilp = r.get("ilp")
        ilp_text = f"{ilp['ilp_total_s'] * 1e3:.3f} ({ilp['max_gap']:.0%})" if ilp else "—"
        ilp_s = r["timings"].get("ilp_s", 0.0)
        ilp_time = f"{ilp_s:.1f}" if ilp else "—"
        lines.append(
            f"| {r['model']} | {r.get('layers', '')} | {r['gpus']} | {r['mesh']} | {r['wall_s'] - ilp_s:.1f} | "
            f"{r['peak_mib']:.0f} | {pieces} | {r['enodes_all_meshes']} | {r['cost_s'] * 1e3:.3f} | "
            f"{_ratio(r, 'data_parallel')} | {_ratio(r, 'tensor_parallel')} | {ilp_text} | {ilp_time} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="core", choices=["core", "scale", "layers", "hf", "megatron", "all"])
    parser.add_argument("--models", help="comma-separated model names (overrides the suite's)")
    parser.add_argument("--gpus", help="comma-separated GPU counts among 8, 16, 64 (default: the suite's)")
    parser.add_argument("--objective", help="inference, training or both (comma-separated)")
    parser.add_argument("--ilp", action="store_true", help="core suite: also run the ILP extractor")
    parser.add_argument("--ilp-time-limit", type=float, default=60.0)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--out", type=Path, help="JSON results file (default benchmarks/results/<suite>.json)")
    args = parser.parse_args()

    suites = ["core", "scale", "layers"] if args.suite == "all" else [args.suite]
    console = Console()
    for suite in suites:
        if suite == "megatron":
            _megatron(args, console)
            continue
        cases = _cases(suite, args)
        rows = []
        for model, layers, gpus, objective, extractor in cases:
            with console.status(f"{suite}: {model} on {gpus} GPUs ({objective}, {extractor})"):
                path = _model_path(model, layers)
                record = run_case(path, gpus, objective, extractor, args.timeout, args.ilp_time_limit)
            record.update({"model": model, "layers": layers, "gpus": gpus, "objective": objective})
            rows.append(record)
            summary = record.get("error") or f"{record['wall_s']:.1f} s, {record['peak_mib']:.0f} MiB"
            console.print(f"{suite}: {model} × {gpus} ({objective}): {summary}")
        out = args.out or ROOT / "benchmarks" / "results" / f"{suite}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(), "cpus": os.cpu_count()}
        out.write_text(json.dumps({"meta": meta, "suite": suite, "results": rows}, indent=1))
        table = core_rows(rows) if suite == "core" else scale_rows(rows)
        out.with_suffix(".md").write_text("\n".join(table) + "\n")
        print("\n".join(table), flush=True)
        console.print(f"written to {out} and {out.with_suffix('.md')}")
    return 0


def _megatron(args: argparse.Namespace, console: Console) -> None:
    from benchmarks.megatron import DEFAULT_ROWS, rows_markdown, run_suite

    names = args.models.split(",") if args.models else list(DEFAULT_ROWS)
    rows = run_suite(names, args.timeout)
    out = args.out or ROOT / "benchmarks" / "results" / "megatron.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(), "cpus": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "suite": "megatron", "results": rows}, indent=1))
    table = rows_markdown(rows)
    out.with_suffix(".md").write_text("\n".join(table) + "\n")
    print("\n".join(table), flush=True)
    console.print(f"written to {out} and {out.with_suffix('.md')}")


def _cases(suite: str, args: argparse.Namespace) -> list[tuple[str, int, int, str, str]]:
    objectives = (args.objective or ("inference,training" if suite == "core" else "training")).split(",")
    if suite == "layers":
        gpus = [int(g) for g in (args.gpus or "8").split(",")]
        return [(f"bert-768x{n}", n, g, o, "greedy") for n in (3, 6, 12, 24, 48) for g in gpus for o in objectives]
    names = args.models.split(",") if args.models else SUITES[suite]
    gpus = [int(g) for g in (args.gpus or ("8" if suite == "hf" else "8,16,64")).split(",")]
    extractor = "ilp" if (suite == "scale" or args.ilp) else "greedy"
    return [
        (m, MODELS[m].layers if m in MODELS else 0, g, o, extractor) for m in names for g in gpus for o in objectives
    ]


def _model_path(model: str, layers: int) -> str:
    if model.startswith("bert-768x"):
        return str(layer_sweep_model(layers))
    if model == "megatron-layer":
        return model
    return str(MODELS[model].path())


if __name__ == "__main__":
    raise SystemExit(main())
