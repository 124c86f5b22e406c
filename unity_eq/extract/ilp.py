"""Exact extraction: a DAG-aware integer linear program solved by HiGHS, seeded with the greedy plan.

Variables, over the e-classes reachable from the outputs:

* ``x[n]`` (binary): e-node n is chosen;
* ``y[c]`` (in [0, 1], integral through x): e-class c is needed;

Minimize ``Σ cost[n]·x[n]`` — each chosen node is paid once however many consumers it has, which is what
makes the program DAG-aware — subject to::

    Σ_{n ∈ c} x[n] = y[c]                    every needed class gets exactly one node
    y[root] = 1                              the outputs are needed
    x[n] ≤ y[c']          for each child c'  a chosen node needs its children
    Σ_i x(c_i → c_i+1) ≤ Σ_i y[c_i] − y[c_j]  for a cycle of classes c_1 … c_k (any j)

where ``x(c → c')`` sums the nodes of class c that have c' as a child. The last row says a cycle of classes
is never closed: it holds for every acyclic extraction (each run of needed classes along the cycle has one
class whose node does not point to the next), and unlike ``Σ x ≤ k − 1`` it also cuts the half-integral
points of the relaxation (``x = ½·Partition + ½·Combine``) that make a plain relaxation worthless, so
HiGHS's bound, and the gap we report, mean something.

E-graphs here have cycles (``x = Partition(Combine(x))``). Rather than big-M level constraints, whose
relaxation is weak, cycles are cut: every 2-cycle of classes up front; longer ones found in the relaxation
(a few rounds of LP cutting planes before branching) and in integer solutions (solve, and while the chosen
nodes contain a cycle, cut it and solve again). The greedy extraction is passed to HiGHS as the incumbent,
so with a time limit the answer is never worse than greedy, and HiGHS reports the optimality gap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from unity_eq.cost import Cost, CostModel
from unity_eq.egraph import EGraphData, Encoding, ENode
from unity_eq.errors import ExtractionError
from unity_eq.extract.build import build_plan, check_invariants, output_classes
from unity_eq.extract.greedy import break_cycles, chosen_closure, dag_cost, find_cycle, greedy_dag
from unity_eq.extract.pricing import INF, node_costs, reachable, source_kinds
from unity_eq.ir import Graph
from unity_eq.plan import Plan
from unity_eq.planfile import IlpProgramRecord

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

    def to_record(self) -> IlpProgramRecord:
        """As plan.json holds it (``extraction.ilp.programs``)."""
        return IlpProgramRecord(
            status=self.status,
            objective_s=self.objective,
            lower_bound_s=self.bound,
            gap=self.gap,
            seconds=round(self.seconds, 3),
            variables=self.variables,
            rows=self.rows,
            greedy_objective_s=self.greedy_objective,
        )


def _reachable(data: EGraphData, costs: dict[str, Cost], roots: list[str]) -> tuple[list[str], list[ENode]]:
    """Classes reachable from the roots through finite-cost nodes, and those nodes."""
    order = reachable(
        roots, lambda cid: [c for n in data.classes[cid].nodes if costs[n.id].total < INF for c in n.children]
    )
    seen = set(order)
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

    Acyclicity is enforced by class-cycle rows (module docstring): 2-cycles up front, longer cycles found in
    the LP relaxation before branching and in integer solutions afterwards (solve, cut, solve again).
    """
    import highspy

    start = time.perf_counter()
    classes, nodes = _reachable(data, costs, roots)
    nodes = [n for n in nodes if n.eclass not in n.children]  # a self-loop is never part of a plan
    cols = _Columns(nodes, classes)
    lp = _program(cols, roots, costs, highspy)
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("threads", 1)
    solver.setOptionValue("mip_rel_gap", 1e-7)  # "optimal" must mean optimal, not within HiGHS's 1e-4
    solver.passModel(lp)
    cuts = _cut_relaxation(solver, cols, highspy, deadline=start + time_limit_s / 4)
    integer = np.full(len(nodes), highspy.HighsVarType.kInteger)
    solver.changeColsIntegrality(len(nodes), np.arange(len(nodes), dtype=np.int32), integer)
    seed_cols, greedy_objective = _incumbent_columns(incumbent, roots, cols, costs)
    by_id = {n.id: n for n in nodes}
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
        choice = {n.eclass: n for n in nodes if values[cols.node[n.id]] > 0.5}
        cycle = find_cycle(choice, roots)
        if cycle is None:
            break
        if time.perf_counter() - start >= time_limit_s:  # out of time with a cyclic answer: keep greedy
            choice = {c: by_id[n.id] for c, n in incumbent.items() if n.id in by_id}
            break
        _add_cycle_row(solver, cols, cycle, highspy)
        cuts += 1
    status = solver.modelStatusToString(solver.getModelStatus())
    info = solver.getInfo()
    objective = dag_cost(choice, roots, costs)
    bound = float(info.mip_dual_bound) / OBJECTIVE_SCALE if math.isfinite(info.mip_dual_bound) else objective
    bound = min(bound, objective)
    gap = max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
    report = IlpReport(
        status + (f" after {cuts} cycle cut(s)" if cuts else ""),
        objective,
        bound,
        gap,
        time.perf_counter() - start,
        cols.count,
        lp.num_row_ + cuts,
        greedy_objective,
    )
    return choice, report


class _Columns:
    """Column indices: one binary per e-node, then one continuous ``y`` per e-class; and, per class, its
    nodes grouped by child class (the ``x(c → c')`` sums of the cycle rows)."""

    def __init__(self, nodes: list[ENode], classes: list[str]) -> None:
        self.nodes = nodes
        self.classes = classes
        self.node = {n.id: i for i, n in enumerate(nodes)}
        self.cls = {c: len(nodes) + i for i, c in enumerate(classes)}
        self.count = len(nodes) + len(classes)
        self.members: dict[str, list[ENode]] = {c: [] for c in classes}
        self.towards: dict[tuple[str, str], list[int]] = {}
        for n in nodes:
            self.members[n.eclass].append(n)
            for child in set(n.children):
                self.towards.setdefault((n.eclass, child), []).append(self.node[n.id])

    def cycle_row(self, cycle: list[str], j: int) -> tuple[np.ndarray, np.ndarray]:
        """``Σ_i x(c_i → c_i+1) − Σ_{i≠j} y[c_i] ≤ 0`` as (indices, values)."""
        coef: dict[int, float] = {}
        for i, c in enumerate(cycle):
            for col in self.towards.get((c, cycle[(i + 1) % len(cycle)]), ()):
                coef[col] = coef.get(col, 0.0) + 1.0
            if i != j:
                coef[self.cls[c]] = coef.get(self.cls[c], 0.0) - 1.0
        index = np.array(sorted(coef), np.int32)
        return index, np.array([coef[i] for i in index.tolist()])


def _program(cols: _Columns, roots: list[str], costs: dict[str, Cost], highspy: Any) -> Any:
    """The relaxed DAG-cost program with the 2-cycle rows (integrality is set after the LP cuts)."""
    hs = highspy  # the module, passed in so that importing this module does not need it
    lower = np.zeros(cols.count)
    upper = np.ones(cols.count)
    cost = np.zeros(cols.count)
    for n in cols.nodes:  # in microseconds: seconds (~1e-6) sit at the scale of HiGHS's absolute tolerances
        cost[cols.node[n.id]] = costs[n.id].total * OBJECTIVE_SCALE
    for root in roots:
        lower[cols.cls[root]] = 1.0
    starts: list[int] = [0]
    index: list[int] = []
    value: list[float] = []
    row_lower: list[float] = []
    row_upper: list[float] = []

    def row(idx: list[int] | np.ndarray, val: list[float] | np.ndarray, lo: float, up: float) -> None:
        index.extend(int(i) for i in idx)
        value.extend(float(v) for v in val)
        starts.append(len(index))
        row_lower.append(lo)
        row_upper.append(up)

    for c in cols.classes:
        row([cols.node[n.id] for n in cols.members[c]] + [cols.cls[c]], [1.0] * len(cols.members[c]) + [-1.0], 0, 0)
    for n in cols.nodes:
        for child in sorted(set(n.children)):
            row([cols.node[n.id], cols.cls[child]], [1.0, -1.0], -hs.kHighsInf, 0.0)
    for a, b in _two_cycles(cols):  # x = Partition(Combine(x)): the pair of classes is never closed
        for j in (0, 1):
            row(*cols.cycle_row([a, b], j), -hs.kHighsInf, 0.0)
    lp = hs.HighsLp()
    lp.num_col_ = cols.count
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
    lp.integrality_ = [hs.HighsVarType.kContinuous] * cols.count
    return lp


def _two_cycles(cols: _Columns) -> list[tuple[str, str]]:
    """Pairs of classes with a node each that needs the other: the cycles the cancellation rules create."""
    return sorted({(a, b) for (a, b) in cols.towards if a < b and (b, a) in cols.towards})


def _add_cycle_row(solver: Any, cols: _Columns, cycle: list[str], highspy: Any) -> None:
    index, value = cols.cycle_row(cycle, 0)
    solver.addRow(-highspy.kHighsInf, 0.0, len(index), index, value)


def _cut_relaxation(solver: Any, cols: _Columns, highspy: Any, deadline: float, rounds: int = 30) -> int:
    """Cutting planes at the root: solve the LP, add the class-cycle rows its solution violates, repeat.

    Separation is heuristic (a shortest cycle back through each support edge), which is enough: the rows
    only tighten the bound, integer solutions are checked for cycles exactly afterwards.
    """
    added: set[tuple[str, ...]] = set()
    for _ in range(rounds):
        if time.perf_counter() >= deadline:
            break
        solver.setOptionValue("time_limit", max(deadline - time.perf_counter(), 0.01))
        solver.run()
        if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        values = np.asarray(solver.getSolution().col_value)
        new = 0
        for cycle, j in _violated_cycles(cols, values):
            key = tuple(cycle)
            if key in added:
                continue
            added.add(key)
            index, value = cols.cycle_row(cycle, j)
            solver.addRow(-highspy.kHighsInf, 0.0, len(index), index, value)
            new += 1
        if not new:
            break
    return len(added)


def _violated_cycles(cols: _Columns, values: np.ndarray, limit: int = 200) -> list[tuple[list[str], int]]:
    """Cycles of the relaxation's support whose class-cycle row it violates, each with its best ``j``."""
    weight = {
        edge: float(sum(values[i] for i in members)) for edge, members in cols.towards.items() if edge[1] in cols.cls
    }
    support: dict[str, list[str]] = {}
    for (a, b), w in weight.items():
        if w > 1e-7:
            support.setdefault(a, []).append(b)
    found: list[tuple[list[str], int]] = []
    seen: set[tuple[str, ...]] = set()
    for (a, b), w in sorted(weight.items(), key=lambda item: -item[1]):
        if w <= 1e-7:
            break
        path = _shortest_path(support, b, a)
        if path is None:
            continue
        cycle = _rotate([a, *path[:-1]])
        if tuple(cycle) in seen:
            continue
        seen.add(tuple(cycle))
        flow = sum(weight[(c, cycle[(i + 1) % len(cycle)])] for i, c in enumerate(cycle))
        ys = [values[cols.cls[c]] for c in cycle]
        j = int(np.argmax(ys))
        if flow - (sum(ys) - ys[j]) > 1e-6:
            found.append((cycle, j))
            if len(found) >= limit:
                break
    return found


def _shortest_path(graph: dict[str, list[str]], source: str, target: str) -> list[str] | None:
    """Breadth-first path from source to target (both included), or None."""
    parent: dict[str, str | None] = {source: None}
    queue = [source]
    for node in queue:
        if node == target:
            path = [node]
            while (prev := parent[path[-1]]) is not None:
                path.append(prev)
            return path[::-1]
        for nxt in graph.get(node, ()):
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


def _rotate(cycle: list[str]) -> list[str]:
    """The cycle starting at its smallest class, so that equal cycles compare equal."""
    k = cycle.index(min(cycle))
    return cycle[k:] + cycle[:k]


def _incumbent_columns(
    incumbent: dict[str, ENode], roots: list[str], cols: _Columns, costs: dict[str, Cost]
) -> tuple[np.ndarray | None, float]:
    """The greedy extraction as a full column vector (x and y); None when it uses a node the program lacks."""
    needed = chosen_closure(incumbent, roots)
    if needed is None or any(incumbent[c].id not in cols.node for c in needed):
        return None, INF
    vector = np.zeros(cols.count)
    for cid in needed:
        vector[cols.node[incumbent[cid].id]] = 1.0
        vector[cols.cls[cid]] = 1.0
    return vector, math.fsum(costs[incumbent[c].id].total for c in needed)


def extract_ilp(
    data: EGraphData, encoding: Encoding, graph: Graph, model: CostModel, time_limit_s: float = 60.0
) -> tuple[Plan, IlpReport]:
    """Exact extraction (within the time limit), seeded with the greedy plan."""
    check_invariants(data)
    costs = node_costs(data, model, kinds=source_kinds(data, graph.constants()))
    roots = output_classes(data, encoding, graph)
    greedy = break_cycles(data, greedy_dag(data, costs), costs, roots)
    choice, report = ilp_choice(data, costs, roots, greedy, time_limit_s)
    plan = build_plan(data, choice, costs, encoding, graph, model)
    plan.stats = replace(plan.stats, ilp=report.to_record())
    return plan, report
