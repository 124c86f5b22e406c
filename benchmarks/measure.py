"""Measure one `optimize` run in this process (run by benchmarks.run in a fresh subprocess per case).

Prints one JSON object: wall time per stage, peak memory of this process and of the e-graph worker, e-graph
size, the plan's predicted cost, and whatever the plan's stats carry (baselines, ILP report).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--objective", default="inference")
    parser.add_argument("--extractor", default="greedy")
    parser.add_argument("--write", action="store_true", help="also lower and write the plan")
    args = parser.parse_args()

    from unity_eq import optimize
    from unity_eq.egraph import peak_rss_mib

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan" if args.write else None
        result = optimize(args.model, devices=args.devices, objective=args.objective, output_dir=out)
    wall = time.perf_counter() - start
    plan = result.plan
    record = {
        "wall_s": round(wall, 3),
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "peak_mib": round(peak_rss_mib(), 1),
        "worker_peak_mib": plan.stats["saturation"].get("worker_peak_mib"),
        "enodes": plan.stats["saturation"]["enodes"],
        "iterations": plan.stats["saturation"]["iterations"],
        "stop_reason": plan.stats["saturation"]["stop_reason"],
        "mesh": str(plan.mesh),
        "cost_s": plan.cost.total,
        "compute_s": plan.cost.compute,
        "comm_s": plan.cost.comm,
        "collectives": len(plan.collectives()),
        "nodes": len(result.graph.nodes),
        "stats": {k: v for k, v in plan.stats.items() if k not in ("saturation", "timings")},
    }
    json.dump(record, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
