"""Speed of the bounded proof: `python -m benchmarks.verify_speed FILE [--prefix P] [--json OUT]`.

For every rule of FILE whose name starts with P (both directions of a birewrite), runs the exhaustive bounded
proof alone (no generic proof, no numeric back-up) and prints its status, the cases enumerated and checked,
the CPU seconds (``time.process_time``: the machine is shared, wall time says more about the neighbours) and
the milliseconds per checked case. The figures of the verify-speed change are in
benchmarks/results/verify_speed.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from unity_eq.verify import load_program
from unity_eq.verify._bounded import prove_bounded
from unity_eq.verify._guards import DerivedFacts


def measure(path: Path, prefix: str = "") -> list[dict[str, Any]]:
    """One row per proof direction of every chosen rule of ``path``."""
    program, _files = load_program([path])
    facts = DerivedFacts(program.analyses)
    rows = []
    for rule in program.rules:
        if not rule.name.startswith(prefix) or not rule.file.endswith(path.name):
            continue
        for directed in [rule, rule.reversed()] if rule.bidirectional else [rule]:
            start = time.process_time()
            result = prove_bounded(directed, facts)
            seconds = time.process_time() - start
            rows.append(
                {
                    "rule": rule.name,
                    "status": result.status,
                    "cases": result.classes,
                    "checked": result.checked,
                    "cpu_s": round(seconds, 3),
                    "ms_per_case": round(1000 * seconds / max(1, result.checked), 3),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--prefix", default="", help="only rules whose name starts with this")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = measure(args.file, args.prefix)
    for row in rows:
        print(
            f"{row['rule']:48s} {row['status']:8s} {row['cases']:7d} cases {row['checked']:7d} checked "
            f"{row['cpu_s']:8.2f} s {row['ms_per_case']:7.2f} ms/case"
        )
    print(f"total {sum(r['cpu_s'] for r in rows):.1f} s CPU, {len(rows)} proofs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
