"""``unity-eq explain plan/``: what a plan does and what it costs, read from plan.json alone.

The report has the mesh and how its axes sit on the machine, the cost split (compute, communication by axis
and phase, the training overlap, memory per device), the baselines priced at optimize time (one device,
data parallel, best single-axis tensor parallel) with their ratio to the plan, the meshes the search tried,
the sharding of every op, a text picture of the parallel computation graph and notes on ops that stayed
replicated. :func:`explain` returns it as plain data (``--json`` prints that); :func:`render` makes the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from unity_eq.errors import PlanError
from unity_eq.ops.registry import rule_file_for, spec_for
from unity_eq.planfile import check_explain_fields, read_plan_json

__all__ = ["explain", "load_plan_json", "reading_plan", "render", "report_of", "tensor_bytes"]

BASELINE_ORDER = ("one_device", "data_parallel", "tensor_parallel")


def plan_json_path(plan_dir: str | Path) -> Path:
    root = Path(plan_dir)
    return root / "plan.json" if root.is_dir() else root


def load_plan_json(plan_dir: str | Path) -> dict[str, Any]:
    root = Path(plan_dir)
    path = plan_json_path(root)
    if not path.exists():
        raise PlanError(f"{root}: no plan.json. Pass the directory written by `unity-eq optimize`.")
    meta = read_plan_json(path, need=("steps", "tensors"))  # the checks `run` makes too
    check_explain_fields(meta, path)  # and the types of every field explain reads
    return meta


@contextmanager
def reading_plan(plan_dir: str | Path) -> Iterator[None]:
    """Last resort around code that reads a checked plan.json: a field of a shape `check_explain_fields` does
    not cover becomes a PlanError naming the file, with the original exception chained (``__cause__``), so a
    bug in explain is not hidden: its message says to report it when plan.json is as optimize wrote it."""
    try:
        yield
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise PlanError(
            f"{plan_json_path(plan_dir)}: a field has an unexpected value ({type(exc).__name__}: {exc}). "
            "Re-run `unity-eq optimize`; if plan.json is as optimize wrote it, report this as a bug."
        ) from exc


def _kinds(steps: list[dict[str, Any]]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for step in steps:
        kind = step["kind"]
        if kind == "weight":
            kinds[step["out"]] = "weight"
        elif kind == "input":
            kinds[step["out"]] = "input"
        elif kind in ("partition", "replicate"):
            kinds[step["out"]] = kinds.get(step["src"], "activation")
        elif kind == "compute":
            for out in step["outputs"]:
                if out:
                    kinds[out] = "activation"
        else:
            kinds[step["out"]] = "activation"
    return kinds


def explain(plan_dir: str | Path) -> dict[str, Any]:
    """The explain report of a plan directory (or a plan.json) as plain data."""
    meta = load_plan_json(plan_dir)
    with reading_plan(plan_dir):
        return report_of(meta)


def report_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The explain report of a plan.json already read (``explain --format html`` draws from both)."""
    axes = meta["mesh"]["axes"]
    tensors = meta["tensors"]
    steps = meta["steps"]
    kinds = _kinds(steps)
    cost = meta.get("cost", {})
    total = cost.get("total_s") or 0.0

    ops = []
    for index, step in enumerate(steps):
        if step["kind"] != "compute":
            continue
        outs = [o for o in step["outputs"] if o]
        out = outs[0] if outs else ""
        t = tensors.get(out, {})
        ops.append(
            {
                "step": index,
                "op": step["op"],
                "output": out,
                "source": t.get("value") or t.get("source"),
                "placement": dict(zip(axes, t.get("placement", []), strict=False)),
                "shape": t.get("shape"),
                "local_shape": t.get("local_shape"),
                "inputs": [
                    {"tensor": i, "placement": dict(zip(axes, tensors[i]["placement"], strict=False))}
                    for i in step["inputs"]
                    if isinstance(i, str) and i in tensors
                ],
                "compute_s": step.get("compute_s"),
            }
        )

    communication = []
    for index, step in enumerate(steps):
        seconds = step.get("communication_s") or 0.0
        if seconds <= 0:
            continue
        src = step.get("src", "")
        kind = {
            "combine": "all-gather",
            "reduce": "all-reduce",
            "partition": "gradient all-gather (backward)",
            "replicate": "gradient all-reduce"
            + (" (weight)" if kinds.get(src) == "weight" else " (activation, backward)"),
        }.get(step["kind"], step["kind"])
        src_tensor = tensors.get(src, {})
        communication.append(
            {
                "step": index,
                "kind": kind,
                "axis": step.get("axis"),
                "tensor": step.get("out"),
                "of": src_tensor.get("value") or src_tensor.get("source") or src,
                "seconds": seconds,
            }
        )

    baselines = []
    for name in BASELINE_ORDER:
        b = meta.get("baselines", {}).get(name)
        if b is not None:
            baselines.append({"name": name, **b})

    return {
        "model": meta["model"]["name"],
        "machine": meta.get("machine", {}).get("name"),
        "objective": meta.get("objective"),
        "mesh": {
            "label": ",".join(f"{a}={n}" for a, n in zip(axes, meta["mesh"]["sizes"], strict=True)) + _on_devices(meta),
            "axes": meta.get("machine", {}).get("mesh_axes", [{"name": a} for a in axes]),
        },
        "cost": cost,
        "memory": {k: v for k, v in meta.get("memory", {}).items() if k != "weight_bytes_per_rank"},
        "baselines": baselines,
        "plan_vs_baselines": {b["name"]: b.get("ratio") for b in baselines},
        "mesh_search": meta.get("mesh_search", {}),
        "parallelism": meta.get("parallelism", {}),
        "extraction": meta.get("extraction", {}),
        "ops": ops,
        "communication": communication,
        "pcg": pcg_lines(meta, kinds),
        "notes": _notes(ops, total),
    }


def _on_devices(meta: dict[str, Any]) -> str:
    """`` on devices 0-3`` when the plan leaves some of the machine's devices idle, else ""."""
    if not meta.get("parallelism", {}).get("idle_devices"):
        return ""
    from unity_eq.report import device_span

    return " on " + device_span([r["device"] for r in meta["mesh"]["ranks"]])


def _notes(ops: list[dict[str, Any]], total: float) -> list[str]:
    """Op types that stayed replicated on every axis while the plan shards others, with the file to extend."""
    sharded_any = any(any(p != "R" for p in op["placement"].values()) for op in ops)
    if not sharded_any:
        return []
    by_type: dict[str, list[dict[str, Any]]] = {}
    for op in ops:
        by_type.setdefault(op["op"], []).append(op)
    notes = []
    for op_type, found in sorted(by_type.items()):
        if any(any(p != "R" for p in op["placement"].values()) for op in found):
            continue
        share = sum(op.get("compute_s") or 0.0 for op in found)
        if total and share < 0.01 * total:
            continue
        spec = spec_for(op_type)
        if spec is None:
            where = "it has no typed constructor: add its family to unity_eq/ops/ (docs/architecture.md)"
        else:
            where = f"extend {rule_file_for(op_type)}"
        notes.append(
            f"{op_type} ×{len(found)} stayed replicated on every axis ({share * 1e3:.3f} ms of compute); "
            f"to shard it, {where}"
        )
    return notes


def _fmt_placement(placement: list[str], axes: list[str]) -> str:
    return " ".join(f"{a}:{p}" for a, p in zip(axes, placement, strict=False))


def _fmt_shape(shape: list[int] | None) -> str:
    return "[" + ",".join(str(d) for d in shape or []) + "]"


def pcg_lines(meta: dict[str, Any], kinds: dict[str, str] | None = None) -> list[str]:
    """A text picture of the PCG: one line per op and per collective, weights folded into their last slice.

    ``=>`` marks a collective in the forward pass, ``<=`` one in the backward pass (training only).
    """
    axes = meta["mesh"]["axes"]
    tensors = meta["tensors"]
    steps = meta["steps"]
    kinds = kinds or _kinds(steps)
    training = meta.get("objective") == "training"
    name_of: dict[str, str] = {}
    for tid, t in tensors.items():
        name_of[tid] = t.get("value") or t.get("source") or tid

    def label(tid: str) -> str:
        return name_of.get(tid, tid)

    gradients: dict[str, list[float]] = {}  # axis -> [count, bytes, seconds]
    summed: set[str] = set()  # weight pieces whose gradient is all-reduced
    lines = []
    for step in steps:
        kind = step["kind"]
        if kind == "weight":
            continue
        if kind == "input":
            t = tensors[step["out"]]
            lines.append(f"  input  {step['name']} {_fmt_shape(t['shape'])}")
        elif kind == "compute":
            outs = [o for o in step["outputs"] if o]
            t = tensors[outs[0]] if outs else {"placement": [], "local_shape": []}
            args = []
            for i in step["inputs"]:
                if isinstance(i, str) and i in tensors:
                    arg = label(i)
                    if kinds.get(i) == "weight":
                        arg += "{" + ",".join(tensors[i]["placement"]) + "}" + ("Σ" if i in summed else "")
                    args.append(arg)
            lines.append(
                f"  {step['op']:<12} {label(outs[0]) if outs else '?'} {_fmt_placement(t['placement'], axes)} "
                f"local {_fmt_shape(t.get('local_shape'))} <- {', '.join(args)}"
            )
        elif kind == "partition":
            if kinds.get(step["src"]) == "activation":
                back = f", backward all-gather {_us(step)}" if training else ""
                lines.append(f"  slice        {label(step['src'])} dim {step['dim']} on {step['axis']}{back}")
        elif kind == "combine":
            lines.append(
                f"=> all-gather  {label(step['out'])} dim {step['dim']} on {step['axis']} "
                f"({_mib(tensors[step['out']])}, {_us(step)})"
            )
        elif kind == "reduce":
            lines.append(
                f"=> all-reduce  {label(step['out'])} on {step['axis']} ({_mib(tensors[step['out']])}, {_us(step)})"
            )
        elif kind == "replicate" and training and (step.get("communication_s") or 0) > 0:
            if kinds.get(step["src"]) == "weight":
                summed.add(step["out"])
                entry = gradients.setdefault(step["axis"], [0, 0.0, 0.0])
                entry[0] += 1
                entry[1] += tensor_bytes(tensors[step["src"]])
                entry[2] += step.get("communication_s") or 0.0
            else:
                lines.append(
                    f"<= all-reduce  activation gradient of {label(step['src'])} on {step['axis']} "
                    f"({_mib(tensors[step['src']])}, {_us(step)})"
                )
    for axis, (count, nbytes, seconds) in gradients.items():
        lines.append(
            f"<= all-reduce  gradients of {int(count)} weights (marked Σ) on {axis} "
            f"({nbytes / 2**20:.2f} MiB, {seconds * 1e6:.1f} µs)"
        )
    return lines


def tensor_bytes(t: dict[str, Any]) -> float:
    """Bytes of one rank's piece of a plan.json tensor (its local shape)."""
    numel = 1
    for d in t.get("local_shape", []):
        numel *= d
    itemsize = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2}.get(t["dtype"], 1)
    return float(numel * itemsize)


def _mib(t: dict[str, Any]) -> str:
    return f"{tensor_bytes(t) / 2**20:.2f} MiB"


def _us(step: dict[str, Any]) -> str:
    return f"{(step.get('communication_s') or 0.0) * 1e6:.1f} µs"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def render(report: dict[str, Any], max_ops: int = 60) -> str:
    """The explain report as text."""
    out: list[str] = []
    out.append(f"plan for {report['model']} on {report['machine']} ({report['objective']})")
    out.append(f"mesh {report['mesh']['label']}")
    for axis in report["mesh"]["axes"]:
        if "size" not in axis:
            continue
        where = (
            f"across {axis['nodes']} nodes, {axis['ranks_per_node']} rank(s) per node"
            if axis["spans_nodes"]
            else "inside a node"
        )
        bandwidth = f", {axis['bandwidth_gbs']:g} GB/s" if axis.get("bandwidth_gbs") else ""
        out.append(f"  axis {axis['name']}: {axis['size']} devices, {where} ({axis['link']}{bandwidth})")
    usage = report.get("parallelism") or {}
    if usage:
        out.append(
            f"devices used: {usage['devices_used']} of {usage.get('machine_devices', usage['devices'])}"
            + (f": {usage['note']}" if usage.get("note") else ", every one doing distinct work")
        )

    cost = report["cost"]
    out.append("")
    out.append(
        f"predicted cost per step: {_ms(cost.get('total_s'))} = compute {_ms(cost.get('compute_s'))} "
        f"+ communication {_ms(cost.get('communication_s'))}"
    )
    for axis, parts in cost.get("communication_by_axis", {}).items():
        out.append(
            f"  axis {axis}: forward {_ms(parts['forward_s'])}, backward {_ms(parts['backward_s'])}, "
            f"weight gradients {_ms(parts['gradient_s'])}"
        )
    overlap = cost.get("overlap")
    if overlap:
        out.append(
            f"  gradient all-reduce {_ms(overlap['gradient_all_reduce_s'])}, of which "
            f"{_ms(overlap['overlappable_s'])} can overlap the backward pass ({_ms(overlap['exposed_s'])} exposed)"
        )
    memory = report["memory"]
    if memory:
        fits = "fits" if memory.get("fits") else "DOES NOT FIT"
        out.append(
            f"memory per device: {_gib(memory.get('total_bytes'))} of {_gib(memory.get('capacity_bytes'))} usable "
            f"({fits}): weights {_gib(memory.get('weight_bytes'))}, gradients + optimizer "
            f"{_gib(memory.get('weight_state_bytes'))}, activations {_gib(memory.get('activation_bytes'))}"
        )
    extraction = report.get("extraction", {})
    if extraction:
        out.append(f"extraction: {extraction.get('method')}; memory: {extraction.get('memory_handling')}")
        choice = extraction.get("plan_choice") or {}
        tie_break = extraction.get("tie_break") or {}
        for note in (choice.get("note"), (choice.get("cheaper_baseline") or {}).get("note"), tie_break.get("note")):
            if note:
                out.append(f"note: {note}")

    if report["baselines"]:
        out.append("")
        out.append("baselines (same model, same cost model)        total       compute     comm        memory    ×plan")
        out.append(
            f"  {'this plan':<44} {_ms(cost.get('total_s')):>11} {_ms(cost.get('compute_s')):>11} "
            f"{_ms(cost.get('communication_s')):>11} {_gib(memory.get('total_bytes')):>9}  1.00"
        )
        for b in report["baselines"]:
            ratio = b.get("ratio")
            flag = "" if b.get("fits", True) else " (does not fit)"
            out.append(
                f"  {b['name'] + ' [' + b['mesh'] + ']':<44} {_ms(b['total_s']):>11} {_ms(b['compute_s']):>11} "
                f"{_ms(b['communication_s']):>11} {_gib(b['memory_bytes']):>9}  "
                f"{'-' if ratio is None else f'{ratio:.2f}'}{flag}"
            )
            used, devices = b.get("devices_used"), b.get("devices")
            share = f" ({used} of {devices} devices do distinct work)" if used and devices and used < devices else ""
            out.append(f"      {b['description']}{share}")

    search = report.get("mesh_search") or {}
    if search.get("tried"):
        out.append("")
        out.append(f"meshes tried (chosen {search.get('chosen')}):")
        width = max(
            [14, *(len(t["mesh"]) for t in search["tried"]), *(len(t["mesh"]) for t in search.get("skipped", []))]
        )
        for t in search["tried"]:
            seconds = t.get("seconds", {})
            cost_text = _ms(t.get("cost_s")) if "cost_s" in t else t.get("status")
            extra = " (baseline only)" if t.get("baseline_only") else ""
            if t.get("egraph_of"):
                extra += f" (the e-graph of {t['egraph_of']}, nothing partitioned)"
            out.append(
                f"  {t['mesh']:<{width}} {cost_text:>12}  {t.get('enodes', 0):>7} e-nodes  "
                f"saturate {seconds.get('saturate', 0):.2f} s, extract {seconds.get('extract', 0):.2f} s{extra}"
            )
        for t in search.get("skipped", []):
            out.append(f"  {t['mesh']:<{width}} skipped: {t['reason']}")

    out.append("")
    out.append("sharding per op (placement per mesh axis, local shape):")
    ops = report["ops"]
    for op in ops[:max_ops]:
        placement = " ".join(f"{a}:{p}" for a, p in op["placement"].items())
        out.append(
            f"  {op['op']:<20} {(op['source'] or op['output'])[:36]:<36} {placement:<16} "
            f"{_fmt_shape(op['local_shape'])}"
        )
    if len(ops) > max_ops:
        out.append(f"  … {len(ops) - max_ops} more (`--json` lists them all)")

    out.append("")
    out.append("PCG (=> forward collective, <= backward collective; {…} a weight's placement):")
    pcg = report["pcg"]
    out.extend(pcg[: max_ops * 2])
    if len(pcg) > max_ops * 2:
        out.append(f"  … {len(pcg) - max_ops * 2} more lines")
    if report["notes"]:
        out.append("")
        out.append("notes:")
        out.extend(f"  {note}" for note in report["notes"])
    return "\n".join(out)
