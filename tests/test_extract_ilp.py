"""Exact extraction: on small real e-graphs the ILP equals the brute-force optimum over all extractions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from unity_eq.cost import Cost, CostModel
from unity_eq.egraph import EGraphData, ENode, encode, parse_serialized, saturate
from unity_eq.extract import extract_greedy, node_costs, output_classes
from unity_eq.extract.greedy import find_cycle
from unity_eq.extract.ilp import extract_ilp
from unity_eq.extract.pricing import INF
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Graph, Mesh, Node, TensorType
from unity_eq.machine import default_machine
from unity_eq.rulefile.manifest import load_rule_files


def _graph(ops: list[str]) -> Graph:
    """x[8, 16] through a chain of MatMul (16x16 weights) and unary ops."""
    t = lambda *s: TensorType(tuple(s), "float32")  # noqa: E731
    types, nodes, inits, prev = {"x": t(8, 16)}, [], {}, "x"
    for i, op in enumerate(ops):
        out = f"h{i}"
        if op == "MatMul":
            inits[f"w{i}"] = np.zeros((16, 16), np.float32)
            types[f"w{i}"] = t(16, 16)
            nodes.append(Node(f"n{i}", "MatMul", (prev, f"w{i}"), (out,)))
        else:
            nodes.append(Node(f"n{i}", op, (prev,), (out,)))
        types[out] = t(8, 16)
        prev = out
    return Graph("chain", {"x": t(8, 16)}, [prev], nodes, inits, types, 18)


def brute_force(data: EGraphData, costs: dict[str, Cost], roots: list[str]) -> float:
    """The cheapest acyclic extraction, by enumerating a node for every needed class."""
    best = math.inf

    def search(choice: dict[str, ENode], needed: list[str]) -> None:
        nonlocal best
        pending = [c for c in needed if c not in choice]
        if not pending:
            if find_cycle(choice, roots) is None:
                seen, stack = set(), list(roots)
                while stack:
                    cid = stack.pop()
                    if cid not in seen:
                        seen.add(cid)
                        stack.extend(choice[cid].children)
                best = min(best, math.fsum(costs[choice[c].id].total for c in seen))
            return
        cid = pending[0]
        for node in data.classes[cid].nodes:
            if costs[node.id].total == INF:
                continue
            choice[cid] = node
            search(choice, pending[1:] + [c for c in node.children if c not in choice])
            del choice[cid]

    search({}, list(roots))
    return best


@pytest.mark.parametrize(
    ("ops", "objective", "devices"),
    [
        (["MatMul"], "training", 2),
        (["MatMul"], "inference", 4),
        (["MatMul", "Relu"], "training", 2),
        (["Relu", "MatMul"], "inference", 2),
    ],
)
def test_ilp_equals_brute_force(ops: list[str], objective: str, devices: int) -> None:
    graph = _graph(ops)
    mesh = Mesh(("x",), (devices,))
    encoding = encode(graph, mesh)
    data = parse_serialized(saturate(load_rule_files(), encoding).serialized)
    model = CostModel(default_machine(devices), mesh, objective)
    costs = node_costs(data, model)
    optimum = brute_force(data, costs, output_classes(data, encoding, graph))
    plan, report = extract_ilp(data, encoding, graph, model, time_limit_s=30)
    assert report.optimal, report
    assert plan.cost.total == pytest.approx(optimum, rel=1e-9)
    assert extract_greedy(data, encoding, graph, model).cost.total >= optimum * (1 - 1e-9)
    assert plan.validate() == []


def test_ilp_on_the_mlp_example_is_optimal_and_no_worse_than_greedy(examples: Path) -> None:
    graph = load_onnx(examples / "mlp.onnx")
    mesh = Mesh(("x",), (4,))
    encoding = encode(graph, mesh)
    data = parse_serialized(saturate(load_rule_files(), encoding).serialized)
    model = CostModel(default_machine(4), mesh, "training")
    plan, report = extract_ilp(data, encoding, graph, model, time_limit_s=30)
    assert report.optimal and plan.cost.total <= report.greedy_objective * (1 + 1e-9)
    assert report.to_record().gap == report.gap and plan.stats.ilp == report.to_record()


def test_time_limit_keeps_the_greedy_incumbent(examples: Path) -> None:
    graph = load_onnx(examples / "transformer.onnx")
    mesh = Mesh(("x",), (4,))
    encoding = encode(graph, mesh)
    data = parse_serialized(saturate(load_rule_files(), encoding).serialized)
    model = CostModel(default_machine(4), mesh, "training")
    plan, report = extract_ilp(data, encoding, graph, model, time_limit_s=2)
    assert plan.cost.total <= report.greedy_objective * (1 + 1e-9)
    assert 0.0 <= report.gap < 1.0 and report.bound <= report.objective * (1 + 1e-9)
    assert plan.validate() == []
