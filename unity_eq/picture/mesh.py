"""The mesh on the machine's nodes, drawn twice: as a cluster of the DOT graph (beside the parallel computation
graph) and as an SVG picture of its own (in the HTML page). Each node is a box of its ranks with their mesh
coordinates, filled by their coordinate on the first axis."""

from __future__ import annotations

import html
import itertools

import graphviz

from unity_eq.picture.style import RANK_PALETTE, REPLICATED, rect, svg, text
from unity_eq.planfile import ExplainRecord, NodeRecord, RankRecord


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


def mesh_cluster(graph: graphviz.Digraph, plan: ExplainRecord, per_row: int = 8) -> None:
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
        body.append(rect(gap, y, width - 2 * gap, height, "#fafafa", extra='stroke="#888" rx="8"'))
        title = f"{info.name if info else f'node{node}'}: {len(ranks)} ranks" + (f", {link} inside" if link else "")
        title += f", {network} between nodes" if network and len(by_node) > 1 else ""
        body.append(text(2 * gap, y + 19, title, weight="bold"))
        for i, rank in enumerate(ranks):
            cx = 2 * gap + (i % per_row) * (cell + gap)
            cy = y + 28 + (i // per_row) * (cell * 0.62 + gap)
            fill = _rank_fill(rank)
            coords = " ".join(f"{a}={c}" for a, c in zip(axes, rank.coords, strict=False))
            body.append(rect(cx, cy, cell, cell * 0.62, fill, f"rank {rank.rank}: {coords}", 'stroke="#555" rx="4"'))
            body.append(text(cx + cell / 2, cy + 18, f"rank {rank.rank}", anchor="middle", size=11))
            body.append(text(cx + cell / 2, cy + 36, coords, anchor="middle", size=10))
        y += height + gap
    body.append(text(gap, y + 14, f"ranks filled by their coordinate on axis {axes[0]}; on each axis:"))
    y += 18
    for axis in plan.machine.mesh_axes if plan.machine else ():
        where = f"across {axis.nodes} nodes" if axis.spans_nodes else "inside a node"
        bandwidth = f", {axis.bandwidth_gbs:g} GB/s" if axis.bandwidth_gbs else ""
        body.append(text(3 * gap, y + 14, f"axis {axis.name}: {axis.size} devices {where} ({axis.link}{bandwidth})"))
        y += 18
    return svg(width, y + gap, body, f"mesh {plan.mesh.label} on the machine's nodes")
