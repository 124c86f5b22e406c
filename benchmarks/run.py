"""Run the benchmark suite: `python -m benchmarks.run [--suite core|scale|all] [--devices 8,16] ...`.

Each (model, devices, objective) case runs `benchmarks.measure` in a fresh subprocess, so peak memory is
per case. Results go to a JSON file (default benchmarks/results/latest.json) and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.models import MODELS, ROOT, SUITES


def run_case(model: Path, devices: int, objective: str, timeout: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.measure", str(model), "--devices", str(devices), "--objective", objective]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", default="core", choices=sorted(SUITES))
    parser.add_argument("--models", help="comma-separated model names (overrides --suite)")
    parser.add_argument("--devices", default="4", help="comma-separated device counts")
    parser.add_argument("--objective", default="inference", choices=["inference", "training"])
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latest.json")
    args = parser.parse_args()

    names = args.models.split(",") if args.models else SUITES[args.suite]
    devices = [int(d) for d in args.devices.split(",")]
    console = Console()
    rows = []
    for name in names:
        bench = MODELS[name]
        with console.status(f"preparing {name}"):
            path = bench.path()
        for n in devices:
            with console.status(f"optimizing {name} on {n} devices ({args.objective})"):
                record = run_case(path, n, args.objective, args.timeout)
            record.update({"model": name, "devices": n, "objective": args.objective, "layers": bench.layers})
            rows.append(record)
            summary = record.get("error") or f"{record['wall_s']:.1f} s, {record['peak_mib']:.0f} MiB"
            console.print(f"{name} × {n}: {summary}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": platform.platform(),
        "cpus": __import__("os").cpu_count(),
    }
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    table = Table(title=f"optimize ({args.objective}) — {args.out}")
    for col in (
        "model",
        "devices",
        "mesh",
        "nodes",
        "e-nodes",
        "wall s",
        "peak MiB",
        "worker MiB",
        "cost ms",
        "comm %",
    ):
        table.add_column(col, justify="right" if col != "model" else "left")
    for r in rows:
        if "error" in r:
            table.add_row(r["model"], str(r["devices"]), "error", "", "", "", "", "", r["error"][:40], "")
            continue
        comm = 100 * r["comm_s"] / r["cost_s"] if r["cost_s"] else 0
        table.add_row(
            r["model"],
            str(r["devices"]),
            r["mesh"],
            str(r["nodes"]),
            str(r["enodes"]),
            f"{r['wall_s']:.1f}",
            f"{r['peak_mib']:.0f}",
            f"{r['worker_peak_mib'] or 0:.0f}",
            f"{r['cost_s'] * 1e3:.3f}",
            f"{comm:.0f}",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
