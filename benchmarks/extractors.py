"""Greedy, differentiable and ILP extraction side by side: `python -m benchmarks.extractors [options]`.

Each case runs in a fresh process (`--case`): `optimize` with the greedy extractor (every mesh tried), then the
chosen mesh's plan re-extracted three ways with the same restriction and memory penalty: greedy again (timed
alone), the differentiable search (seeded with greedy's plan), and the ILP (seeded with the cheaper of the
two, `--ilp-time-limit`). Each plan is priced by the same builder and checked against device memory. `import
torch` is timed apart (a process pays it once). Results go to benchmarks/results/extractors.json and .md (or
`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.measure import load_model, machine_kwargs
from benchmarks.models import MODELS, ROOT, layer_sweep_model
from benchmarks.run import MACHINES

DEFAULT_CASES = [
    ("megatron-layer", 8),
    ("megatron-layer", 16),
    ("megatron-layer", 64),
    ("bert-768x3", 8),
    ("bert-base", 8),
    ("bert-base", 16),
]


def _model_path(model: str) -> str:
    if model.startswith("bert-768x"):
        return str(layer_sweep_model(int(model.split("x")[-1])))
    if model == "megatron-layer" or model not in MODELS:
        return model  # megatron-layer, or a path
    return str(MODELS[model].path())


def measure(model: str, gpus: int, ilp_limit: float, all_meshes: bool = False, a100: bool = False) -> dict[str, Any]:
    """One case, in this process (see the module docstring)."""
    from unity_eq import optimize
    from unity_eq.memory import plan_memory

    start = time.perf_counter()
    machine = {"devices": gpus} if a100 else machine_kwargs(MACHINES[gpus])
    result = optimize(load_model(_model_path(model)), objective="training", **machine)
    search = result.search
    assert search is not None
    trial = search.trial
    chosen = next(e for e, _ in trial.extractions if e.plan is search.plan)
    extractor = search.extractors[trial.label]
    row: dict[str, Any] = {
        "mesh": trial.label,
        "optimize_s": round(time.perf_counter() - start, 3),
        "search_extract_s": round(result.timings["extract_s"], 3),
        "pieces": f"{len(search.split.pieces)} ({len({p.signature for p in search.split.pieces})})"
        if search.split is not None
        else "whole",
    }
    began = time.perf_counter()
    import torch  # noqa: F401 - timed apart: a process pays it once, at its first differentiable extraction

    row["torch_import_s"] = round(time.perf_counter() - began, 3)
    runs: dict[str, Any] = {}
    for method in ("greedy", "differentiable", "ilp"):
        began, cpu = time.perf_counter(), time.process_time()
        extraction = extractor.extract(chosen.restriction, chosen.penalty, method, ilp_limit)
        seconds, cpu_s = time.perf_counter() - began, time.process_time() - cpu
        stages = extraction.stages or {"greedy": extraction.plan}
        run = {name: {"cost_s": plan.cost.total, "fits": plan_memory(plan).fits} for name, plan in stages.items()}
        runs[method] = {"seconds": round(seconds, 3), "cpu_s": round(cpu_s, 3), "stages": run}
        if method == "differentiable":
            runs[method]["relaxed_s"] = round(sum(r.seconds for r in extraction.relaxed), 3)
            runs[method]["steps"] = [r.steps for r in extraction.relaxed]
            runs[method]["improved_programs"] = sum(r.kept for r in extraction.relaxed)
            runs[method]["programs"] = len(extraction.relaxed)
        if method == "ilp":
            runs[method]["max_gap"] = max((r.gap for r in extraction.ilp), default=0.0)
            runs[method]["all_optimal"] = all(r.optimal for r in extraction.ilp)
    row["runs"] = runs
    if all_meshes:
        row["meshes"] = _every_mesh(search)
    return row


def _every_mesh(search: Any) -> dict[str, Any]:
    """Greedy against differentiable (unrestricted, no memory penalty) on every mesh the search extracted."""
    from unity_eq.extract import Restriction
    from unity_eq.memory import plan_memory

    found: dict[str, Any] = {}
    for label, extractor in search.extractors.items():
        began, cpu = time.perf_counter(), time.process_time()
        greedy = extractor.extract(Restriction())
        middle, middle_cpu = time.perf_counter(), time.process_time()
        relaxed = extractor.extract(Restriction(), method="differentiable")
        plan = relaxed.stages["differentiable"]
        found[label] = {
            "greedy_s": greedy.plan.cost.total,
            "differentiable_s": plan.cost.total,
            "fits": plan_memory(plan).fits,
            "greedy_seconds": round(middle - began, 3),
            "differentiable_seconds": round(time.perf_counter() - middle, 3),
            "greedy_cpu_s": round(middle_cpu - cpu, 3),
            "differentiable_cpu_s": round(time.process_time() - middle_cpu, 3),
        }
    return found


def rows_markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | GPUs | mesh | greedy ms | differentiable ms (vs greedy) | ILP ms (gap) | greedy s "
        "| search's greedy extraction s | differentiable s | ILP s | differentiable / greedy: wall (CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['gpus']} | error: {r['error']} ||||||||")
            continue
        runs = r["runs"]
        greedy = runs["greedy"]["stages"]["greedy"]["cost_s"]
        diff = runs["differentiable"]["stages"]["differentiable"]
        ilp = runs["ilp"]["stages"]["ilp"]
        saving = (greedy - diff["cost_s"]) / greedy
        fits = "" if diff["fits"] else " (no fit)"
        lines.append(
            f"| {r['model']} | {r['gpus']} | {r['mesh']} | {greedy * 1e3:.4f} | "
            f"{diff['cost_s'] * 1e3:.4f} ({-saving:+.2%}){fits} | {ilp['cost_s'] * 1e3:.4f} "
            f"({runs['ilp']['max_gap']:.0%}) | {runs['greedy']['seconds']:.2f} | {r['search_extract_s']:.2f} | "
            f"{runs['differentiable']['seconds']:.2f} | {runs['ilp']['seconds']:.1f} | {_ratios(runs)} |"
        )
    return lines


def _ratios(runs: dict[str, Any]) -> str:
    """The differentiable extraction's time over greedy's, wall clock and (the machine is shared, so the fairer
    one) this process's CPU time; rows measured before CPU time was recorded have only the first."""
    greedy, diff = runs["greedy"], runs["differentiable"]
    wall = f"{diff['seconds'] / greedy['seconds']:.1f}×" if greedy["seconds"] > 0 else "-"
    if "cpu_s" not in greedy or greedy["cpu_s"] <= 0:
        return wall
    return f"{wall} ({diff['cpu_s'] / greedy['cpu_s']:.1f}×)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", help="comma-separated MODEL:GPUS (default: the Megatron-sized layer and BERT)")
    parser.add_argument("--ilp-time-limit", type=float, default=30.0)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "extractors.json")
    parser.add_argument("--all-meshes", action="store_true", help="also greedy vs differentiable on every mesh")
    parser.add_argument("--a100", action="store_true", help="`--devices N` (N A100-80G in one node), not h100x8")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # MODEL:GPUS, in this process (the child)
    args = parser.parse_args()
    if args.case:
        model, gpus = args.case.rsplit(":", 1)
        print(json.dumps(measure(model, int(gpus), args.ilp_time_limit, args.all_meshes, args.a100)))
        return 0
    cases = [(m, int(g)) for m, g in (c.rsplit(":", 1) for c in args.cases.split(","))] if args.cases else DEFAULT_CASES
    rows = []
    for model, gpus in cases:
        cmd = [sys.executable, "-m", "benchmarks.extractors", "--case", f"{model}:{gpus}"]
        cmd += ["--ilp-time-limit", str(args.ilp_time_limit)] + (["--all-meshes"] if args.all_meshes else [])
        cmd += ["--a100"] if args.a100 else []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout, check=False)
            out = proc.stdout.strip().splitlines()
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            row = json.loads(out[-1]) if proc.returncode == 0 and out else {"error": tail[-200:]}
        except subprocess.TimeoutExpired:
            row = {"error": f"timed out after {args.timeout} s"}
        row.update({"model": model, "gpus": gpus})
        rows.append(row)
        print(rows_markdown([row])[-1], flush=True)
        meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(), "cpus": os.cpu_count()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "suite": "extractors", "results": rows}, indent=1))
        args.out.with_suffix(".md").write_text("\n".join(rows_markdown(rows)) + "\n")
    print("\n".join(rows_markdown(rows)))
    if args.all_meshes:
        args.out.with_suffix(".md").write_text("\n".join([*rows_markdown(rows), "", *mesh_markdown(rows)]) + "\n")
    return 0


def mesh_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """Every mesh of every case: greedy's unrestricted plan against the differentiable one."""
    lines = [
        "| model | GPUs | mesh | greedy ms | differentiable ms | saving | greedy s | differentiable s | ratio (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for label, m in (r.get("meshes") or {}).items():
            saving = (m["greedy_s"] - m["differentiable_s"]) / m["greedy_s"]
            lines.append(
                f"| {r['model']} | {r['gpus']} | {label} | {m['greedy_s'] * 1e3:.4f} | "
                f"{m['differentiable_s'] * 1e3:.4f}{'' if m['fits'] else ' (no fit)'} | {saving:.2%} | "
                f"{m['greedy_seconds']:.2f} | {m['differentiable_seconds']:.2f} | {_mesh_ratio(m)} |"
            )
    return lines


def _mesh_ratio(m: dict[str, Any]) -> str:
    if not m.get("greedy_cpu_s"):
        return "-"
    return f"{m['differentiable_cpu_s'] / m['greedy_cpu_s']:.1f}×"


if __name__ == "__main__":
    raise SystemExit(main())
