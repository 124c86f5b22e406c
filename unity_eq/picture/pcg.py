"""The parallel computation graph of a plan as a graphviz ``Digraph``: one node per op, filled by its placement,
activations as edges, edges crossing a collective marked and labelled, ops grouped by their source name's
first part, and past ``max_ops`` the rest noted."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import graphviz
from typing_extensions import assert_never

from unity_eq.collectives import BY_RECORD_KIND
from unity_eq.explain import OpRow, comm_us, named, report_of, tensor_bytes
from unity_eq.picture.mesh import mesh_cluster
from unity_eq.picture.style import BACKWARD, FORWARD, PALETTE, REPLICATED, ms
from unity_eq.planfile import (
    CollectiveStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    InputStepRecord,
    TensorRecord,
    WeightStepRecord,
)


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


def _collective_label(kind: str, step: _Move, tensor: TensorRecord) -> str:
    return f"{kind} on {step.axis}\\n{_mib(tensor_bytes(tensor))}, {comm_us(step)}"


def _group_of(name: str) -> str | None:
    """The block an op belongs to in the drawing: the first part of its source name (``attn`` of
    ``attn.q.matmul``); None for plan-made names (``uq.35``), which stay outside every block."""
    if re.fullmatch(r"uq\.\d+", name) or "." not in name:
        return None
    return name.split(".", 1)[0]


#: the steps that move a tensor along a mesh axis (one record class per collective kind)
_Move = CollectiveStepRecord


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
            case CollectiveStepRecord():
                if step.src in weights:
                    weights.add(step.out)
                elif step.src in sources:
                    sources[step.out] = _moved(sources[step.src], step, tensors, plan.training)
            case _:
                assert_never(step)
    return sources, weights


def _moved(src: _Source, step: _Move, tensors: Mapping[str, TensorRecord], training: bool) -> _Source:
    """Where the result of ``step`` comes from: ``src``, through the collective the step is, if any."""
    kind = BY_RECORD_KIND[step.KIND]
    if kind.communicates:
        return _Source(src.node, (*src.forward, _collective_label(kind.label, step, tensors[step.out])), src.backward)
    if training and kind.backward_op is not None and (step.communication_s or 0.0) > 0:  # a backward collective
        back = f"gradient {kind.backward_op}"
        return _Source(src.node, src.forward, (*src.backward, _collective_label(back, step, tensors[step.src])))
    return src


def _op_label(op: OpRow, step: ComputeStepRecord, tensors: Mapping[str, TensorRecord], weights: set[str]) -> str:
    name = graphviz.escape(str(op.source or op.output))
    lines = [f"{op.op}  {name}"]
    if op.node and op.node != (op.source or op.output):  # the ONNX node's own name, as Netron shows it
        lines.append(graphviz.escape(op.node))
    lines.append(_placement_key(op.placement) or "-")
    if op.local_shape is not None:
        lines.append("local [" + ",".join(str(d) for d in op.local_shape) + "]")
    used = [i for i in step.inputs if isinstance(i, str) and i in weights]
    if used:
        shown = [f"{named(tensors.get(w)) or w} {{{','.join(tensors[w].placement)}}}" for w in used[:2]]
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
        f"{ms(report.total_s)} per step = compute {ms(report.compute_s)} "
        f"+ communication {ms(report.communication_s)}"
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
        mesh_cluster(graph, plan)
    return graph


def _gradient_note(graph: graphviz.Digraph, plan: ExplainRecord, weights: set[str]) -> None:
    """Weight-gradient all-reduces (training) happen once per weight, off the activations' path: one note."""
    if not plan.training:
        return
    per_axis: dict[str, list[float]] = {}
    for step in plan.steps:
        if not isinstance(step, CollectiveStepRecord) or not BY_RECORD_KIND[step.KIND].weight_gradient:
            continue
        if step.src in weights and (step.communication_s or 0) > 0:
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
