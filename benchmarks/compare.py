"""Compare two benchmark result files plan by plan: `python -m benchmarks.compare BEFORE.json AFTER.json`.

A refactoring must leave every plan and every predicted cost as it was (bit for bit); timings and memory may
move. This prints one line per case whose plan fields differ and exits 1 if any does, so a restructuring can
show "same plans, same costs" with a command instead of a claim.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: The fields of a result row that describe the plan (not how long finding it took).
PLAN_FIELDS = ("mesh", "cost_s", "compute_s", "comm_s", "collectives", "nodes", "fits", "enodes", "stop_reason")


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row.get("model"), row.get("layers"), row.get("gpus"), row.get("objective"))


def _plan_view(row: dict[str, Any]) -> dict[str, Any]:
    view = {name: row.get(name) for name in PLAN_FIELDS}
    view["baselines"] = row.get("baselines")
    blocks = row.get("blocks") or {}
    view["blocks"] = {k: blocks.get(k) for k in ("pieces", "distinct", "cuts", "copies")} if blocks else None
    return view


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The differences, one line per case and field (empty when every plan is the same)."""
    old = {_key(r): r for r in before["results"]}
    new = {_key(r): r for r in after["results"]}
    problems = [f"{key}: only in the first file" for key in old.keys() - new.keys()]
    problems += [f"{key}: only in the second file" for key in new.keys() - old.keys()]
    for key in sorted(old.keys() & new.keys(), key=str):
        a, b = _plan_view(old[key]), _plan_view(new[key])
        problems += [f"{key}: {name}: {a[name]!r} -> {b[name]!r}" for name in a if a[name] != b[name]]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    before, after = (json.loads(p.read_text(encoding="utf-8")) for p in (args.before, args.after))
    problems = compare(before, after)
    for line in problems:
        print(line)
    cases = len(before["results"])
    verdict = "same plans and costs" if not problems else f"{len(problems)} differences"
    print(f"{cases} cases in {args.before.name}: {verdict}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
