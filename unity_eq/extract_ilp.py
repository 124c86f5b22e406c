"""Exact extraction: a DAG-aware integer linear program solved by HiGHS, seeded with the greedy plan.

Variables, over the e-classes reachable from the outputs:

* ``x[n]`` (binary): e-node n is chosen;
* ``y[c]`` (in [0, 1], integral through x): e-class c is needed;

Minimize ``Σ cost[n]·x[n]`` — each chosen node is paid once however many consumers it has, which is what
makes the program DAG-aware — subject to::

    Σ_{n ∈ c} x[n] = y[c]                    every needed class gets exactly one node
    y[root] = 1                              the outputs are needed
    x[n] ≤ y[c']          for each child c'  a chosen node needs its children
    Σ_{n ∈ C} x[n] ≤ |C| − 1                 for every cycle C found in a solution (added lazily)

E-graphs here have cycles (``x = Partition(Combine(x))``). Rather than big-M level constraints, whose
relaxation is weak, cycles are cut lazily: solve, and while the chosen nodes contain a cycle, forbid it and
solve again. The greedy extraction is passed to HiGHS as the incumbent, so with a time limit the answer is
never worse than greedy, and HiGHS reports the optimality gap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.cost import Cost, CostModel
from unity_eq.egraph import EGraphData, Encoding, ENode
from unity_eq.errors import ExtractionError
from unity_eq.extract import (
    INF,
    break_cycles,
    build_plan,
    check_invariants,
    greedy_dag,
    node_costs,
    output_classes,
)
from unity_eq.ir import Graph
from unity_eq.plan import Plan

__all__ = ["IlpReport", "extract_ilp", "ilp_choice"]

OBJECTIVE_SCALE = 1e6  # the program's objective is in microseconds


@dataclass(frozen=True)
class IlpReport:
    """What HiGHS said: status, the plan's cost, the proven lower bound and the relative gap between them."""

    status: str
    objective: float
    bound: float
    gap: float
    seconds: float
    variables: int
    rows: int
    greedy_objective: float

    @property
    def optimal(self) -> bool:
        return self.gap <= 1e-6

    def as_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "objective_s": self.objective,
            "lower_bound_s": self.bound,
            "gap": self.gap,
            "seconds": round(self.seconds, 3),
            "variables": self.variables,
            "rows": self.rows,
            "greedy_objective_s": self.greedy_objective,
        }


def _reachable(data: EGraphData, costs: dict[str, Cost], roots: list[str]) -> tuple[list[str], list[ENode]]:
    """Classes reachable from the roots through finite-cost nodes, and those nodes."""
    seen: set[str] = set()
    order: list[str] = []
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        order.append(cid)
        for node in data.classes[cid].nodes:
            if costs[node.id].total < INF:
                stack.extend(c for c in node.children if c not in seen)
    nodes = [
        n
        for cid in order
        for n in data.classes[cid].nodes
        if costs[n.id].total < INF and all(c in seen for c in n.children)
    ]
    return order, list({n.id: n for n in nodes}.values())  # one column per node, however it was listed


def ilp_choice(
    data: EGraphData,
    costs: dict[str, Cost],
    roots: list[str],
    incumbent: dict[str, ENode],
    time_limit_s: float = 60.0,
) -> tuple[dict[str, ENode], IlpReport]:
    """Solve the extraction ILP; returns one node per needed class and HiGHS's report.

    Acyclicity is enforced lazily: solve, and while the chosen nodes contain a cycle, forbid that cycle
    (``Σ x ≤ k − 1`` over its k nodes) and solve again. This keeps the relaxation as tight as the plain
    DAG-cost program, which big-M level constraints do not.
    """
    import highspy

    start = time.perf_counter()
    classes, nodes = _reachable(data, costs, roots)
    nodes = [n for n in nodes if n.eclass not in n.children]  # a self-loop is never part of a plan
    col_of_node = {n.id: i for i, n in enumerate(nodes)}
    col_of_class = {c: len(nodes) + i for i, c in enumerate(classes)}
    n_cols = len(nodes) + len(classes)
    lp = _program(nodes, classes, roots, costs, col_of_node, col_of_class, highspy)
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("threads", 1)
    solver.setOptionValue("mip_rel_gap", 1e-7)  # "optimal" must mean optimal, not within HiGHS's 1e-4
    solver.passModel(lp)
    seed_cols, greedy_objective = _incumbent_columns(incumbent, roots, col_of_node, col_of_class, n_cols, costs)
    by_id = {n.id: n for n in nodes}
    cuts = 0
    while True:
        remaining = time_limit_s - (time.perf_counter() - start)
        solver.setOptionValue("time_limit", max(remaining, 0.01))
        if seed_cols is not None:
            seed = highspy.HighsSolution()
            seed.col_value = list(seed_cols)
            seed.value_valid = True
            solver.setSolution(seed)
        solver.run()
        solution = solver.getSolution()
        if not solution.value_valid:
            status = solver.modelStatusToString(solver.getModelStatus())
            raise ExtractionError(f"the extraction ILP found no solution ({status}); use `--extractor greedy`")
        values = np.asarray(solution.col_value)
        choice = {n.eclass: n for n in nodes if values[col_of_node[n.id]] > 0.5}
        cycle = _chosen_cycle(choice, roots)
        if cycle is None:
            break
        if time.perf_counter() - start >= time_limit_s:  # out of time with a cyclic answer: keep greedy
            choice = {c: by_id[n.id] for c, n in incumbent.items() if n.id in by_id}
            break
        members = [col_of_node[choice[c].id] for c in cycle]
        bound = len(members) - 1.0
        solver.addRow(-highspy.kHighsInf, bound, len(members), np.array(members, np.int32), np.ones(len(members)))
        cuts += 1
    status = solver.modelStatusToString(solver.getModelStatus())
    info = solver.getInfo()
    objective = _dag_cost(choice, roots, costs)
    bound = float(info.mip_dual_bound) / OBJECTIVE_SCALE if math.isfinite(info.mip_dual_bound) else objective
    bound = min(bound, objective)
    gap = max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
    report = IlpReport(
        status + (f" after {cuts} cycle cut(s)" if cuts else ""),
        objective,
        bound,
        gap,
        time.perf_counter() - start,
        n_cols,
        lp.num_row_ + cuts,
        greedy_objective,
    )
    return choice, report


def _program(
    nodes: list[ENode],
    classes: list[str],
    roots: list[str],
    costs: dict[str, Cost],
    col_of_node: dict[str, int],
    col_of_class: dict[str, int],
    highspy: Any,
) -> Any:
    """The DAG-cost program without acyclicity rows (added lazily)."""
    hs = highspy  # the module, passed in so that importing this module does not need it
    n_cols = len(nodes) + len(classes)
    lower = np.zeros(n_cols)
    upper = np.ones(n_cols)
    cost = np.zeros(n_cols)
    for n in nodes:  # in microseconds: seconds (~1e-6) sit at the scale of HiGHS's absolute tolerances
        cost[col_of_node[n.id]] = costs[n.id].total * OBJECTIVE_SCALE
    for root in roots:
        lower[col_of_class[root]] = 1.0
    starts, index, value, row_lower, row_upper = [0], [], [], [], []
    members: dict[str, list[ENode]] = {c: [] for c in classes}
    for n in nodes:
        members[n.eclass].append(n)
    for c in classes:
        for n in members[c]:
            index.append(col_of_node[n.id])
            value.append(1.0)
        index.append(col_of_class[c])
        value.append(-1.0)
        starts.append(len(index))
        row_lower.append(0.0)
        row_upper.append(0.0)
    for n in nodes:
        for child in sorted(set(n.children)):
            index += [col_of_node[n.id], col_of_class[child]]
            value += [1.0, -1.0]
            starts.append(len(index))
            row_lower.append(-hs.kHighsInf)
            row_upper.append(0.0)
    for n, m in _two_cycles(nodes, members):  # x = Partition(Combine(x)): at most one of the pair
        index += [col_of_node[n.id], col_of_node[m.id]]
        value += [1.0, 1.0]
        starts.append(len(index))
        row_lower.append(-hs.kHighsInf)
        row_upper.append(1.0)
    lp = hs.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = len(row_lower)
    lp.col_cost_ = cost
    lp.col_lower_ = lower
    lp.col_upper_ = upper
    lp.row_lower_ = np.array(row_lower)
    lp.row_upper_ = np.array(row_upper)
    lp.a_matrix_.format_ = hs.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.double)
    integer, continuous = hs.HighsVarType.kInteger, hs.HighsVarType.kContinuous
    lp.integrality_ = [integer] * len(nodes) + [continuous] * len(classes)
    return lp


def _two_cycles(nodes: list[ENode], members: dict[str, list[ENode]]) -> list[tuple[ENode, ENode]]:
    """Pairs of nodes that need each other's class: the cycles the cancellation rules create."""
    pairs = []
    for n in nodes:
        for child in set(n.children):
            for m in members.get(child, ()):
                if n.eclass in m.children and n.id < m.id:
                    pairs.append((n, m))
    return pairs


def _chosen_cycle(choice: dict[str, ENode], roots: list[str]) -> list[str] | None:
    from unity_eq.extract import _find_cycle

    return _find_cycle(choice, roots)


def _dag_cost(choice: dict[str, ENode], roots: list[str], costs: dict[str, Cost]) -> float:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        stack.extend(choice[cid].children)
    return math.fsum(costs[choice[c].id].total for c in seen)


def _incumbent_columns(
    incumbent: dict[str, ENode],
    roots: list[str],
    col_of_node: dict[str, int],
    col_of_class: dict[str, int],
    n_cols: int,
    costs: dict[str, Cost],
) -> tuple[np.ndarray | None, float]:
    """The greedy extraction as a full column vector (x and y)."""
    cols = np.zeros(n_cols)
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        node = incumbent.get(cid)
        if node is None or node.id not in col_of_node:
            return None, INF
        cols[col_of_node[node.id]] = 1.0
        cols[col_of_class[cid]] = 1.0
        stack.extend(node.children)
    return cols, math.fsum(costs[incumbent[c].id].total for c in seen)


def extract_ilp(
    data: EGraphData, encoding: Encoding, graph: Graph, model: CostModel, time_limit_s: float = 60.0
) -> tuple[Plan, IlpReport]:
    """Exact extraction (within the time limit), seeded with the greedy plan."""
    check_invariants(data)
    costs = node_costs(data, model)
    roots = output_classes(data, encoding, graph)
    greedy = break_cycles(data, greedy_dag(data, costs), costs, roots)
    choice, report = ilp_choice(data, costs, roots, greedy, time_limit_s)
    plan = build_plan(data, choice, costs, encoding, graph, model)
    plan.stats["ilp"] = report.as_dict()
    return plan, report
