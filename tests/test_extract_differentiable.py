"""Differentiable extraction: finds the optimum where greedy misses it, never breaks acyclicity, memory or
placement rules, never returns a plan worse than greedy's, and is deterministic for a seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_extract_ilp import _graph, brute_force

from unity_eq import check
from unity_eq.cost import Cost, CostModel
from unity_eq.egraph import ClassRef, EClass, EGraphData, ENode, encode, parse_serialized, saturate
from unity_eq.extract import Extractor, Restriction, node_costs, output_classes
from unity_eq.extract.chooser import GreedyChooser, IlpChooser
from unity_eq.extract.differentiable import DifferentiableChooser
from unity_eq.extract.greedy import dag_cost, find_cycle
from unity_eq.ir import Mesh
from unity_eq.machine import default_machine
from unity_eq.memory import plan_memory
from unity_eq.rulefile.manifest import load_rule_files


def _egraph(classes: dict[str, list[tuple[str, float, tuple[str, ...]]]]) -> tuple[EGraphData, dict[str, float]]:
    """A hand-made e-graph: class → its nodes as (op, cost, children); and the nodes' costs by id."""
    data = EGraphData({}, {})
    totals: dict[str, float] = {}
    for cid, nodes in classes.items():
        cls = data.classes[cid] = EClass(cid, "T", shape=(4,), dtype="float32")
        for i, (op, cost, children) in enumerate(nodes):
            node = ENode(f"{cid}.{i}", op, cid, tuple(ClassRef(c) for c in children))
            cls.nodes.append(node)
            totals[node.id] = cost
    return data, totals


def _sharing() -> tuple[EGraphData, dict[str, float]]:
    """R needs A and B. Alone, A and B are cheapest through their own inputs X and Y (1 + 5 each); together
    they are cheaper through one shared Z (1 + 1 + 8 = 10 < 12), which greedy, pricing a class at a time, misses."""
    return _egraph(
        {
            "R": [("f", 1.0, ("A", "B"))],
            "A": [("g", 1.0, ("X",)), ("h", 1.0, ("Z",))],
            "B": [("k", 1.0, ("Y",)), ("m", 1.0, ("Z",))],
            "X": [("x", 5.0, ())],
            "Y": [("y", 5.0, ())],
            "Z": [("z", 8.0, ())],
        }
    )


def _choose(data: EGraphData, totals: dict[str, float], chooser: DifferentiableChooser) -> tuple[float, float, dict]:
    greedy = GreedyChooser().choose(data, totals, ["R"], None).choice
    found = chooser.choose(data, totals, ["R"], greedy)
    return dag_cost(greedy, ["R"], totals), dag_cost(found.choice, ["R"], totals), found.choice


def test_finds_the_shared_subterm_greedy_misses() -> None:
    data, totals = _sharing()
    greedy, relaxed, choice = _choose(data, totals, DifferentiableChooser(seed=0))
    costs = {k: Cost(compute=v) for k, v in totals.items()}
    assert greedy == 13.0 and brute_force(data, costs, ["R"]) == 11.0
    assert relaxed == 11.0 and choice["A"].op == "h" and choice["B"].op == "m"


def test_memory_budget_is_respected() -> None:
    """Z is cheaper but holds more bytes: with a budget below its plan's, greedy's plan comes back."""
    data, totals = _sharing()
    memory = {n.id: (100.0 if n.op == "z" else 1.0) for c in data.classes.values() for n in c.nodes}
    chooser = DifferentiableChooser(seed=0, memory=memory, budget=50.0)
    greedy, relaxed, choice = _choose(data, totals, chooser)
    assert relaxed == greedy == 13.0 and "Z" not in {c for n in choice.values() for c in n.children}
    report = chooser.reports[-1]
    assert not report.kept and report.relaxed_best >= greedy  # no fitting rounded plan beat greedy


def test_cycles_are_never_chosen() -> None:
    """X = p(Y), Y = c(X) (a Partition/Combine loop) looks almost free to a relaxation that does not cut it."""
    data, totals = _egraph(
        {
            "R": [("f", 1.0, ("X", "Y"))],
            "X": [("op", 10.0, ("L",)), ("p", 1.0, ("Y",))],
            "Y": [("op2", 10.0, ("L",)), ("c", 1.0, ("X",))],
            "L": [("leaf", 0.0, ())],
        }
    )
    _, relaxed, choice = _choose(data, totals, DifferentiableChooser(seed=0))
    assert find_cycle(choice, ["R"]) is None
    assert relaxed == brute_force(data, {k: Cost(compute=v) for k, v in totals.items()}, ["R"]) == 12.0


@pytest.mark.parametrize(("ops", "objective", "devices"), [(["MatMul", "Relu"], "training", 2)])
def test_reaches_the_proven_optimum(ops: list[str], objective: str, devices: int) -> None:
    """On real saturated e-graphs where the ILP proves optimality, the differentiable extractor's plan costs the
    same (and the brute-force minimum agrees)."""
    graph = _graph(ops)
    mesh = Mesh(("x",), (devices,))
    encoding = encode(graph, mesh)
    data = parse_serialized(saturate(load_rule_files(), encoding).serialized)
    model = CostModel(default_machine(devices), mesh, objective)
    extractor = Extractor(data, encoding, graph, model)
    totals = extractor.totals(Restriction())
    roots = output_classes(data, encoding, graph)
    greedy = GreedyChooser().choose(data, totals, roots, None).choice
    exact = IlpChooser(30).choose(data, totals, roots, greedy)
    assert exact.reports[0].optimal
    found = DifferentiableChooser(seed=0).choose(data, totals, roots, greedy)
    assert dag_cost(found.choice, roots, totals) == pytest.approx(exact.reports[0].objective, rel=1e-9)
    assert dag_cost(found.choice, roots, totals) == pytest.approx(brute_force(data, node_costs(data, model), roots))


@pytest.fixture(scope="module")
def transformer(examples: Path) -> Extractor:
    from unity_eq.frontends.onnx import load_onnx

    graph = load_onnx(examples / "transformer.onnx")
    mesh = Mesh(("x", "y"), (2, 2))
    encoding = encode(graph, mesh)
    data = parse_serialized(saturate(load_rule_files(), encoding).serialized)
    return Extractor(data, encoding, graph, CostModel(default_machine(4), mesh, "training"))


def test_deterministic_per_seed_and_never_worse_than_greedy(transformer: Extractor) -> None:
    totals = transformer.totals(Restriction())
    roots = transformer.roots
    greedy = GreedyChooser().choose(transformer.data, totals, roots, None).choice
    runs = [
        DifferentiableChooser(seed=s, starts=8, steps=30).choose(transformer.data, totals, roots, greedy)
        for s in (3, 3, 4)
    ]
    first, again = ({c: n.id for c, n in run.choice.items()} for run in runs[:2])
    assert first == again and runs[0].relaxed[0].relaxed_best == runs[1].relaxed[0].relaxed_best
    for run in runs:
        assert find_cycle(run.choice, roots) is None
        assert dag_cost(run.choice, roots, totals) <= dag_cost(greedy, roots, totals) * (1 + 1e-12)


def test_extraction_plan_is_valid_and_no_worse(transformer: Extractor) -> None:
    greedy = transformer.extract(Restriction())
    relaxed = transformer.extract(Restriction(), method="differentiable")
    assert set(relaxed.stages) == {"greedy", "differentiable"} and len(relaxed.relaxed) == 1
    assert relaxed.plan.validate() == []
    assert relaxed.plan.cost.total <= greedy.plan.cost.total * (1 + 1e-12)
    assert plan_memory(relaxed.plan).fits


def test_differentiable_extractor_in_the_pipeline(
    examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end through the CLI: plan.json and the summary say who won and by how much, the plan fits and runs
    numerically right."""
    from unity_eq.cli import main as cli_main

    model, target = str(examples / "mlp.onnx"), tmp_path / "p"
    args = ["optimize", model, "--devices", "4", "--objective", "training", "--extractor", "differentiable"]
    assert cli_main([*args, "-o", str(target)]) == 0
    out = capsys.readouterr().out
    assert "extractor" in out and " kept" in out and "vs greedy" in out
    raw = json.loads((target / "plan.json").read_text())
    extraction, record = raw["extraction"], raw["extraction"]["differentiable"]
    assert extraction["winner"] in ("greedy", "differentiable") and record["programs"] == 1
    assert record["differentiable_total_s"] <= record["greedy_total_s"] * (1 + 1e-12)
    kept = record["differentiable_total_s" if extraction["winner"] == "differentiable" else "greedy_total_s"]
    assert math.isclose(raw["cost"]["total_s"], kept) and raw["memory"]["fits"]
    assert check(examples / "mlp.onnx", target).passed


def test_stage_search_pieces_get_the_differentiable_option() -> None:
    """`price_pieces(extractor="differentiable")`: every piece keeps its greedy options, and a differentiable one
    is added only when its plan is cheaper than greedy's unrestricted plan."""
    from blocks import transformer_graph

    from unity_eq.cost import TRAINING
    from unity_eq.machine import load_machine
    from unity_eq.rulefile.manifest import default_rule_files
    from unity_eq.stages import price_pieces

    def graph_at(batch: int):  # type: ignore[no-untyped-def]
        return transformer_graph("am", batch=batch, seq=16, hidden=32, ffn=64, heads=2, layers=2, dtype="float32")

    rules = load_rule_files(default_rule_files(False))
    machine = load_machine("a100x8", nodes=1)
    table = price_pieces(graph_at, [1], [2], machine, TRAINING, rules, extractor="differentiable")
    for options in table.costs(2, 1):
        names = [o.extraction for o in options]
        assert names[0] == "greedy" and len(set(names)) == len(names)
        for option in options:
            if option.extraction == "differentiable":
                assert option.plan.cost.total < options[0].plan.cost.total


def test_rounded_plans_are_priced_as_dag_cost_prices_them(transformer: Extractor) -> None:
    """The descent's rounded plans are priced all at once (relaxed_cost.exact_prices, level by level, each
    class's reach a bit mask over 64 rows: 70 rows take two words); the pick must agree with the exact one-by-one
    price (dag_cost, and the memory proxy over the chosen closure) on any choice of the cut e-graph, not only
    greedy's."""
    import numpy as np

    from unity_eq.extract.greedy import chosen_closure
    from unity_eq.extract.relax import relax
    from unity_eq.extract.relaxed_cost import exact_prices

    totals = transformer.totals(Restriction())
    roots, memory = transformer.roots, transformer.node_memory()
    greedy = GreedyChooser().choose(transformer.data, totals, roots, None).choice
    problem = relax(transformer.data, totals, roots, greedy, memory)
    rng = np.random.default_rng(0)
    first = np.searchsorted(problem.node_class, np.arange(len(problem.classes)))
    sizes = np.bincount(problem.node_class, minlength=len(problem.classes))
    choices = first + (rng.random((70, len(problem.classes))) * sizes).astype(np.int64)  # 64 rows a word
    choices[0] = np.where(problem.start >= 0, problem.start, first)  # greedy's own plan among them
    cost, mem = exact_prices(problem, choices)
    for row, c, m in zip(choices, cost, mem, strict=True):
        choice = {problem.classes[problem.node_class[i]]: problem.nodes[i] for i in row.tolist()}
        needed = chosen_closure(choice, roots)
        assert needed is not None and find_cycle(choice, roots) is None
        assert c == pytest.approx(dag_cost(choice, roots, totals), rel=1e-9)
        assert m == pytest.approx(math.fsum(memory.get(choice[k].id, 0.0) for k in needed), rel=1e-9)
    assert cost[0] == pytest.approx(dag_cost(greedy, roots, totals), rel=1e-9)


def test_steps_follow_greedys_cost_and_a_kept_start_keeps_its_plan(transformer: Extractor) -> None:
    """The descent's length is a count from the e-graph's size (the same for every run: no clock), between
    min_steps and steps; when the search keeps greedy's choice the extraction reuses greedy's plan."""
    from unity_eq.extract.relax import relax

    totals = transformer.totals(Restriction())
    greedy = GreedyChooser().choose(transformer.data, totals, transformer.roots, None).choice
    problem = relax(transformer.data, totals, transformer.roots, greedy)
    cheap, dear = DifferentiableChooser(effort=0.01), DifferentiableChooser(effort=1000.0)
    assert cheap.steps_for(problem) == DifferentiableChooser(effort=0.0).steps_for(problem) >= 1  # floor_s
    assert dear.steps_for(problem) == dear.steps
    assert DifferentiableChooser(effort=None, steps=7).steps_for(problem) == 7
    middle = DifferentiableChooser(effort=3.0).steps_for(problem)
    assert DifferentiableChooser(effort=1.0).steps_for(problem) <= middle
    extraction = transformer.extract(Restriction(), method="differentiable")
    same = extraction.stages["differentiable"] is extraction.stages["greedy"]
    assert same != extraction.relaxed[0].kept and extraction.stages["differentiable"] is extraction.plan


def test_one_layout_serves_every_restriction(transformer: Extractor) -> None:
    """The e-graph's Layout is built once and shared by every differentiable search of the extractor; under
    each restriction the cut it gives keeps only allowed nodes, is acyclic (children numbered before their
    parents), keeps greedy's plan, and the multi-output groups priced from it are the ones found by a walk
    over the e-graph."""
    import numpy as np

    from unity_eq.extract.greedy import chosen_closure, multi_output_groups, priced_groups
    from unity_eq.extract.pricing import INF
    from unity_eq.extract.relax import relax

    layout = transformer.relax_layout()
    assert transformer.relax_layout() is layout
    chooser = transformer.choosers("differentiable", 1.0)[1]
    assert isinstance(chooser, DifferentiableChooser) and chooser.layout is layout
    groups = 0
    for restriction in (Restriction(), Restriction(axes=frozenset({"x"})), Restriction.data_parallel()):
        totals = transformer.totals(restriction)
        roots = transformer.roots
        greedy = GreedyChooser().choose(transformer.data, totals, roots, None).choice
        problem = relax(transformer.data, totals, roots, greedy, transformer.node_memory(), layout)
        assert all(totals[n.id] < INF for n in problem.nodes)
        assert np.all(problem.edge_child < problem.node_class[problem.edge_node])
        for cid in chosen_closure(greedy, roots) or ():
            assert problem.nodes[problem.start[problem.classes.index(cid)]].id == greedy[cid].id
        walked = multi_output_groups(transformer.data, totals)
        assert [[(c, n.id) for c, n in g] for g in priced_groups(layout.multi_output, totals)] == [
            [(c, n.id) for c, n in g] for g in walked
        ]
        groups += len(walked)
    assert groups > 0
