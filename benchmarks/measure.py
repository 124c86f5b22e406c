"""Measure one `optimize` run in this process (benchmarks.run starts one fresh subprocess per case).

Prints one JSON object: wall time per stage, this process's and the e-graph worker's peak memory, e-graph
size, the mesh chosen, the plan's predicted cost, the baselines' costs relative to it, the pieces when the
model was optimized block by block, and the ILP's cost, bound and time when ``--extractor ilp``.
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


def machine_kwargs(spec: str) -> dict[str, Any]:
    """``h100x8`` or ``h100x8:NODES:INTERCONNECT`` (e.g. ``h100x8:8:ib400`` for 64 GPUs)."""
    name, *rest = spec.split(":")
    kwargs: dict[str, Any] = {"machine": name}
    if rest:
        kwargs["nodes"] = int(rest[0])
    if len(rest) > 1:
        kwargs["interconnect"] = rest[1]
    return kwargs


def load_model(model: str) -> Any:
    """A path, or ``megatron-layer``: one transformer layer at Megatron-LM's sizes (H=4096, FFN 16384,
    batch 1 × 512) built as a graph with zero-stride weights (nothing is materialized)."""
    if model != "megatron-layer":
        return model
    sys.path.insert(0, str(ROOT / "tests"))
    from blocks import transformer_graph

    return transformer_graph("am", batch=1, seq=512, hidden=4096, ffn=16384)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--objective", default="inference")
    parser.add_argument("--extractor", default="greedy")
    parser.add_argument("--ilp-time-limit", type=float, default=60.0)
    parser.add_argument("--blocks", default="auto")
    parser.add_argument("--write", action="store_true", help="also lower and write the plan")
    parser.add_argument("--no-generated-rules", action="store_true", help="without rules/generated/")
    args = parser.parse_args()

    from unity_eq import optimize
    from unity_eq.egraph import peak_rss_mib

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = optimize(
            load_model(args.model),
            objective=args.objective,
            extractor=args.extractor,
            ilp_time_limit=args.ilp_time_limit,
            blocks=args.blocks,
            generated_rules=not args.no_generated_rules,
            output_dir=Path(tmp) / "plan" if args.write else None,
            **machine_kwargs(args.machine),
        )
    wall = time.perf_counter() - start
    plan, report = result.plan, result.plan.report
    tried = report.mesh_search.tried if report.mesh_search else ()
    saturation = plan.stats.saturation
    assert saturation is not None
    ilp = report.extraction.ilp if report.extraction else None
    record = {
        "wall_s": round(wall, 3),
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "peak_mib": round(peak_rss_mib(), 1),
        "worker_peak_mib": saturation.worker_peak_mib,
        "enodes": saturation.enodes,
        "enodes_all_meshes": sum(t.enodes or 0 for t in tried),
        "meshes_tried": len(tried),
        "stop_reason": saturation.stop_reason,
        "mesh": report.mesh_search.chosen if report.mesh_search else str(plan.mesh),
        "cost_s": plan.cost.total,
        "compute_s": plan.cost.compute,
        "comm_s": plan.cost.comm,
        "collectives": len(plan.collectives()),
        "nodes": len(result.graph.nodes),
        "baselines": {
            name: {"ratio": b.ratio, "sharded": b.sharded, "fits": b.fits} for name, b in report.baselines.items()
        },
        "blocks": report.blocks.to_json() if report.blocks else None,
        "ilp": ilp.to_json() if ilp else None,
        "fits": report.memory.fits if report.memory else None,
    }
    json.dump(record, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
