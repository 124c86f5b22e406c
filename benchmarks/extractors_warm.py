"""Greedy against differentiable extraction on the same e-graphs, warm, in CPU time:
`python -m benchmarks.extractors_warm save DIR --case MODEL:GPUS[:a100][=MESH;MESH…] [--case …]` then
`python -m benchmarks.extractors_warm time DIR [--code PATH] [--repeats 7]`.

`save` runs `optimize` (greedy) on each case and pickles the extractor of each named mesh (default: the chosen
one) with the restriction and memory penalty of its chosen plan (the chosen mesh) or none (another mesh).
`time` loads each pickle and alternates greedy and differentiable extractions of it `--repeats` times after
one warm-up pair (which also pays the e-graph's first differentiable search: `import torch`'s first
operations and the relax layout, timed apart as *layout ms*), keeping each kind's minimum of
`time.process_time` (the machine this ran on is shared: CPU time, its minimum over alternating runs, is the
figure its load inflates least). `--code PATH` puts another checkout's `unity_eq` first on the path, so the
same pickles time two versions of the code (its pickled extractors must load there). The ratio is
differentiable extraction (greedy + search + plan) / greedy extraction; the costs are the plans' predicted
step times.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path
from typing import Any


def save(folder: Path, cases: list[str]) -> None:
    """Optimize each case (greedy) and pickle the named meshes' extractors (see the module docstring)."""
    from benchmarks.extractors import _model_path
    from benchmarks.measure import load_model, machine_kwargs
    from benchmarks.run import MACHINES
    from unity_eq import optimize
    from unity_eq.extract import Restriction

    folder.mkdir(parents=True, exist_ok=True)
    for case in cases:
        spec, _, meshes = case.partition("=")
        model, gpus, *kind = spec.split(":")
        a100 = kind == ["a100"]
        machine = {"devices": int(gpus)} if a100 else machine_kwargs(MACHINES[int(gpus)])
        result = optimize(load_model(_model_path(model)), objective="training", **machine)
        search = result.search
        assert search is not None
        trial = search.trial
        chosen = next(e for e, _ in trial.extractions if e.plan is search.plan)
        for mesh in meshes.split(";") if meshes else [trial.label]:
            mine = mesh == trial.label
            knobs = (chosen.restriction, chosen.penalty) if mine else (Restriction(), 0.0)
            name = f"{model}-{gpus}-{'a100' if a100 else 'h100'}-{mesh.replace(',', '_').replace('=', '')}.pkl"
            with (folder / name).open("wb") as out:
                pickle.dump((search.extractors[mesh], *knobs), out)
            print(f"{name}: mesh {mesh}{' (chosen)' if mine else ''}", flush=True)


def time_one(path: Path, repeats: int) -> dict[str, Any]:
    """Greedy and differentiable extraction of one pickled extractor, alternating (module docstring)."""
    with path.open("rb") as source:
        extractor, restriction, penalty = pickle.load(source)
    began = time.process_time()
    extractor.extract(restriction, penalty, "greedy")
    extractor.extract(restriction, penalty, "differentiable")
    warmup = time.process_time() - began
    greedy: list[float] = []
    relaxed: list[float] = []
    for _ in range(repeats):
        began = time.process_time()
        plain = extractor.extract(restriction, penalty, "greedy")
        greedy.append(time.process_time() - began)
        began = time.process_time()
        found = extractor.extract(restriction, penalty, "differentiable")
        relaxed.append(time.process_time() - began)
    before, after = plain.plan.cost.total, found.stages["differentiable"].cost.total
    return {
        "case": path.stem,
        "greedy_ms": min(greedy) * 1e3,
        "differentiable_ms": min(relaxed) * 1e3,
        "ratio": min(relaxed) / min(greedy),
        "warmup_ms": warmup * 1e3,
        "greedy_cost_ms": before * 1e3,
        "differentiable_cost_ms": after * 1e3,
        "saving": (before - after) / before,
        "improved": f"{sum(r.kept for r in found.relaxed)}/{len(found.relaxed)}",
        "steps": [r.steps for r in found.relaxed],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["save", "time"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--case", action="append", help="MODEL:GPUS[:a100][=MESH;MESH…] (save; repeatable)")
    parser.add_argument("--code", type=Path, help="a checkout whose unity_eq to time (time)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.code is not None:
        sys.path.insert(0, str(args.code.resolve()))
    if args.mode == "save":
        save(args.folder, args.case or ["megatron-layer:16:a100"])
        return 0
    import torch  # noqa: F401 - a process pays it once, before its first differentiable search: not timed

    print("| case | greedy ms | differentiable ms | ratio | warm-up pair ms | plan ms: greedy → differentiable |")
    print("|---|---|---|---|---|---|")
    for path in sorted(args.folder.glob("*.pkl")):
        r = time_one(path, args.repeats)
        print(
            f"| {r['case']} | {r['greedy_ms']:.1f} | {r['differentiable_ms']:.1f} | {r['ratio']:.2f}× "
            f"| {r['warmup_ms']:.0f} | {r['greedy_cost_ms']:.7f} → {r['differentiable_cost_ms']:.7f} "
            f"({-r['saving']:+.4%}, {r['improved']} improved, steps {r['steps']}) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
