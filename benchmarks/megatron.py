"""The ``megatron`` suite: GPT rows of Narayanan et al. (SC'21) planned by the stage search.

``python -m benchmarks.run --suite megatron`` runs each row in a fresh subprocess (``python -m
benchmarks.megatron ROW``: one JSON line, so peak memory is per row) and writes benchmarks/results/megatron.json
and .md. Each row: the same model (benchmarks/gpt.py), batch, sequence and machine (A100-80GB, 8 per node,
8 × 200 Gb/s InfiniBand: the ``a100x8`` preset with ``ib200``) as the paper's; the configuration the search
chooses; its predicted step and TFLOP/s per GPU by Megatron's formula next to the paper's measured figure;
memory per device; search time and peak RSS (this process: the e-graph workers are children, reported apart).

Ratios: the chosen plan's step time against the best plan without a pipeline (one stage), against pure data
parallelism (t = p = 1, if it fits) and against Megatron's own configuration (its t, p and d, microbatch 1,
1F1B, full recomputation, no ZeRO) priced by the same cost model. "Saved by" columns: the chosen
configuration's peak memory per device without each technique (recomputation, ZeRO) minus with it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.gpt import ROWS, MegatronRow

ROOT = Path(__file__).resolve().parents[1]
MICRO_SIZES = (1, 2, 4)
DEFAULT_ROWS = ("1.7B", "18B", "175B", "1T")


def _machine(row: MegatronRow) -> Any:
    from unity_eq.machine import load_machine

    return load_machine("a100x8", nodes=row.gpus // 8, interconnect="ib200")


def _tflops(row: MegatronRow, seconds: float) -> float:
    return row.model.flops_per_step(row.batch) / seconds / row.gpus / 1e12


def _config_record(plan: Any) -> dict[str, Any]:
    c = plan.config
    return {
        "t": c.tensor,
        "p": c.stages,
        "d": c.data,
        "microbatch": c.microbatch,
        "microbatches": c.microbatches,
        "schedule": c.schedule,
        "recompute": c.recompute,
        "zero": c.zero,
        "order": c.order,
        "policy": c.policy,
        "step_s": plan.step_s,
        "sync_s": plan.sync_s,
        "bubble": plan.bubble,
        "peak_gib": plan.peak_bytes / 2**30,
        "layers_per_stage": [j - i for i, j in plan.cuts],
    }


def run_row(name: str) -> dict[str, Any]:
    """Plan one row; the record benchmarks.run tabulates."""
    from unity_eq.cost import TRAINING
    from unity_eq.rulefile.manifest import default_rule_files, load_rule_files
    from unity_eq.search.meshes import device_groups
    from unity_eq.stages import StageConfig, evaluate, group_sizes, price_pieces, stage_search

    row = ROWS[name]
    machine = _machine(row)
    start = time.perf_counter()
    rules = load_rule_files(default_rule_files(True))
    table = price_pieces(
        row.model.graph, MICRO_SIZES, group_sizes(machine), machine, TRAINING, rules, groups=device_groups(machine)
    )
    priced = time.perf_counter()
    found = stage_search(table, machine, TRAINING, row.batch, MICRO_SIZES)
    searched = time.perf_counter()
    best = found.best

    def price(config: StageConfig) -> Any:
        return min(
            (
                p
                for policy in ("fastest", "sharded", "smallest")
                if (p := evaluate(replace(config, policy=policy), table, machine, TRAINING, row.batch)) is not None
            ),
            key=lambda p: p.step_s,
            default=None,
        )

    megatron = price(StageConfig(row.stages, row.data, row.tensor, 1, row.batch // row.data, "1f1b", "full", 0))
    data_parallel = min(
        (
            p
            for m in MICRO_SIZES
            if row.batch % (row.gpus * m) == 0
            for r in ("none", "full")
            for z in (0, 1, 2, 3)
            if (p := price(StageConfig(1, row.gpus, 1, m, row.batch // (row.gpus * m), "1f1b", r, z))) is not None
        ),
        key=lambda p: p.step_s,
        default=None,
    )
    saved: dict[str, float | None] = {}
    for label, change in (("recompute", {"recompute": "none"}), ("zero", {"zero": 0})):
        without = evaluate(replace(best.config, **change), table, machine, TRAINING, row.batch)
        if replace(best.config, **change) == best.config:
            saved[label] = 0.0
        else:
            saved[label] = None if without is None else (without.peak_bytes - best.peak_bytes) / 2**30
    # The one-stage plan that recomputes nothing: what memory the other techniques save against
    return {
        "row": name,
        "params_b": row.model.parameters() / 1e9,
        "gpus": row.gpus,
        "batch": row.batch,
        "paper": {"t": row.tensor, "p": row.stages, "d": row.data, "tflops": row.tflops},
        "chosen": _config_record(best),
        "tflops": _tflops(row, best.step_s),
        # the FLOPs the plan runs: Megatron's formula counts a recomputed forward (96); without it, 72
        "hardware_tflops": row.model.flops_per_step(row.batch, best.config.recompute == "full")
        / best.step_s
        / row.gpus
        / 1e12,
        "fits": best.fits,
        "capacity_gib": best.capacity / 2**30,
        "megatron": _config_record(megatron) if megatron else None,
        "megatron_tflops": _tflops(row, megatron.step_s) if megatron else None,
        "best_flat": _config_record(found.best_flat) if found.best_flat else None,
        "data_parallel": _config_record(data_parallel) if data_parallel else None,
        "vs_flat": found.best_flat.step_s / best.step_s if found.best_flat else None,
        "vs_data_parallel": data_parallel.step_s / best.step_s if data_parallel else None,
        "vs_megatron": megatron.step_s / best.step_s if megatron else None,
        "saved_gib": saved,
        "evaluated": found.evaluated,
        "fitting": found.fitting,
        "saturations": len(table.options),
        "enodes": table.enodes,
        "pieces_s": priced - start,
        "search_s": searched - priced,
        "wall_s": time.perf_counter() - start,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "workers_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def rows_markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | GPUs | batch | chosen t,p,d (m×b) | schedule | recompute | ZeRO | GiB/device | step s | TFLOP/s "
        "(paper) | Megatron's config, ours | ×no pipeline | ×data parallel | ×Megatron config | bubble "
        "| GiB saved by recompute, by ZeRO (without it) | search s | peak MiB (workers) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(value: float | None) -> str:
        return "no fit" if value is None else f"{value:.2f}"

    for r in rows:
        if "error" in r:
            lines.append(f"| {r['row']} | error: {r['error']} |" + "|" * 17)
            continue
        c = r["chosen"]
        saved = r["saved_gib"]
        saved_text = ", ".join("no fit" if saved[k] is None else f"{saved[k]:.1f}" for k in ("recompute", "zero"))
        lines.append(
            f"| {r['row']} ({r['params_b']:.1f}B) | {r['gpus']} | {r['batch']} | {c['t']},{c['p']},{c['d']} "
            f"({c['microbatches']}×{c['microbatch']}) | {c['schedule']} | {c['recompute']} | {c['zero']} | "
            f"{c['peak_gib']:.1f} | {c['step_s']:.2f} | {r['tflops']:.0f} ({r['paper']['tflops']:.0f}) | "
            f"{(r['megatron_tflops'] or 0):.0f} | {ratio(r['vs_flat'])} | {ratio(r['vs_data_parallel'])} | "
            f"{ratio(r['vs_megatron'])} | {c['bubble']:.1%} | {saved_text} | {r['pieces_s'] + r['search_s']:.0f} | "
            f"{r['peak_mib']:.0f} ({r['workers_peak_mib']:.0f}) |"
        )
    return lines


def run_suite(names: list[str], timeout: int) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        cmd = [sys.executable, "-m", "benchmarks.megatron", name]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            rows.append({"row": name, "error": f"timed out after {timeout} s"})
            continue
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            rows.append({"row": name, "error": tail[-200:]})
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"megatron: {name}: {rows[-1]['wall_s']:.0f} s", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description="plan one row of the megatron suite; prints one JSON line")
    parser.add_argument("row", choices=sorted(ROWS))
    args = parser.parse_args()
    json.dump(run_row(args.row), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
