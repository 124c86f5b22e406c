"""The greedy DAG extractor (extraction-gym's): one e-node per needed e-class, a shared subterm paid once.

E-graphs here have cycles (``x = Partition(Combine(x))``): a choice whose cost set contains its own e-class is
skipped, and cycles that survive the greedy pass are broken afterwards.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from unity_eq.cost import COST_EPSILON
from unity_eq.egraph import EGraphData, ENode
from unity_eq.errors import ExtractionError, InternalError
from unity_eq.extract.pricing import INF, CostTable, reachable, seconds_of, totals_of
from unity_eq.ops.registry import spec_for


@dataclass
class _Best:
    total: float
    costs: dict[str, float]  # e-class -> cost of its chosen node, over the chosen sub-DAG
    node: ENode


def parents_of(data: EGraphData) -> dict[str, list[ENode]]:
    """E-class -> the e-nodes that have it as a child (each node once per class)."""
    parents: dict[str, list[ENode]] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            for child in set(node.children):
                parents.setdefault(child, []).append(node)
    return parents


def greedy_dag(data: EGraphData, costs: CostTable, parents: dict[str, list[ENode]] | None = None) -> dict[str, ENode]:
    """Pick, for every reachable e-class, the node whose sub-DAG of distinct classes costs least.

    ``costs`` gives every e-node's own cost (a Cost, or seconds); an infinite cost bans the node. ``parents``
    (from :func:`parents_of`) can be shared between runs on one e-graph.
    """
    totals = totals_of(costs)
    if parents is None:
        parents = parents_of(data)
    best: dict[str, _Best] = {}
    counter = 0
    queue: list[tuple[float, int, ENode]] = []
    for cls in data.classes.values():
        for node in cls.nodes:
            if not node.children and totals[node.id] < INF:
                heapq.heappush(queue, (totals[node.id], counter, node))
                counter += 1
    while queue:
        _, _, node = heapq.heappop(queue)
        children = set(node.children)
        if any(c not in best for c in children) or node.eclass in children:
            continue
        own = totals[node.id]
        ordered = sorted(children, key=lambda c: -len(best[c].costs))
        if ordered:
            first = best[ordered[0]]
            merged = dict(first.costs)
            total = first.total
            for child in ordered[1:]:
                for cid, value in best[child].costs.items():
                    if cid not in merged:
                        merged[cid] = value
                        total += value
        else:
            merged, total = {}, 0.0
        if node.eclass in merged:
            continue  # choosing this node would make a cycle
        merged[node.eclass] = own
        total += own
        current = best.get(node.eclass)
        if current is not None and total >= current.total * (1 - COST_EPSILON):  # not cost.cheaper, inline (hot loop)
            continue
        best[node.eclass] = _Best(total, merged, node)
        for parent in parents.get(node.eclass, ()):
            if totals[parent.id] < INF:
                heapq.heappush(queue, (total, counter, parent))
                counter += 1
    return {cid: b.node for cid, b in best.items()}


def _tensor_children(node: ENode) -> set[str]:
    return set(node.children)


def find_cycle(choice: dict[str, ENode], roots: Iterable[str]) -> list[str] | None:
    """A cycle of e-classes in the chosen graph reachable from ``roots``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    for root in roots:
        if state.get(root):
            continue
        path: list[str] = []
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(_tensor_children(choice[root]))))]
        state[root] = 1
        path.append(root)
        while stack:
            cid, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[cid] = 2
                continue
            if child not in choice:
                continue
            if state.get(child) == 1:
                return path[path.index(child) :]
            if not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(_tensor_children(choice[child])))))
    return None


def chosen_closure(choice: dict[str, ENode], roots: Iterable[str]) -> set[str] | None:
    """The classes an extraction needs: those reachable from ``roots`` through the chosen nodes' children;
    None when one of them has no chosen node (the extraction is incomplete)."""
    missing: list[str] = []

    def children(cid: str) -> tuple[str, ...]:
        node = choice.get(cid)
        if node is None:
            missing.append(cid)
            return ()
        return node.children

    seen = set(reachable(roots, children))
    return None if missing else seen


def _reaches(choice: dict[str, ENode], starts: Iterable[str], target: str) -> tuple[bool, set[str]]:
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        cid = stack.pop()
        if cid == target:
            return True, seen
        if cid in seen or cid not in choice:
            continue
        seen.add(cid)
        stack.extend(_tensor_children(choice[cid]))
    return False, seen


def break_cycles(data: EGraphData, choice: dict[str, ENode], costs: CostTable, roots: list[str]) -> dict[str, ENode]:
    """Make the chosen graph acyclic.

    Greedy DAG extraction keeps a class's choice when a child later improves, so the final choices can form
    a cycle (x = Partition(Combine(x))). Re-choose one class of each cycle among the nodes whose children,
    under the current choices, never reach that class again; the re-choice cannot create a new cycle.
    """
    choice = dict(choice)
    totals = totals_of(costs)
    for _ in range(len(data.classes) + 1):
        cycle = find_cycle(choice, roots)
        if cycle is None:
            return choice
        best: tuple[float, str, ENode] | None = None
        for cid in cycle:
            for node in data.classes[cid].nodes:
                if node is choice[cid] or totals[node.id] == INF:
                    continue
                children = _tensor_children(node)
                if any(c not in choice for c in children):
                    continue
                loops, closure = _reaches(choice, children, cid)
                if loops:
                    continue
                total = totals[node.id] + math.fsum(totals[choice[c].id] for c in closure)
                if best is None or total < best[0]:
                    best = (total, cid, node)
        if best is None:
            names = ", ".join(sorted({n.op for c in cycle for n in data.classes[c].nodes}))
            raise ExtractionError(f"no acyclic plan: e-classes {cycle} ({names}) only depend on each other")
        choice[best[1]] = best[2]
    raise InternalError("could not remove cycles from the extracted plan")


def dag_cost(choice: dict[str, ENode], roots: Iterable[str], costs: CostTable) -> float:
    """Seconds of the plan ``choice`` makes for ``roots``: every needed class's chosen node once (INF when a
    needed class has no choice)."""
    needed = chosen_closure(choice, roots)
    if needed is None:
        return INF
    return math.fsum(seconds_of(costs[choice[c].id]) for c in needed)


def adopt_multi_outputs(
    data: EGraphData, choice: dict[str, ENode], totals: Mapping[str, float], roots: list[str]
) -> dict[str, ENode]:
    """Choose whole multi-output nodes where that makes the (acyclic) plan cheaper.

    Greedy extraction prices each class alone, so the outputs of one multi-output op (a Split) each look as
    if they paid for its producer: Q, K and V split from one MatMul over concatenated weights
    (generated/merge.egg) never beat three MatMuls class by class, although together they do. For each group
    of e-nodes that are the outputs of one instance (same op, same arguments but the output index), this
    tries the group for every needed class that holds one of its outputs and keeps the change when the DAG
    cost of the plan drops and it stays acyclic.
    """
    return adopt_groups(multi_output_groups(data, totals), choice, totals, roots)


MultiOutputGroups = list[list[tuple[str, ENode]]]


def multi_output_groups(data: EGraphData, totals: Mapping[str, float]) -> MultiOutputGroups:
    """The allowed e-nodes that are the outputs of one multi-output op instance (same op, same arguments but
    the output index), grouped, with their classes: what :func:`adopt_multi_outputs` tries. A pass over every
    e-node: compute it once for several choices of one e-graph (:func:`adopt_groups`)."""
    groups: dict[tuple[object, ...], list[tuple[str, ENode]]] = {}
    for cls in data.classes.values():
        for node in cls.nodes:
            spec = spec_for(node.op)
            if spec is not None and spec.multi_output and totals[node.id] < INF:
                key = (node.op, *(tuple(a) if isinstance(a, list) else a for a in node.args[:-1]))
                groups.setdefault(key, []).append((cls.id, node))
    return list(groups.values())


#: Every multi-output e-node grouped as :func:`multi_output_groups` groups them, whatever the prices, each with
#: its rank in the walk over the e-graph: a structure to keep per e-graph (:func:`priced_groups` prices it).
MultiOutputMembers = list[list[tuple[int, str, ENode]]]


def multi_output_members(data: EGraphData) -> MultiOutputMembers:
    """:func:`multi_output_groups` before the prices: every multi-output e-node, banned or not."""
    groups: dict[tuple[object, ...], list[tuple[int, str, ENode]]] = {}
    rank = 0
    for cls in data.classes.values():
        for node in cls.nodes:
            spec = spec_for(node.op)
            if spec is not None and spec.multi_output:
                key = (node.op, *(tuple(a) if isinstance(a, list) else a for a in node.args[:-1]))
                groups.setdefault(key, []).append((rank, cls.id, node))
            rank += 1
    return list(groups.values())


def priced_groups(members: MultiOutputMembers, totals: Mapping[str, float]) -> MultiOutputGroups:
    """:func:`multi_output_groups` from the members kept per e-graph: the allowed ones, the groups in the order
    of their first allowed member (the order the walk over the e-graph finds them in), a pass over the
    multi-output nodes only."""
    found = []
    for group in members:
        allowed = [(rank, cid, node) for rank, cid, node in group if totals[node.id] < INF]
        if allowed:
            found.append(allowed)
    found.sort(key=lambda g: g[0][0])
    return [[(cid, node) for _, cid, node in group] for group in found]


def adopt_groups(
    groups: MultiOutputGroups, choice: dict[str, ENode], totals: Mapping[str, float], roots: list[str]
) -> dict[str, ENode]:
    """:func:`adopt_multi_outputs` with the groups already found."""
    if not groups:
        return choice
    current = dag_cost(choice, roots, totals)
    needed = chosen_closure(choice, roots) or set()
    for members in groups:
        swaps = [(cid, node) for cid, node in members if cid in needed and choice[cid] is not node]
        if len(swaps) < 2 or any(c not in choice for _, node in swaps for c in node.children):
            continue
        trial = dict(choice)
        trial.update(swaps)
        cost = dag_cost(trial, roots, totals)
        if cost < current * (1 - 1e-9) and find_cycle(trial, roots) is None:
            choice, current = trial, cost
            needed = chosen_closure(choice, roots) or set()
    return choice


def repair_choice(data: EGraphData, choice: dict[str, ENode], totals: CostTable, roots: list[str]) -> dict[str, ENode]:
    """What every greedy answer goes through before a plan is built from it: cycles broken, then whole
    multi-output nodes adopted where that is cheaper (both need the roots: they work on the chosen closure)."""
    choice = break_cycles(data, choice, totals, roots)
    return adopt_multi_outputs(data, choice, totals, roots)  # type: ignore[arg-type]
