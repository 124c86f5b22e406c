"""Peak memory of writing and running a plan of a ~1 GiB model: `python -m benchmarks.memory`.

Makes an MLP with external data (``pairs`` × (hidden→ffn, ffn→hidden) float32 weights; by default 4 × 2 ×
4096 × 8192 × 4 bytes = 1 GiB) in a temporary folder, then measures the peak RSS of ``optimize --devices 4``,
``run`` (local backend) and ``check``, each in a fresh process (the process's own peak; the e-graph
worker, a child, is reported apart as ``children_peak_bytes``). Each peak is reported in bytes, above the
floor (the same command on a tiny model of the same structure: interpreter and libraries), and relative
to one rank's weight bytes (the largest rank's, from plan.json), to the plan's (all ranks') and to the
model's largest tensor. Writes benchmarks/results/memory.json (``--label`` names the entry, e.g. ``before``
and ``after`` a change; other labels already in the file are kept) and a table of every label in
memory.md beside it.
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
RESULTS = ROOT / "benchmarks" / "results" / "memory.json"
GIB = 1 << 30


def commands(model: Path, plan: Path, devices: int) -> dict[str, list[str]]:
    return {
        "optimize": ["optimize", str(model), "--devices", str(devices), "-o", str(plan), "-q"],
        "run": ["run", str(plan)],
        "check": ["check", str(model), str(plan)],
    }


def peaks_of(model: Path, plan: Path, devices: int) -> dict[str, dict[str, Any]]:
    """Each command's peak RSS and wall time, one fresh process each."""
    from big_models import peak_rss_bytes

    peaks = {}
    for name, cmd in commands(model, plan, devices).items():
        start = time.perf_counter()
        peak = peak_rss_bytes(cmd, timeout=1800)
        peaks[name] = {
            "peak_bytes": peak.self_bytes,
            "children_peak_bytes": peak.children_bytes,
            "wall_s": round(time.perf_counter() - start, 1),
        }
    return peaks


def measure(hidden: int, ffn: int, pairs: int, devices: int) -> dict[str, Any]:
    """Peaks of the big model's commands, and of the same commands on a tiny model of the same structure:
    the floor (interpreter, numpy, onnx, onnxruntime, egglog) that ``above_floor_bytes`` subtracts."""
    sys.path.insert(0, str(ROOT / "tests"))
    from big_models import write_external_mlp

    with tempfile.TemporaryDirectory(prefix="memory-benchmark-") as tmp:
        tiny = write_external_mlp(Path(tmp) / "tiny", 64, 128, pairs)
        floors = peaks_of(tiny.path, Path(tmp) / "tiny-plan", devices)
        model = write_external_mlp(Path(tmp) / "model", hidden, ffn, pairs)
        plan = Path(tmp) / "plan"
        peaks = peaks_of(model.path, plan, devices)
        meta = json.loads((plan / "plan.json").read_text())
        rank_bytes = max(meta["memory"]["weight_bytes_per_rank"])
    for name, entry in peaks.items():
        entry["floor_bytes"] = floors[name]["peak_bytes"]
    return {
        "model": {"hidden": hidden, "ffn": ffn, "pairs": pairs, "weight_bytes": model.weight_bytes},
        "devices": devices,
        "largest_tensor_bytes": model.largest_tensor_bytes,
        "rank_weight_bytes": rank_bytes,
        "weight_bytes_per_rank": meta["memory"]["weight_bytes_per_rank"],
        "mesh": meta["mesh"]["sizes"],
        "peaks": peaks,
    }


def add_ratios(record: dict[str, Any]) -> dict[str, Any]:
    """Each peak above its floor, and that over one rank's weights, the plan's (all ranks': what `run` and
    `check` must hold, since the local backend runs every rank in one process) and the largest tensor."""
    plan_bytes = sum(record["weight_bytes_per_rank"])
    for entry in record["peaks"].values():
        above = entry["peak_bytes"] - entry["floor_bytes"]
        entry["above_floor_bytes"] = above
        entry["peak_gib"] = round(entry["peak_bytes"] / GIB, 3)
        entry["above_floor_per_rank_weights"] = round(above / record["rank_weight_bytes"], 2)
        entry["above_floor_per_plan_weights"] = round(above / plan_bytes, 2)
        entry["above_floor_per_largest_tensor"] = round(above / record["largest_tensor_bytes"], 2)
    return record


def markdown(results: dict[str, Any]) -> str:
    """The peaks of every label as a markdown table."""
    lines = [
        "# Peak memory: `python -m benchmarks.memory`",
        "",
        "Peak RSS of each command's own process; *above floor* subtracts the same command on a tiny model of",
        "the same structure (interpreter and libraries). Ratios are of the bytes above the floor.",
        "",
        "| label | model | mesh | command | peak GiB | above floor GiB | × one rank's weights | × the plan's "
        "| × largest tensor | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, record in results.items():
        size = f"{record['model']['weight_bytes'] / GIB:.2f} GiB"
        mesh = "×".join(map(str, record["mesh"]))
        for name, e in record["peaks"].items():
            lines.append(
                f"| {label} | {size} | {mesh} | {name} | {e['peak_gib']:.2f} | {e['above_floor_bytes'] / GIB:.2f} "
                f"| {e['above_floor_per_rank_weights']} | {e['above_floor_per_plan_weights']} "
                f"| {e['above_floor_per_largest_tensor']} | {e['wall_s']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--label", default="current", help="the entry's name in memory.json")
    parser.add_argument("-o", "--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    record = add_ratios(measure(args.hidden, args.ffn, args.pairs, args.devices))
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results[args.label] = record
    results = {label: add_ratios(entry) for label, entry in results.items()}  # older entries: same ratios
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(results))
    print(f"{args.label}: {record['model']['weight_bytes'] / GIB:.2f} GiB model on {args.devices} devices")
    for name, entry in record["peaks"].items():
        print(
            f"  {name:9s} peak {entry['peak_gib']:6.2f} GiB  above floor {entry['above_floor_bytes'] / GIB:6.2f} GiB"
            f" = {entry['above_floor_per_rank_weights']:5.2f} × one rank's weights"
            f" = {entry['above_floor_per_plan_weights']:5.2f} × the plan's"
            f" = {entry['above_floor_per_largest_tensor']:5.2f} × largest tensor  ({entry['wall_s']} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
