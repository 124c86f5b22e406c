"""``unity-eq explain PLAN --format dot|svg|html``: a plan as pictures, drawn from plan.json alone.

Users would rather look than read a plan, so three pictures complement the text report of
:mod:`unity_eq.explain`:

* **the parallel computation graph** (:func:`pcg_graph`): one node per op, filled by its placement (one colour
  per placement, a legend lists them), activations as edges; an edge that crosses a collective is marked (red
  and bold in the forward pass, blue and dashed in the backward pass) and labelled with the collective's kind,
  mesh axis, bytes per rank and predicted time. Ops are grouped by the first part of their source name
  (``attn.q.matmul`` in ``attn``) and past ``max_ops`` the rest is left out with a note, so a large model stays
  readable;
* **the mesh on the machine's nodes** (:func:`mesh_svg`, and a cluster of the DOT graph): each node a box of
  its ranks with their mesh coordinates;
* **the cost split** (:func:`cost_chart_svg`): compute and communication per axis and phase of this plan next
  to the baselines, and memory per device against the usable capacity.

The graph is DOT text made with the ``graphviz`` package; the ``dot`` program (Debian's ``graphviz``) renders
it. Without ``dot``, ``--format svg`` writes the DOT text instead and says so, and the HTML page carries the
DOT text where the graph would be. The other two pictures are SVG written here, so the HTML page is one
self-contained file: inline SVG and CSS, no script, nothing fetched.
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import graphviz
from typing_extensions import assert_never

from unity_eq.errors import OptionError
from unity_eq.explain import Explanation, OpRow, load_plan, reading_plan, render, report_of, tensor_bytes
from unity_eq.files import check_output_file, write_file_atomic
from unity_eq.planfile import (
    CombineStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    InputStepRecord,
    NodeRecord,
    PartitionStepRecord,
    RankRecord,
    ReduceStepRecord,
    ReplicateStepRecord,
    StepRecord,
    TensorRecord,
    WeightStepRecord,
)

__all__ = [
    "FORMATS",
    "Picture",
    "cost_chart_svg",
    "html_page",
    "mesh_svg",
    "pcg_dot",
    "pcg_graph",
    "placement_colours",
    "render_svg",
    "write_picture",
]

FORMATS = ("dot", "svg", "html")
DOT_MISSING = "graphviz's `dot` program was not found on PATH"
INSTALL_DOT = "install it (Debian/Ubuntu: `apt install graphviz`)"

#: Light fills that keep black text readable, told apart by colour-blind readers (ColorBrewer Set3).
PALETTE = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
    "#d9d9d9",
)
REPLICATED = "#f4f4f4"  # an op replicated on every axis: the plain default
FORWARD = "#d62728"  # an edge crossing a forward collective
BACKWARD = "#1f77b4"  # an edge crossing a collective of the backward pass
AXIS_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")  # communication per mesh axis in the chart
COMPUTE = "#4c78a8"
#: Rank fills by coordinate on the mesh's first axis, apart from the placement colours (ColorBrewer Pastel1).
RANK_PALETTE = ("#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc", "#e5d8bd", "#fddaec")


# ----------------------------------------------------------------------------------------------------------
# The parallel computation graph


def _placement_key(placement: Mapping[str, str]) -> str:
    return " ".join(f"{axis}:{p}" for axis, p in placement.items())


def placement_colours(ops: Sequence[OpRow]) -> dict[str, str]:
    """One fill per placement seen, in order of first appearance; replicated-everywhere is a pale grey.

    Colours are given in plan order so that the same plan always gets the same picture."""
    colours: dict[str, str] = {}
    for op in ops:
        key = _placement_key(op.placement)
        if key in colours:
            continue
        if all(p == "R" for p in op.placement.values()):
            colours[key] = REPLICATED
        else:
            shaded = sum(1 for c in colours.values() if c != REPLICATED)
            colours[key] = PALETTE[shaded % len(PALETTE)]
    return colours


@dataclass(frozen=True)
class _Source:
    """Where an activation comes from: the node producing it and the collectives it crossed on the way."""

    node: str
    forward: tuple[str, ...] = ()
    backward: tuple[str, ...] = ()


def _mib(nbytes: float) -> str:
    if nbytes < 2**10:
        return f"{nbytes:.0f} B"
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**16 else f"{nbytes / 2**10:.1f} KiB"


def _us(step: StepRecord) -> str:
    return f"{(step.communication_s or 0.0) * 1e6:.1f} µs"


def _collective_label(kind: str, step: _Move, tensor: TensorRecord) -> str:
    return f"{kind} on {step.axis}\\n{_mib(tensor_bytes(tensor))}, {_us(step)}"


def _tensor_name(tensors: Mapping[str, TensorRecord], tid: str) -> str:
    t = tensors.get(tid)
    return str((t.value or t.source if t else None) or tid)


def _group_of(name: str) -> str | None:
    """The block an op belongs to in the drawing: the first part of its source name (``attn`` of
    ``attn.q.matmul``); None for plan-made names (``uq.35``), which stay outside every block."""
    if re.fullmatch(r"uq\.\d+", name) or "." not in name:
        return None
    return name.split(".", 1)[0]


#: the steps that move a tensor along a mesh axis
_Move = PartitionStepRecord | CombineStepRecord | ReduceStepRecord | ReplicateStepRecord


def _sources(plan: ExplainRecord) -> tuple[dict[str, _Source], set[str]]:
    """For every activation of the plan, the node that makes it and the collectives between; and the weights
    (and their pieces), which are drawn inside the op that uses them rather than as nodes."""
    tensors = plan.tensors
    sources: dict[str, _Source] = {}
    weights: set[str] = set()
    for index, step in enumerate(plan.steps):
        match step:
            case WeightStepRecord():
                weights.add(step.out)
            case InputStepRecord():
                sources[step.out] = _Source(f"input {step.name}")
            case ComputeStepRecord():
                for out in step.outputs:
                    if out:
                        sources[out] = _Source(f"op{index}")
            case PartitionStepRecord() | CombineStepRecord() | ReduceStepRecord() | ReplicateStepRecord():
                if step.src in weights:
                    weights.add(step.out)
                elif step.src in sources:
                    sources[step.out] = _moved(sources[step.src], step, tensors, plan.training)
            case _:
                assert_never(step)
    return sources, weights


def _moved(src: _Source, step: _Move, tensors: Mapping[str, TensorRecord], training: bool) -> _Source:
    """Where the result of ``step`` comes from: ``src``, through the collective the step is, if any."""
    if isinstance(step, CombineStepRecord | ReduceStepRecord):
        kind = "all-gather" if isinstance(step, CombineStepRecord) else "all-reduce"
        return _Source(src.node, (*src.forward, _collective_label(kind, step, tensors[step.out])), src.backward)
    if training and (step.communication_s or 0.0) > 0:  # a gradient collective of the backward pass
        back = "gradient all-gather" if isinstance(step, PartitionStepRecord) else "gradient all-reduce"
        return _Source(src.node, src.forward, (*src.backward, _collective_label(back, step, tensors[step.src])))
    return src


def _op_label(op: OpRow, step: ComputeStepRecord, tensors: Mapping[str, TensorRecord], weights: set[str]) -> str:
    name = graphviz.escape(str(op.source or op.output))
    lines = [f"{op.op}  {name}", _placement_key(op.placement) or "-"]
    if op.local_shape is not None:
        lines.append("local [" + ",".join(str(d) for d in op.local_shape) + "]")
    used = [i for i in step.inputs if isinstance(i, str) and i in weights]
    if used:
        shown = [f"{_tensor_name(tensors, w)} {{{','.join(tensors[w].placement)}}}" for w in used[:2]]
        more = f" +{len(used) - 2}" if len(used) > 2 else ""
        lines.append(graphviz.escape(", ".join(shown)) + more)
    return "\\n".join(lines)


def _edge(graph: graphviz.Digraph, src: _Source, dst: str) -> None:
    """An activation edge, marked by the collectives it crosses: the reader sees where data moves."""
    if src.forward:  # the backward ones it also crosses are listed after
        label = " \\n".join([*src.forward, *(f"⇐ {b}" for b in src.backward)])
        graph.edge(src.node, dst, label=label, color=FORWARD, fontcolor=FORWARD, penwidth="2.5")
    elif src.backward:
        graph.edge(
            src.node,
            dst,
            label=" \\n".join(f"⇐ {b}" for b in src.backward),
            color=BACKWARD,
            fontcolor=BACKWARD,
            style="dashed",
            dir="both",
            arrowtail="odot",
        )
    else:
        graph.edge(src.node, dst, color="#555555")


def _legend(graph: graphviz.Digraph, colours: dict[str, str], counts: dict[str, int]) -> None:
    rows = "".join(
        f'<TR><TD BGCOLOR="{colour}" WIDTH="24"> </TD><TD ALIGN="LEFT">{html.escape(key or "-")}'
        f" ({counts.get(key, 0)} op{'' if counts.get(key, 0) == 1 else 's'})</TD></TR>"
        for key, colour in colours.items()
    )
    edges = (
        f'<TR><TD><FONT COLOR="{FORWARD}">━━</FONT></TD><TD ALIGN="LEFT">forward collective</TD></TR>'
        f'<TR><TD><FONT COLOR="{BACKWARD}">╍╍</FONT></TD><TD ALIGN="LEFT">backward collective</TD></TR>'
    )
    label = (
        '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="4">'
        f'<TR><TD COLSPAN="2"><B>placement (per mesh axis)</B></TD></TR>{rows}{edges}</TABLE>>'
    )
    graph.node("legend", label=label, shape="plaintext", fillcolor="white")


def _ranks_by_node(plan: ExplainRecord) -> dict[int, list[RankRecord]]:
    by_node: dict[int, list[RankRecord]] = {}
    for rank in plan.mesh.ranks:
        by_node.setdefault(rank.node, []).append(rank)
    return dict(sorted(by_node.items()))


def _rank_fill(rank: RankRecord) -> str:
    return RANK_PALETTE[rank.coords[0] % len(RANK_PALETTE)] if rank.coords else REPLICATED


def _node_info(plan: ExplainRecord, node: int) -> NodeRecord | None:
    """The machine's node ``node`` as plan.json describes it (None when it does not)."""
    node_list = plan.machine.node_list if plan.machine else ()
    return node_list[node] if node < len(node_list) else None


def _mesh_cluster(graph: graphviz.Digraph, plan: ExplainRecord, per_row: int = 8) -> None:
    """The mesh laid on the machine's nodes: one table per node, its ranks in order with their mesh coordinates
    (tables, not nodes, so that graphviz keeps the ranks in order), stacked with invisible edges."""
    axes = plan.mesh.axes
    label = (
        f"mesh {plan.mesh.label} on {(plan.machine.name if plan.machine else None) or 'the machine'} "
        f"(ranks filled by their coordinate on axis {axes[0]})"
    )
    with graph.subgraph(name="cluster_machine") as machine:
        machine.attr(label=label, style="rounded", color="#888888")
        names = []
        for node, ranks in _ranks_by_node(plan).items():
            info = _node_info(plan, node)
            link = info.link.name if info else ""
            title = html.escape((info.name if info else f"node{node}") + (f" ({link})" if link else ""))
            rows = []
            for first in range(0, len(ranks), per_row):
                cells = "".join(
                    f'<TD BGCOLOR="{_rank_fill(r)}">rank {r.rank}<BR/>'
                    + html.escape(" ".join(f"{a}={c}" for a, c in zip(axes, r.coords, strict=False)))
                    + "</TD>"
                    for r in ranks[first : first + per_row]
                )
                rows.append(f"<TR>{cells}</TR>")
            span = min(len(ranks), per_row)
            table = (
                '<<TABLE BORDER="1" CELLBORDER="1" CELLSPACING="4" CELLPADDING="5" STYLE="ROUNDED">'
                f'<TR><TD COLSPAN="{span}" BORDER="0"><B>{title}</B></TD></TR>{"".join(rows)}</TABLE>>'
            )
            names.append(f"node {node}")
            machine.node(names[-1], label=table, shape="plaintext", fillcolor="white", fontsize="10")
        for upper, lower in itertools.pairwise(names):
            machine.edge(upper, lower, style="invis")


def pcg_graph(plan: ExplainRecord, *, max_ops: int = 150, mesh: bool = True) -> graphviz.Digraph:
    """The plan's parallel computation graph as a graphviz ``Digraph`` (see the module docstring).

    ``mesh`` adds the mesh-on-nodes cluster beside it (the DOT and SVG outputs are one picture; the HTML page
    draws the mesh on its own)."""
    report = report_of(plan)
    tensors = plan.tensors
    computes = {i: s for i, s in enumerate(plan.steps) if isinstance(s, ComputeStepRecord)}
    sources, weights = _sources(plan)
    colours = placement_colours(report.ops)
    graph = graphviz.Digraph("plan", comment=f"unity-eq plan of {report.model}")
    graph.attr(rankdir="TB", fontname="Helvetica", fontsize="12", labelloc="t", newrank="true")
    graph.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10", fillcolor="white")
    graph.attr("edge", fontname="Helvetica", fontsize="9", arrowsize="0.7")
    graph.attr(
        label=f"{report.model} on {report.machine} ({report.objective}), mesh {report.mesh_label}: "
        f"{_ms(report.total_s)} per step = compute {_ms(report.compute_s)} "
        f"+ communication {_ms(report.communication_s)}"
    )

    for step in plan.steps:
        if isinstance(step, InputStepRecord):
            shape = "[" + ",".join(map(str, tensors[step.out].shape)) + "]"
            graph.node(f"input {step.name}", label=f"input {graphviz.escape(step.name)}\\n{shape}", shape="oval")

    drawn = report.ops[:max_ops]
    groups: dict[str | None, list[OpRow]] = {}
    for op in drawn:
        groups.setdefault(_group_of(str(op.source or op.output)), []).append(op)
    counts: dict[str, int] = {}
    for op in report.ops:
        counts[_placement_key(op.placement)] = counts.get(_placement_key(op.placement), 0) + 1
    for group, ops in groups.items():
        boxed = group is not None and len(ops) > 1
        target = graph.subgraph(name=f"cluster_{group}") if boxed else _Same(graph)
        with target as sub:
            if boxed:
                sub.attr(label=group, style="rounded,dashed", color="#aaaaaa")
            for op in ops:
                key = _placement_key(op.placement)
                label = _op_label(op, computes[op.step], tensors, weights)
                sub.node(f"op{op.step}", label=label, fillcolor=colours[key])
    shown = {f"op{op.step}" for op in drawn} | {s.node for s in sources.values() if s.node.startswith("input ")}
    for op in drawn:
        for tid in computes[op.step].inputs:
            if isinstance(tid, str) and tid in sources and sources[tid].node in shown:
                _edge(graph, sources[tid], f"op{op.step}")
    for name, out in plan.model.outputs.items():
        src = sources.get(out.tensor)
        graph.node(f"output {name}", label=f"output {graphviz.escape(name)}", shape="oval")
        if src is not None and src.node in shown:
            _edge(graph, src, f"output {name}")
    hidden = len(report.ops) - len(drawn)
    if hidden:
        graph.node(
            "more",
            label=f"… {hidden} more ops not drawn\\n(`--max-ops {len(report.ops)}` draws them all)",
            shape="note",
            fillcolor="#fff8dc",
        )
    _gradient_note(graph, plan, weights)
    _legend(graph, colours, counts)
    if mesh:
        _mesh_cluster(graph, plan)
    return graph


def _gradient_note(graph: graphviz.Digraph, plan: ExplainRecord, weights: set[str]) -> None:
    """Weight-gradient all-reduces (training) happen once per weight, off the activations' path: one note."""
    if not plan.training:
        return
    per_axis: dict[str, list[float]] = {}
    for step in plan.steps:
        if isinstance(step, ReplicateStepRecord) and step.src in weights and (step.communication_s or 0) > 0:
            entry = per_axis.setdefault(step.axis, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += tensor_bytes(plan.tensors[step.src])
            entry[2] += step.communication_s or 0.0
    if per_axis:
        lines = [
            f"⇐ gradient all-reduce on {axis}: {int(n)} weights, {_mib(b)}, {s * 1e6:.1f} µs"
            for axis, (n, b, s) in per_axis.items()
        ]
        graph.node(
            "gradients", label="\\n".join(lines), shape="note", fillcolor="#e8f1fa", color=BACKWARD, fontcolor=BACKWARD
        )


class _Same:
    """A context manager giving back the graph itself: ops outside any block go straight into it."""

    def __init__(self, graph: graphviz.Digraph) -> None:
        self.graph = graph

    def __enter__(self) -> graphviz.Digraph:
        return self.graph

    def __exit__(self, *exc: object) -> None:
        return None


def pcg_dot(plan: ExplainRecord, *, max_ops: int = 150, mesh: bool = True) -> str:
    """The DOT text of :func:`pcg_graph`."""
    return str(pcg_graph(plan, max_ops=max_ops, mesh=mesh).source)


def render_svg(graph: graphviz.Digraph) -> str | None:
    """The graph drawn by graphviz's ``dot`` as SVG text; None when ``dot`` is not installed."""
    try:
        svg = graph.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        return None
    return str(svg)


# ----------------------------------------------------------------------------------------------------------
# Mesh and cost pictures (SVG written here)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _gib(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.1f} MiB"


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12, weight: str = "normal") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" font-weight="{weight}">'
        f"{html.escape(text)}</text>"
    )


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> str:
    tip = f"<title>{html.escape(title)}</title>" if title else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}" {extra}>{tip}</rect>'


def _svg(width: float, height: float, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" role="img">'
        f"<title>{html.escape(title)}</title>" + "".join(body) + "</svg>"
    )


def mesh_svg(plan: ExplainRecord) -> str:
    """The mesh on the machine's nodes: a box per node holding its ranks, each with its mesh coordinates and
    filled by its coordinate on the first axis (ranks of one colour share that coordinate)."""
    axes = plan.mesh.axes
    by_node = _ranks_by_node(plan)
    per_row, cell, gap = 8, 78, 8
    body: list[str] = []
    y = 10.0
    width = 2 * gap + per_row * (cell + gap) + gap
    for node, ranks in by_node.items():
        info = _node_info(plan, node)
        link = info.link.name if info else ""
        network = info.network.name if info and info.network else ""
        rows = (len(ranks) + per_row - 1) // per_row
        height = 30 + rows * (cell * 0.62 + gap)
        body.append(_rect(gap, y, width - 2 * gap, height, "#fafafa", extra='stroke="#888" rx="8"'))
        title = f"{info.name if info else f'node{node}'}: {len(ranks)} ranks" + (f", {link} inside" if link else "")
        title += f", {network} between nodes" if network and len(by_node) > 1 else ""
        body.append(_text(2 * gap, y + 19, title, weight="bold"))
        for i, rank in enumerate(ranks):
            cx = 2 * gap + (i % per_row) * (cell + gap)
            cy = y + 28 + (i // per_row) * (cell * 0.62 + gap)
            fill = _rank_fill(rank)
            coords = " ".join(f"{a}={c}" for a, c in zip(axes, rank.coords, strict=False))
            body.append(_rect(cx, cy, cell, cell * 0.62, fill, f"rank {rank.rank}: {coords}", 'stroke="#555" rx="4"'))
            body.append(_text(cx + cell / 2, cy + 18, f"rank {rank.rank}", anchor="middle", size=11))
            body.append(_text(cx + cell / 2, cy + 36, coords, anchor="middle", size=10))
        y += height + gap
    body.append(_text(gap, y + 14, f"ranks filled by their coordinate on axis {axes[0]}; on each axis:"))
    y += 18
    for axis in plan.machine.mesh_axes if plan.machine else ():
        where = f"across {axis.nodes} nodes" if axis.spans_nodes else "inside a node"
        bandwidth = f", {axis.bandwidth_gbs:g} GB/s" if axis.bandwidth_gbs else ""
        body.append(_text(3 * gap, y + 14, f"axis {axis.name}: {axis.size} devices {where} ({axis.link}{bandwidth})"))
        y += 18
    return _svg(width, y + gap, body, f"mesh {plan.mesh.label} on the machine's nodes")


def _time_segments(report: Explanation) -> list[tuple[str, float, str]]:
    """This plan's time per step cut into compute and communication per axis and phase: (name, s, colour)."""
    cost = report.cost
    segments = [("compute", float((cost.compute_s if cost else None) or 0.0), COMPUTE)]
    by_axis = (cost.communication_by_axis if cost else None) or {}
    for i, (axis, parts) in enumerate(by_axis.items()):
        colour = AXIS_COLOURS[i % len(AXIS_COLOURS)]
        phases = (("forward", parts.forward_s, "1"), ("backward", parts.backward_s, "0.65"))
        for phase, value, opacity in (*phases, ("gradient", parts.gradient_s, "0.35")):
            seconds = float(value or 0.0)
            if seconds > 0:
                segments.append((f"{phase} communication on {axis}", seconds, f"{colour}|{opacity}"))
    if not by_axis and cost and cost.communication_s:
        segments.append(("communication", float(cost.communication_s), f"{AXIS_COLOURS[0]}|1"))
    return segments


def _fill(colour: str) -> str:
    base, _, opacity = colour.partition("|")
    return f'{base}" fill-opacity="{opacity or 1}'


def cost_chart_svg(report: Explanation) -> str:
    """The cost split as bar charts: time per step of this plan (compute, then communication per axis and
    phase) and of each baseline (compute, communication), on one scale; memory per device against capacity."""
    left, bar_w, bar_h, gap = 280.0, 520.0, 22.0, 10.0
    width = left + bar_w + 210
    body: list[str] = [_text(10, 20, "predicted time per step", size=14, weight="bold")]
    rows = [(f"this plan [{report.mesh_label}]", _time_segments(report), float(report.total_s or 0.0), "")]
    for name, b in report.baselines:
        parts = [
            ("compute", float(b.compute_s or 0.0), COMPUTE),
            ("communication", float(b.communication_s or 0.0), "#999999|1"),
        ]
        ratio = f" = ×{b.ratio:.2f} this plan" if b.ratio is not None else ""
        rows.append((f"{name} [{b.mesh}]", parts, float(b.total_s or 0.0), ratio))
    scale = max([row[2] for row in rows] + [1e-12])
    y = 34.0
    for name, segments, total, ratio in rows:
        body.append(
            _text(left - 8, y + bar_h * 0.7, name if len(name) <= 44 else name[:43] + "…", anchor="end", size=11)
        )
        x = left
        for part, seconds, colour in segments:
            w = bar_w * seconds / scale
            body.append(_rect(x, y, w, bar_h, _fill(colour), f"{part}: {_ms(seconds)}"))
            x += w
        body.append(_text(x + 6, y + bar_h * 0.7, _ms(total) + ratio, size=11))
        y += bar_h + gap
    y = _chart_key(body, [*_time_segments(report), ("baseline communication", 0.0, "#999999|1")], y, left)

    memory = report.memory
    if memory is not None:
        y += 14
        body.append(_text(10, y, "memory per device", size=14, weight="bold"))
        y += 12
        capacity = float(memory.capacity_bytes or 0.0)
        total = float(memory.total_bytes)
        parts = [
            ("weights", float(memory.weight_bytes or 0.0), "#59a14f|1"),
            ("gradients + optimizer", float(memory.weight_state_bytes or 0.0), "#edc948|1"),
            ("activations", float(memory.activation_bytes or 0.0), "#b07aa1|1"),
        ]
        fits = "fits" if memory.fits else "DOES NOT FIT"
        if capacity:
            share = total / capacity
            body.append(_text(left - 8, y + bar_h * 0.7, "of usable capacity", anchor="end", size=11))
            body.append(_rect(left, y, bar_w, bar_h, "#eeeeee", f"usable capacity {_gib(capacity)}", 'stroke="#999"'))
            body.append(
                _rect(left, y, max(bar_w * min(share, 1.0), 2), bar_h, "#59a14f" if share <= 1 else "#d62728", fits)
            )
            body.append(_text(left + bar_w + 6, y + bar_h * 0.7, f"{share * 100:.2f}% ({fits})", size=11))
            y += bar_h + gap
        body.append(_text(left - 8, y + bar_h * 0.7, f"split of {_gib(total)}", anchor="end", size=11))
        x = left
        for part, nbytes, colour in parts:
            w = bar_w * nbytes / max(total, 1.0)
            body.append(_rect(x, y, w, bar_h, _fill(colour), f"{part}: {_gib(nbytes)}"))
            x += w
        body.append(_text(left + bar_w + 6, y + bar_h * 0.7, f"of {_gib(capacity)}" if capacity else "", size=11))
        y += bar_h + gap
        y = _chart_key(body, parts, y, left)
    return _svg(width, y + 6, body, "predicted cost: time per step and memory per device")


def _chart_key(body: list[str], parts: list[tuple[str, float, str]], y: float, left: float) -> float:
    """A key of the bars' colours, wrapped to the chart's width; returns the y below it."""
    x = left
    for name, _, colour in parts:
        w = 18 + 7 * len(name)
        if x + w > left + 600:
            x, y = left, y + 18
        body.append(_rect(x, y, 12, 12, _fill(colour)))
        body.append(_text(x + 16, y + 10, name, size=11))
        x += w
    return y + 24


# ----------------------------------------------------------------------------------------------------------
# The HTML page and the command

_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.sub { color: #555; margin-top: 0; } table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; } td:first-child, th:first-child
{ text-align: left; } .figure { overflow-x: auto; border: 1px solid #eee; padding: 8px; }
.figure svg { max-width: 100%; height: auto; } pre { font-size: 12px; background: #f7f7f7; padding: 8px;
overflow-x: auto; } .warn { color: #a33; } .note { color: #555; font-size: 13px; }
"""


def _baseline_table(report: Explanation) -> str:
    memory = report.memory
    head = "<tr><th>plan</th><th>total</th><th>compute</th><th>communication</th><th>memory</th><th>×plan</th></tr>"
    rows = [
        f"<tr><td><b>this plan</b> [{html.escape(report.mesh_label)}]</td><td>{_ms(report.total_s)}</td>"
        f"<td>{_ms(report.compute_s)}</td><td>{_ms(report.communication_s)}</td>"
        f"<td>{_gib(memory.total_bytes if memory else None)}</td><td>1.00</td></tr>"
    ]
    for name, b in report.baselines:
        ratio = "-" if b.ratio is None else f"{b.ratio:.2f}"
        flag = "" if b.fits else " (does not fit)"
        rows.append(
            f'<tr><td title="{html.escape(b.description)}">{html.escape(name)} '
            f"[{html.escape(b.mesh)}]</td><td>{_ms(b.total_s)}</td><td>{_ms(b.compute_s)}</td>"
            f"<td>{_ms(b.communication_s)}</td><td>{_gib(b.memory_bytes)}</td><td>{ratio}{flag}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _strip_xml_prolog(svg: str) -> str:
    """Graphviz's SVG starts with an XML declaration and a DOCTYPE, which do not belong inside HTML."""
    return svg[svg.index("<svg") :] if "<svg" in svg else svg


def html_page(plan: ExplainRecord, *, max_ops: int = 150) -> tuple[str, bool]:
    """One self-contained HTML page of the plan (the three pictures and the key text) and whether ``dot`` drew
    the graph (without it, the page holds the graph's DOT text and says how to draw it)."""
    report = report_of(plan)
    graph = pcg_graph(plan, max_ops=max_ops, mesh=False)
    svg = render_svg(graph)
    if svg is None:
        pcg = (
            f'<p class="warn">{html.escape(DOT_MISSING)}: {html.escape(INSTALL_DOT)} to see the graph; '
            "its DOT text follows.</p><pre>" + html.escape(str(graph.source)) + "</pre>"
        )
    else:
        pcg = _strip_xml_prolog(svg)
    axes = "".join(
        f"<li>axis <b>{html.escape(a.name)}</b>: {a.size} devices, "
        + (f"across {a.nodes} nodes" if a.spans_nodes else "inside a node")
        + f" ({html.escape(str(a.link))}"
        + (f", {a.bandwidth_gbs:g} GB/s" if a.bandwidth_gbs else "")
        + ")</li>"
        for a in report.axes
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    title = f"unity-eq plan: {report.model} on {report.machine}"
    body = f"""<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(str(report.objective))} · mesh <b>{html.escape(report.mesh_label)}</b> ·
predicted {_ms(report.total_s)} per step = compute {_ms(report.compute_s)} + communication
{_ms(report.communication_s)}</p>
<ul>{axes}</ul>
<h2>Cost</h2>
<div class="figure">{cost_chart_svg(report)}</div>
<h2>Baselines (same model, same cost model)</h2>
{_baseline_table(report)}
<h2>Mesh on the machine</h2>
<div class="figure">{mesh_svg(plan)}</div>
<h2>Parallel computation graph</h2>
<p class="note">One box per op, filled by its placement on each mesh axis (S(d): split along dim d, R: whole,
P: partial sums). Red edges cross a forward collective, blue dashed ones a collective of the backward pass;
labels give the kind, mesh axis, bytes per rank and predicted time.</p>
<div class="figure">{pcg}</div>
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
<h2>Full report</h2>
<details><summary>text of <code>unity-eq explain</code></summary><pre>{html.escape(render(report))}</pre></details>
"""
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )
    return page, svg is not None


@dataclass(frozen=True)
class Picture:
    """What :func:`write_picture` wrote, and a note for the user when it could not draw as asked."""

    path: Path
    note: str | None = None


def default_output(plan_dir: Path, fmt: str) -> Path:
    """``plan.<fmt>`` in the plan folder (beside plan.json when a plan.json is given)."""
    folder = plan_dir if plan_dir.is_dir() else plan_dir.parent
    return folder / f"plan.{fmt}"


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise OptionError(f"`--format`: expected text, json, {', '.join(FORMATS)}; got {fmt!r}.")


def write_picture(plan_dir: Path, fmt: str, output: Path | None = None, *, max_ops: int = 150) -> Picture:
    """Draw the plan in ``plan_dir`` as ``fmt`` (dot, svg or html) into ``output`` (default: ``plan.<fmt>`` in
    the plan folder), atomically. The plan is read and the output checked before anything is drawn (a missing
    plan is named as such, not as an unwritable default output). Without ``dot``, ``svg`` writes the DOT text
    to ``<output>.dot`` instead and the returned note says so."""
    check_format(fmt)
    if max_ops < 1:
        raise OptionError(f"`--max-ops`: expected 1 or more, got {max_ops}.")
    plan = load_plan(plan_dir)
    target = output if output is not None else default_output(plan_dir, fmt)
    check_output_file(target, "`-o`")
    if fmt == "html":
        with reading_plan(plan_dir):
            page, drawn = html_page(plan, max_ops=max_ops)
        write_file_atomic(target, page, "`-o`")
        note = None if drawn else f"{DOT_MISSING}: the page holds the graph's DOT text; {INSTALL_DOT} to draw it."
        return Picture(target, note)
    with reading_plan(plan_dir):
        graph = pcg_graph(plan, max_ops=max_ops)
    if fmt == "dot":
        write_file_atomic(target, str(graph.source), "`-o`")
        return Picture(target)
    svg = render_svg(graph)
    if svg is not None:
        write_file_atomic(target, svg, "`-o`")
        return Picture(target)
    fallback = target.with_suffix(".dot")
    write_file_atomic(fallback, str(graph.source), "`-o`")
    return Picture(
        fallback,
        f"{DOT_MISSING}, so no SVG: wrote the DOT text to {fallback} instead; {INSTALL_DOT} "
        f"or run `dot -Tsvg {fallback} -o {target}` where it is.",
    )
