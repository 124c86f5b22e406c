"""The e-graph as the differentiable extractor sees it: an acyclic sub-e-graph laid out as index arrays.

A relaxed choice (a softmax per e-class) cannot see that a cycle of classes computes nothing: with
``x = Partition(Combine(x))`` the relaxation would "make" ``x`` for the price of two collectives. So before any
gradient step the e-graph is cut to a DAG, as greedy cuts it (greedy skips a node whose cost set contains its
own class): classes are placed bottom-up, a node is kept only when all its children were placed before its
class, and when no class has every node ready the one that loses the fewest nodes goes next (a greedy
feedback-arc-set order). The start choice (greedy's plan) is kept whole: a class it needs is placed only once
its start node is ready, so the greedy plan is always a point of the relaxed space and every rounded choice
is acyclic by construction.

The e-graph's structure, whatever the prices, is laid out once as integer lists (:class:`Layout`: classes
and nodes numbered in the order of their ids, each node's distinct child classes, each class's users, the
multi-output groups); the Extractor keeps it, so every later search of the e-graph (another restriction,
another memory penalty) walks integers instead of e-class ids and e-node objects.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from unity_eq.egraph import EGraphData, ENode
from unity_eq.errors import InternalError
from unity_eq.extract.greedy import MultiOutputMembers, chosen_closure, multi_output_members
from unity_eq.extract.pricing import INF

__all__ = ["Layout", "Relaxed", "layout_of", "relax"]


@dataclass(frozen=True)
class Relaxed:
    """The kept sub-e-graph: classes in topological order (children first), nodes grouped by class.

    ``node_class[i]`` is the class index of node i (non-decreasing); ``edge_node``/``edge_child`` list every
    (node, distinct child class) pair whose child is not a root; ``level[c]`` is the longest path from a root to
    class c, in edges, and ``depth`` bounds it; ``edges_by_level`` groups the edges by their parent's level,
    lowest first (what a level-by-level walk from the roots follows).
    """

    classes: list[str]
    nodes: list[ENode]
    node_class: np.ndarray
    cost: np.ndarray
    memory: np.ndarray
    roots: np.ndarray
    edge_node: np.ndarray
    edge_child: np.ndarray
    depth: int
    start: np.ndarray  # per class, the index of the start choice's node (-1 when the start does not need it)
    level: np.ndarray
    edges_by_level: list[np.ndarray]
    finite: int  # finite-cost nodes reachable from the roots before the cut (the cut dropped finite − len(nodes))


@dataclass(frozen=True)
class Layout:
    """An e-graph's structure as integer lists, whatever the prices: built once per e-graph
    (:func:`layout_of`) and shared by every relaxation of it, so that a relaxation's passes walk integers,
    not e-class ids and e-node objects. Classes are numbered in the order of their ids (so that a heap of
    ``(count, class)`` breaks ties as one of ``(count, id)`` does), nodes in the order of theirs."""

    class_ids: list[str]
    class_index: dict[str, int]
    nodes: list[ENode]
    node_ids: list[str]
    node_class: list[int]
    kids: list[tuple[int, ...]]  # per node, its distinct child classes
    class_nodes: list[list[int]]  # per class, its nodes
    users: list[list[int]]  # per class, the nodes that have it as a child, in order
    kid_start: np.ndarray  # kids as one array: node i's are kid_flat[kid_start[i] : kid_start[i + 1]]
    kid_flat: np.ndarray
    multi_output: MultiOutputMembers  # greedy.multi_output_members: what the chooser's adoption tries


def layout_of(data: EGraphData) -> Layout:
    """The :class:`Layout` of ``data``: one pass over its e-nodes."""
    class_ids = sorted(data.classes)
    class_index = {c: i for i, c in enumerate(class_ids)}
    nodes = sorted((n for cls in data.classes.values() for n in cls.nodes), key=lambda n: n.id)
    node_class = [class_index[n.eclass] for n in nodes]
    kids = [tuple({class_index[c] for c in n.children}) for n in nodes]
    class_nodes: list[list[int]] = [[] for _ in class_ids]
    users: list[list[int]] = [[] for _ in class_ids]
    for i, c in enumerate(node_class):
        class_nodes[c].append(i)
        for child in kids[i]:
            users[child].append(i)
    lengths = np.fromiter((len(k) for k in kids), dtype=np.int64, count=len(kids))
    kid_start = np.zeros(len(kids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=kid_start[1:])
    kid_flat = np.fromiter((c for k in kids for c in k), dtype=np.int64, count=int(kid_start[-1]))
    ids = [n.id for n in nodes]
    members = multi_output_members(data)
    return Layout(
        class_ids, class_index, nodes, ids, node_class, kids, class_nodes, users, kid_start, kid_flat, members
    )


def relax(
    data: EGraphData,
    totals: Mapping[str, float],
    roots: list[str],
    start: dict[str, ENode],
    memory: Mapping[str, float] | None = None,
    layout: Layout | None = None,
    needed: set[str] | None = None,
) -> Relaxed:
    """Cut the e-graph under ``totals`` (INF bans a node) to the DAG the relaxation searches (module docstring).

    This runs once per differentiable extraction, whose time budget is greedy's, so it must stay a small
    fraction of greedy's own pass over the e-graph: ``layout`` (:func:`layout_of` of ``data``, shared between
    runs on one e-graph) turns every pass into one over integers; ``needed``: the classes the start plan needs
    (its chosen closure), when the caller has them."""
    lay = layout if layout is not None else layout_of(data)
    prices = np.fromiter((totals[i] for i in lay.node_ids), dtype=np.float64, count=len(lay.node_ids))
    finite = (prices < INF).tolist()
    root_ids = [lay.class_index[r] for r in roots]
    nodes = _finite(lay, finite, root_ids)
    if needed is None:
        needed = chosen_closure(start, roots) or set()
    start_nodes = {lay.class_index[c]: _node_position(lay, start[c]) for c in needed}
    kept, order = _order(lay, nodes, start_nodes)
    reach = _reachable(lay, kept, root_ids)
    order = [c for c in order if c in reach]
    new_of = np.full(len(lay.class_ids), -1, dtype=np.int64)
    new_of[order] = np.arange(len(order))
    positions = [i for c in order for i in kept[c]]
    picked = np.array(positions, dtype=np.int64)
    node_list = [lay.nodes[i] for i in positions]
    node_class = new_of[np.array(lay.node_class, dtype=np.int64)[picked]] if positions else np.zeros(0, np.int64)
    cost = prices[picked]
    mem = (
        np.fromiter((memory.get(n.id, 0.0) for n in node_list), dtype=np.float64, count=len(node_list))
        if memory
        else np.zeros(len(node_list))
    )
    relaxed_of = np.full(len(lay.nodes), -1, dtype=np.int64)
    relaxed_of[picked] = np.arange(len(picked))
    start_index = np.full(len(order), -1, dtype=np.int64)
    if start_nodes:
        start_class = new_of[np.fromiter(start_nodes.keys(), dtype=np.int64, count=len(start_nodes))]
        start_node = relaxed_of[np.fromiter(start_nodes.values(), dtype=np.int64, count=len(start_nodes))]
        start_index[start_class[start_class >= 0]] = start_node[start_class >= 0]
    root_index = np.array(sorted(set(new_of[root_ids].tolist())), dtype=np.int64)  # np.unique imports numpy.ma
    if len(root_index) and root_index[0] < 0:
        raise InternalError("a root of the relaxed e-graph was cut: the start plan should have kept it")
    edge_node, edge_child, level = _edges(lay, picked, new_of, node_class, root_index, len(order))
    depth = int(level.max(initial=0)) + 1
    by_level = np.argsort(level[node_class[edge_node]], kind="stable")
    cuts = np.flatnonzero(np.diff(level[node_class[edge_node]][by_level])) + 1
    groups = [g for g in np.split(by_level, cuts) if len(g)]
    return Relaxed(
        [lay.class_ids[c] for c in order],
        node_list,
        node_class,
        cost,
        mem,
        root_index,
        edge_node,
        edge_child,
        depth,
        start_index,
        level,
        groups,
        len(nodes),
    )


def _node_position(lay: Layout, node: ENode) -> int:
    """The layout's number of ``node`` (a class has a handful of nodes: a scan of its class beats a dict)."""
    for i in lay.class_nodes[lay.class_index[node.eclass]]:
        if lay.node_ids[i] == node.id:
            return i
    raise InternalError(f"e-node {node.id} is not in its e-class {node.eclass}")


def _finite(lay: Layout, finite: list[bool], roots: list[int]) -> list[int]:
    """The finite-cost nodes of the classes reachable from the roots through finite-cost nodes, in the
    layout's order (that of their ids)."""
    seen = [False] * len(lay.class_ids)
    found: list[int] = []
    stack = list(roots)
    class_nodes, kids = lay.class_nodes, lay.kids
    while stack:
        cid = stack.pop()
        if seen[cid]:
            continue
        seen[cid] = True
        for i in class_nodes[cid]:
            if finite[i]:
                found.append(i)
                stack.extend(kids[i])
    found.sort()
    return found


def _order(lay: Layout, nodes: list[int], start: dict[int, int]) -> tuple[dict[int, list[int]], list[int]]:
    """Place classes bottom-up (module docstring); returns each placed class's kept nodes and the order."""
    kids, node_class = lay.kids, lay.node_class
    never = len(lay.class_ids) + 1  # more children than any node has: a node not in ``nodes`` never gets ready
    pending = [never] * len(lay.nodes)
    unready = [0] * len(lay.class_ids)
    ready: list[list[int]] = [[] for _ in lay.class_ids]
    for i in nodes:
        unready[node_class[i]] += 1
        pending[i] = len(kids[i])
    heap: list[tuple[int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    for i in nodes:
        if pending[i] == 0:
            cid = node_class[i]
            unready[cid] -= 1
            ready[cid].append(i)
            push(heap, (unready[cid], cid))
    placed: dict[int, list[int]] = {}
    order: list[int] = []
    users = lay.users  # child class -> nodes that wait for it (those not in ``nodes`` never get ready)
    while heap:
        count, cid = pop(heap)
        if cid in placed or count != unready[cid]:
            continue
        mine = ready[cid]
        if cid in start and start[cid] not in mine:
            continue  # the start plan's node must stay usable: wait for it
        placed[cid] = list(mine)
        order.append(cid)
        for i in users[cid]:
            pending[i] -= 1
            if pending[i] == 0:
                other = node_class[i]
                if other not in placed:
                    unready[other] -= 1
                    ready[other].append(i)
                    push(heap, (unready[other], other))
    return placed, order


def _reachable(lay: Layout, kept: dict[int, list[int]], roots: list[int]) -> set[int]:
    seen: set[int] = set()
    stack = [r for r in roots if r in kept]
    kids = lay.kids
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        for i in kept[cid]:
            stack.extend(kids[i])
    return seen


def _edges(
    lay: Layout, picked: np.ndarray, new_of: np.ndarray, node_class: np.ndarray, roots: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (node, distinct child class) pair whose child is not a root (a root is needed whatever points to
    it), ordered by node then child, and each class's level: the longest path from a root, in edges, which is
    how many Jacobi sweeps the reach probabilities need from scratch."""
    begin, end = lay.kid_start[picked], lay.kid_start[picked + 1]
    lengths = end - begin
    edge_node = np.repeat(np.arange(len(picked), dtype=np.int64), lengths)
    offset = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    edge_child = new_of[lay.kid_flat[np.repeat(begin, lengths) + offset]]
    is_root = np.zeros(count, dtype=bool)
    is_root[roots] = True
    keep = ~is_root[edge_child]
    edge_node, edge_child = edge_node[keep], edge_child[keep]
    ranked = np.lexsort((edge_child, edge_node))
    edge_node, edge_child = edge_node[ranked], edge_child[ranked]
    level = [0] * count
    edge_parent = node_class[edge_node].tolist()
    children = edge_child.tolist()
    by_parent = np.argsort(-node_class[edge_node], kind="stable").tolist()  # parents come after their children
    for e in by_parent:
        above = level[edge_parent[e]] + 1
        if above > level[children[e]]:
            level[children[e]] = above
    return edge_node, edge_child, np.array(level, dtype=np.int64)
