"""The e-graph as the differentiable extractor sees it: an acyclic sub-e-graph laid out as index arrays.

A relaxed choice (a softmax per e-class) cannot see that a cycle of classes computes nothing: with
``x = Partition(Combine(x))`` the relaxation would "make" ``x`` for the price of two collectives. So before any
gradient step the e-graph is cut to a DAG, as greedy cuts it (greedy skips a node whose cost set contains its
own class): classes are placed bottom-up, a node is kept only when all its children were placed before its
class, and when no class has every node ready the one that loses the fewest nodes goes next (a greedy
feedback-arc-set order). The start choice (greedy's plan) is kept whole: a class it needs is placed only once
its start node is ready, so the greedy plan is always a point of the relaxed space and every rounded choice
is acyclic by construction.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from unity_eq.egraph import EGraphData, ENode
from unity_eq.extract.greedy import chosen_closure
from unity_eq.extract.pricing import INF

__all__ = ["Relaxed", "relax"]


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


def relax(
    data: EGraphData,
    totals: Mapping[str, float],
    roots: list[str],
    start: dict[str, ENode],
    memory: Mapping[str, float] | None = None,
) -> Relaxed:
    """Cut the e-graph under ``totals`` (INF bans a node) to the DAG the relaxation searches (module docstring).

    One pass per stage over plain lists: this runs once per differentiable extraction, whose time budget is
    greedy's, so it must stay a small fraction of greedy's own pass over the e-graph."""
    classes, nodes = _finite(data, totals, roots)
    needed = chosen_closure(start, roots) or set()
    kept, order = _order(classes, nodes, {c: start[c].id for c in needed if c in classes})
    reach = _reachable(kept, roots)
    order = [c for c in order if c in reach]
    index = {c: i for i, c in enumerate(order)}
    node_list = [n for c in order for n in kept[c]]
    node_class = np.fromiter((index[n.eclass] for n in node_list), dtype=np.int64, count=len(node_list))
    cost = np.fromiter((totals[n.id] for n in node_list), dtype=np.float64, count=len(node_list))
    mem = (
        np.fromiter((memory.get(n.id, 0.0) for n in node_list), dtype=np.float64, count=len(node_list))
        if memory
        else np.zeros(len(node_list))
    )
    position = {n.id: i for i, n in enumerate(node_list)}
    start_index = np.full(len(order), -1, dtype=np.int64)
    for c in needed:
        if c in index:
            start_index[index[c]] = position[start[c].id]
    root_index = np.array(sorted({index[r] for r in roots}), dtype=np.int64)
    edge_node, edge_child, level = _edges(node_list, node_class, index, root_index)
    depth = int(level.max(initial=0)) + 1
    by_level = np.argsort(level[node_class[edge_node]], kind="stable")
    cuts = np.flatnonzero(np.diff(level[node_class[edge_node]][by_level])) + 1
    groups = [g for g in np.split(by_level, cuts) if len(g)]
    return Relaxed(
        order,
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


def _finite(data: EGraphData, totals: Mapping[str, float], roots: list[str]) -> tuple[set[str], list[ENode]]:
    """Classes reachable from the roots through finite-cost nodes, and those nodes (each once, by id)."""
    seen: set[str] = set()
    found: list[ENode] = []
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        for node in data.classes[cid].nodes:
            if totals[node.id] < INF:
                found.append(node)
                stack.extend(node.children)
    found.sort(key=lambda n: n.id)
    return seen, found


def _order(classes: set[str], nodes: list[ENode], start: dict[str, str]) -> tuple[dict[str, list[ENode]], list[str]]:
    """Place classes bottom-up (module docstring); returns each placed class's kept nodes and the order."""
    kids = [set(n.children) for n in nodes]
    pending = [len(k) for k in kids]
    waiting: dict[str, list[int]] = {}  # child class -> nodes that wait for it
    unready = dict.fromkeys(classes, 0)
    ready: dict[str, list[ENode]] = {c: [] for c in classes}
    for i, n in enumerate(nodes):
        unready[n.eclass] += 1
        for child in kids[i]:
            waiting.setdefault(child, []).append(i)
    heap: list[tuple[int, str]] = []
    push = heapq.heappush
    for n, count in zip(nodes, pending, strict=True):
        if count == 0:
            cid = n.eclass
            unready[cid] -= 1
            ready[cid].append(n)
            push(heap, (unready[cid], cid))
    placed: dict[str, list[ENode]] = {}
    order: list[str] = []
    while heap:
        count, cid = heapq.heappop(heap)
        if cid in placed or count != unready[cid]:
            continue
        mine = ready[cid]
        if cid in start and all(n.id != start[cid] for n in mine):
            continue  # the start plan's node must stay usable: wait for it
        placed[cid] = list(mine)
        order.append(cid)
        for i in waiting.get(cid, ()):
            pending[i] -= 1
            if pending[i] == 0:
                n = nodes[i]
                other = n.eclass
                if other not in placed:
                    unready[other] -= 1
                    ready[other].append(n)
                    push(heap, (unready[other], other))
    return placed, order


def _reachable(kept: dict[str, list[ENode]], roots: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = [r for r in roots if r in kept]
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        for n in kept[cid]:
            stack.extend(n.children)
    return seen


def _edges(
    nodes: list[ENode], node_class: np.ndarray, index: dict[str, int], roots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (node, distinct child class) pair whose child is not a root (a root is needed whatever points to
    it), and each class's level: the longest path from a root, in edges, which is how many Jacobi sweeps the
    reach probabilities need from scratch."""
    count = len(index)
    is_root = [False] * count
    for r in roots.tolist():
        is_root[r] = True
    parents: list[int] = []
    children: list[int] = []
    for i, n in enumerate(nodes):
        for child in sorted({index[c] for c in n.children}):
            if not is_root[child]:
                parents.append(i)
                children.append(child)
    edge_node = np.array(parents, dtype=np.int64)
    edge_child = np.array(children, dtype=np.int64)
    level = [0] * count
    edge_parent = node_class[edge_node].tolist()
    by_parent = np.argsort(-node_class[edge_node], kind="stable").tolist()  # parents come after their children
    for e in by_parent:
        above = level[edge_parent[e]] + 1
        if above > level[children[e]]:
            level[children[e]] = above
    return edge_node, edge_child, np.array(level, dtype=np.int64)
