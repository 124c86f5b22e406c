"""The explain report as text (:func:`render`): the mesh on the machine, the cost split, memory, the baselines,
the meshes tried, the sharding per op, the PCG and the notes."""

from __future__ import annotations

from unity_eq.explain.explanation import Explanation
from unity_eq.explain.pcg import fmt_shape


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def render(report: Explanation, max_ops: int = 60) -> str:
    """The explain report as text."""
    out: list[str] = []
    out.append(f"plan for {report.model} on {report.machine} ({report.objective})")
    out.append(f"mesh {report.mesh_label}")
    for axis in report.axes:
        where = (
            f"across {axis.nodes} nodes, {axis.ranks_per_node} rank(s) per node"
            if axis.spans_nodes
            else "inside a node"
        )
        bandwidth = f", {axis.bandwidth_gbs:g} GB/s" if axis.bandwidth_gbs else ""
        out.append(f"  axis {axis.name}: {axis.size} devices, {where} ({axis.link}{bandwidth})")
    usage = report.parallelism
    if usage:
        out.append(
            f"devices used: {usage.devices_used} of {usage.machine_devices}"
            + (f": {usage.note}" if usage.note else ", every one doing distinct work")
        )

    cost = report.cost
    total, compute, communication = report.total_s, report.compute_s, report.communication_s
    out.append("")
    out.append(f"predicted cost per step: {_ms(total)} = compute {_ms(compute)} + communication {_ms(communication)}")
    for axis_name, parts in ((cost.communication_by_axis if cost else None) or {}).items():
        out.append(
            f"  axis {axis_name}: forward {_ms(parts.forward_s)}, backward {_ms(parts.backward_s)}, "
            f"weight gradients {_ms(parts.gradient_s)}"
        )
    overlap = cost.overlap if cost else None
    if overlap:
        out.append(
            f"  gradient all-reduce {_ms(overlap.gradient_all_reduce_s)}, of which "
            f"{_ms(overlap.overlappable_s)} can overlap the backward pass ({_ms(overlap.exposed_s)} exposed)"
        )
    memory = report.memory
    if memory:
        fits = "fits" if memory.fits else "DOES NOT FIT"
        out.append(
            f"memory per device: {_gib(memory.total_bytes)} of {_gib(memory.capacity_bytes)} usable "
            f"({fits}): weights {_gib(memory.weight_bytes)}, gradients + optimizer "
            f"{_gib(memory.weight_state_bytes)}, activations {_gib(memory.activation_bytes)}"
        )
    extraction = report.extraction
    if extraction:
        out.append(f"extraction: {extraction.method}; memory: {extraction.memory_handling}")
        choice, tie_break = extraction.plan_choice, extraction.tie_break
        cheaper = choice.cheaper_baseline
        for note in (choice.note, cheaper.note if cheaper else None, tie_break.note if tie_break else None):
            if note:
                out.append(f"note: {note}")

    if report.baselines:
        out.append("")
        out.append("baselines (same model, same cost model)        total       compute     comm        memory    ×plan")
        out.append(
            f"  {'this plan':<44} {_ms(total):>11} {_ms(compute):>11} "
            f"{_ms(communication):>11} {_gib(memory.total_bytes if memory else None):>9}  1.00"
        )
        for name, b in report.baselines:
            flag = "" if b.fits else " (does not fit)"
            out.append(
                f"  {name + ' [' + b.mesh + ']':<44} {_ms(b.total_s):>11} {_ms(b.compute_s):>11} "
                f"{_ms(b.communication_s):>11} {_gib(b.memory_bytes):>9}  "
                f"{'-' if b.ratio is None else f'{b.ratio:.2f}'}{flag}"
            )
            used, devices = b.devices_used, b.devices
            share = f" ({used} of {devices} devices do distinct work)" if used and devices and used < devices else ""
            out.append(f"      {b.description}{share}")

    search = report.mesh_search
    if search and search.tried:
        out.append("")
        out.append(f"meshes tried (chosen {search.chosen}):")
        width = max([14, *(len(t.mesh) for t in search.tried), *(len(t.mesh) for t in search.skipped)])
        for t in search.tried:
            cost_text = _ms(t.cost_s) if t.cost_s is not None else t.status
            extra = " (baseline only)" if t.baseline_only else ""
            if t.egraph_of:
                extra += f" (the e-graph of {t.egraph_of}, nothing partitioned)"
            saturate, extract = (t.seconds.saturate, t.seconds.extract) if t.seconds else (0, 0)
            out.append(
                f"  {t.mesh:<{width}} {cost_text:>12}  {t.enodes or 0:>7} e-nodes  "
                f"saturate {saturate:.2f} s, extract {extract:.2f} s{extra}"
            )
        for skipped in search.skipped:
            out.append(f"  {skipped.mesh:<{width}} skipped: {skipped.reason}")

    out.append("")
    out.append("sharding per op (placement per mesh axis, local shape):")
    ops = report.ops
    for op in ops[:max_ops]:
        placement = " ".join(f"{a}:{p}" for a, p in op.placement.items())
        out.append(f"  {op.op:<20} {(op.source or op.output)[:36]:<36} {placement:<16} {fmt_shape(op.local_shape)}")
    if len(ops) > max_ops:
        out.append(f"  … {len(ops) - max_ops} more (`--json` lists them all)")

    out.append("")
    out.append("PCG (=> forward collective, <= backward collective; {…} a weight's placement):")
    pcg = report.pcg
    out.extend(pcg[: max_ops * 2])
    if len(pcg) > max_ops * 2:
        out.append(f"  … {len(pcg) - max_ops * 2} more lines")
    if report.notes:
        out.append("")
        out.append("notes:")
        out.extend(f"  {note}" for note in report.notes)
    return "\n".join(out)
