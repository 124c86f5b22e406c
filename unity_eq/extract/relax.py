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
from unity_eq.extract.pricing import INF, reachable

__all__ = ["Relaxed", "relax"]


@dataclass(frozen=True)
class Relaxed:
    """The kept sub-e-graph: classes in topological order (children first), nodes grouped by class.

    ``node_class[i]`` is the class index of node i (non-decreasing); ``edge_node``/``edge_child`` list every
    (node, distinct child class) pair whose child is not a root; ``depth`` bounds the length of a path.
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


def relax(
    data: EGraphData,
    totals: Mapping[str, float],
    roots: list[str],
    start: dict[str, ENode],
    memory: Mapping[str, float] | None = None,
) -> Relaxed:
    """Cut the e-graph under ``totals`` (INF bans a node) to the DAG the relaxation searches (module docstring)."""
    classes, nodes = _finite(data, totals, roots)
    needed = chosen_closure(start, roots) or set()
    kept, order = _order(classes, nodes, {c: start[c].id for c in needed if c in classes})
    reach = _reachable(kept, roots)
    order = [c for c in order if c in reach]
    index = {c: i for i, c in enumerate(order)}
    node_list = [n for c in order for n in kept[c]]
    node_class = np.array([index[n.eclass] for n in node_list], dtype=np.int64)
    cost = np.array([totals[n.id] for n in node_list], dtype=np.float64)
    mem = np.array([(memory or {}).get(n.id, 0.0) for n in node_list], dtype=np.float64)
    position = {n.id: i for i, n in enumerate(node_list)}
    start_index = np.full(len(order), -1, dtype=np.int64)
    for c in needed:
        if c in index:
            start_index[index[c]] = position[start[c].id]
    root_index = np.array(sorted({index[r] for r in roots}), dtype=np.int64)
    edge_node, edge_child, depth = _edges(node_list, index, root_index)
    return Relaxed(order, node_list, node_class, cost, mem, root_index, edge_node, edge_child, depth, start_index)


def _finite(data: EGraphData, totals: Mapping[str, float], roots: list[str]) -> tuple[set[str], list[ENode]]:
    """Classes reachable from the roots through finite-cost nodes, and those nodes (each once)."""
    seen = set(reachable(roots, lambda cid: _finite_children(data, totals, cid)))
    nodes = {n.id: n for c in seen for n in data.classes[c].nodes if totals[n.id] < INF}
    return seen, sorted(nodes.values(), key=lambda n: n.id)


def _finite_children(data: EGraphData, totals: Mapping[str, float], cid: str) -> list[str]:
    return [c for node in data.classes[cid].nodes if totals[node.id] < INF for c in node.children]


def _order(classes: set[str], nodes: list[ENode], start: dict[str, str]) -> tuple[dict[str, list[ENode]], list[str]]:
    """Place classes bottom-up (module docstring); returns each placed class's kept nodes and the order."""
    pending = {n.id: len(set(n.children)) for n in nodes}
    waiting: dict[str, list[ENode]] = {}  # child class -> nodes that wait for it
    unready = dict.fromkeys(classes, 0)
    ready: dict[str, list[ENode]] = {c: [] for c in classes}
    for n in nodes:
        unready[n.eclass] += 1
        for child in set(n.children):
            waiting.setdefault(child, []).append(n)
    heap: list[tuple[int, str]] = []

    def arm(n: ENode) -> None:
        unready[n.eclass] -= 1
        ready[n.eclass].append(n)
        heapq.heappush(heap, (unready[n.eclass], n.eclass))

    for n in nodes:
        if pending[n.id] == 0:
            arm(n)
    placed: dict[str, list[ENode]] = {}
    order: list[str] = []
    while heap:
        count, cid = heapq.heappop(heap)
        if cid in placed or count != unready[cid]:
            continue
        if cid in start and all(n.id != start[cid] for n in ready[cid]):
            continue  # the start plan's node must stay usable: wait for it
        placed[cid] = list(ready[cid])
        order.append(cid)
        for n in waiting.get(cid, ()):
            pending[n.id] -= 1
            if pending[n.id] == 0 and n.eclass not in placed:
                arm(n)
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
            stack.extend(c for c in n.children if c not in seen)
    return seen


def _edges(nodes: list[ENode], index: dict[str, int], roots: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Every (node, distinct child class) pair whose child is not a root (a root is needed whatever points to
    it), and the depth of the DAG: the longest path from a root, in edges, which is how many Jacobi sweeps
    the reach probabilities need from scratch."""
    count = len(index)
    depth = np.zeros(count, dtype=np.int64)
    is_root = np.zeros(count, dtype=bool)
    is_root[roots] = True
    parents: list[int] = []
    children: list[int] = []
    for i, n in enumerate(nodes):
        for child in sorted(set(n.children)):
            if not is_root[index[child]]:
                parents.append(i)
                children.append(index[child])
    by_class: list[list[int]] = [[] for _ in range(count)]
    for e, i in enumerate(parents):
        by_class[index[nodes[i].eclass]].append(e)
    for c in range(count - 1, -1, -1):  # parents come after their children in the order
        for e in by_class[c]:
            depth[children[e]] = max(depth[children[e]], depth[c] + 1)
    return np.array(parents, dtype=np.int64), np.array(children, dtype=np.int64), int(depth.max(initial=0)) + 1
