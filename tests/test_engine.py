"""The encoder, the rule files, the saturation engine and its limits, on real egglog runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from unity_eq import ops
from unity_eq.egraph import (
    Limits,
    StopReason,
    encode,
    parse_serialized,
    saturate,
)
from unity_eq.errors import RuleError, SaturationError
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Graph, Mesh, Node, TensorType
from unity_eq.ops.reduce import reduce_pairs
from unity_eq.ops.reshape import reshape_pairs
from unity_eq.rulefile.manifest import DEFAULT_RULE_FILES, load_rule_files, rules_dir


def _mlp_graph(batch: int = 8, hidden: int = 64, ffn: int = 256) -> Graph:
    t = lambda *s: TensorType(tuple(s), "float32")  # noqa: E731
    return Graph(
        "mlp",
        {"X": t(batch, hidden)},
        ["Y"],
        [
            Node("mm1", "MatMul", ("X", "W1"), ("h",)),
            Node("relu", "Relu", ("h",), ("r",)),
            Node("mm2", "MatMul", ("r", "W2"), ("Y",)),
        ],
        {"W1": np.zeros((hidden, ffn), np.float32), "W2": np.zeros((ffn, hidden), np.float32)},
        {
            "X": t(batch, hidden),
            "W1": t(hidden, ffn),
            "W2": t(ffn, hidden),
            "h": t(batch, ffn),
            "r": t(batch, ffn),
            "Y": t(batch, hidden),
        },
        18,
    )


def test_generated_rule_files_are_current() -> None:
    assert ops.main(["--check"]) == 0, "run `python -m unity_eq.ops`"


def test_manifest_files_exist() -> None:
    for name in DEFAULT_RULE_FILES:
        assert (rules_dir() / name).is_file(), name


def test_every_op_spec_is_in_the_schema() -> None:
    schema = (rules_dir() / "schema.egg").read_text()
    for name in ops.OPS:
        assert f"({name} " in schema


def test_encoding_names_every_tensor_once() -> None:
    graph = _mlp_graph()
    enc = encode(graph, Mesh(("x",), (4,)))
    assert enc.tensor_ids.keys() == {"X", "W1", "W2", "h", "r", "Y"}
    assert "(union (Tensor 2) (MatMul (Tensor 0) (Tensor 1)))" in enc.program
    assert '(mesh-axis "x" 4)' in enc.program and enc.opaque_count == 0


def test_unknown_op_is_carried_opaquely(examples: Path) -> None:
    graph = _mlp_graph()
    graph.nodes[1] = Node("relu", "Celu2", ("h",), ("r",), {"alpha": 1.0}, domain="com.example")
    enc = encode(graph, Mesh(("x",), (2,)))
    assert enc.opaque_count == 1 and '(Opaque "Celu2" "relu"' in enc.program


def test_saturation_finds_megatron_and_keeps_one_placement_per_class() -> None:
    graph = _mlp_graph()
    mesh = Mesh(("x", "y"), (2, 2))
    result = saturate(load_rule_files(), encode(graph, mesh), Limits())
    assert result.stop_reason is StopReason.SATURATED
    data = parse_serialized(result.serialized)
    assert data.conflicts() == []
    ops_found = {n.op for c in data.classes.values() for n in c.nodes}
    assert {"Partition", "Combine", "Replicate", "Reduce"} <= ops_found
    for cls in data.classes.values():
        if cls.sort == "T" and cls.shape is not None:
            assert set(cls.placement) == {"x", "y"}, cls


def test_limits_stop_saturation_with_a_reason() -> None:
    enc = encode(_mlp_graph(), Mesh(("x",), (4,)))
    assert saturate(load_rule_files(), enc, Limits(max_iterations=1)).stop_reason is StopReason.ITERATION_LIMIT
    assert saturate(load_rule_files(), enc, Limits(max_nodes=5)).stop_reason is StopReason.NODE_LIMIT


def test_progress_is_reported() -> None:
    seen = []
    saturate(load_rule_files(), encode(_mlp_graph(), Mesh(("x",), (2,))), progress=lambda *a: seen.append(a))
    assert seen[0][0] == "analysis" and any(phase == "parallel" for phase, *_ in seen)


def test_engine_crash_is_a_clean_error() -> None:
    enc = encode(_mlp_graph(), Mesh(("x",), (2,)))
    with pytest.raises(SaturationError, match="memory limit"):
        saturate(load_rule_files(), enc, Limits(memory_limit_gib=0.05))


def test_broken_rule_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.egg"
    bad.write_text("(rewrite (MatMul a b) (NoSuchOp a b) :ruleset parallel)\n")
    enc = encode(_mlp_graph(), Mesh(("x",), (2,)))
    with pytest.raises(RuleError, match=r"bad\.egg"):
        saturate(load_rule_files([bad]), enc)


def test_missing_rule_file(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="not found"):
        load_rule_files([tmp_path / "nope.egg"])


@pytest.mark.parametrize(
    ("src", "dst", "pairs"),
    [
        ((8, 128, 256), (8, 128, 8, 32), [(0, 0), (1, 1), (2, 2)]),
        ((8, 128, 8, 32), (8, 128, 256), [(0, 0), (1, 1), (2, 2)]),
        ((4, 6), (2, 12), [(0, 0)]),
        ((1, 4, 8), (4, 1, 8), [(1, 0), (2, 2)]),
    ],
)
def test_reshape_pairs(src: tuple[int, ...], dst: tuple[int, ...], pairs: list[tuple[int, int]]) -> None:
    assert list(reshape_pairs(src, dst)) == pairs


def test_reduce_pairs() -> None:
    assert list(reduce_pairs((1,), 0, 3)) == [(0, 0), (2, 1)]
    assert list(reduce_pairs((1,), 1, 3)) == [(0, 0), (2, 2)]


def test_transformer_encodes_every_node_typed(examples: Path) -> None:
    graph = load_onnx(examples / "transformer.onnx")
    enc = encode(graph, Mesh(("x",), (4,)))
    assert enc.opaque_count == 0 and enc.typed_nodes == len(graph.nodes)


def test_break_cycles_rechooses_a_class_on_a_cycle() -> None:
    """A cyclic choice (x = Partition(Combine(x))-style) is repaired with the cheapest acyclic alternative."""
    from unity_eq.cost import Cost
    from unity_eq.egraph import ClassRef, EClass, EGraphData, ENode
    from unity_eq.extract.greedy import break_cycles

    a_leaf = ENode("a1", "Input", "A", ("x",))
    a_loop = ENode("a2", "Relu", "A", (ClassRef("B"),))
    b_loop = ENode("b1", "Relu", "B", (ClassRef("A"),))
    classes = {
        "A": EClass("A", "T", [a_leaf, a_loop], (2,), "float32", {"x": ["R"]}),
        "B": EClass("B", "T", [b_loop], (2,), "float32", {"x": ["R"]}),
    }
    data = EGraphData(classes, {0: "A"})
    costs = {"a1": Cost(5.0), "a2": Cost(1.0), "b1": Cost(1.0)}
    fixed = break_cycles(data, {"A": a_loop, "B": b_loop}, costs, ["B"])
    assert fixed["A"] is a_leaf and fixed["B"] is b_loop


def _flops_here(op: str, in_shapes: object, out_shape: object) -> float:
    return 1.0


def test_a_family_takes_its_own_functions_as_hooks() -> None:
    """``OpFamily.hooks_in``: a module's functions named after hook fields, never a function it imported from
    elsewhere (an imported ``evaluate`` would silently be the wrong semantics) nor a value that is no function."""
    import math

    from unity_eq.ops.family import OpFamily

    namespace = {"__name__": __name__, "flops": _flops_here, "evaluate": math.prod, "saved": 3, "helper": _flops_here}
    assert OpFamily.hooks_in(namespace) == {"flops": _flops_here}


def test_a_family_with_an_axioms_module_passes_its_axioms() -> None:
    """A family whose axioms live in ``ops/<family>_axioms.py`` imports them, and ``hooks_in`` does not take
    an imported function: the family must pass them by keyword. When reshape.py's axioms moved out and the
    keyword was missing, its six split rules lost their generic proofs (only CI's shipped-rule proofs saw it)."""
    import importlib

    from unity_eq.ops.registry import FAMILIES

    root = Path(__file__).resolve().parents[1] / "unity_eq" / "ops"
    modules = sorted(p.stem for p in root.glob("*_axioms.py"))
    assert modules, "no ops/*_axioms.py found (the check would say nothing)"
    by_module = {f.axioms.__module__: f for f in FAMILIES if f.axioms is not None}
    for stem in modules:
        axioms = importlib.import_module(f"unity_eq.ops.{stem}").axioms
        family = by_module.get(f"unity_eq.ops.{stem}")
        assert family is not None and family.axioms is axioms, f"no family passes unity_eq.ops.{stem}.axioms"


def test_every_op_belongs_to_one_family_whose_rules_ship() -> None:
    """The registry is the one place a family is declared: every typed op has a family holding its spec, every
    family's rule file is loaded by `optimize` and proven by `verify`, and says its proof ranges in words."""
    from unity_eq.ops.registry import FAMILIES, OPS, family_for
    from unity_eq.rulefile.manifest import CORE_RULE_FILES

    for name, spec in OPS.items():
        family = family_for(name)
        assert family is not None and spec in family.specs, name
    assert sum(len(family.specs) for family in FAMILIES) == len(OPS)
    for family in FAMILIES:
        assert family.rule_file in CORE_RULE_FILES, family.name
        assert family.ranges, f"{family.name}: say its proof ranges in words (docs/verify.md)"


def _one_node_graph(op: str, x: tuple[int, ...], out: tuple[int, ...], axes: list[int], **attrs: object) -> Graph:
    t = lambda *s: TensorType(tuple(s), "float32")  # noqa: E731
    return Graph(
        op.lower(),
        {"X": t(*x)},
        ["Y"],
        [Node("n", op, ("X", "axes"), ("Y",), dict(attrs))],
        {"axes": np.asarray(axes, np.int64)},
        {"X": t(*x), "axes": TensorType((len(axes),), "int64"), "Y": t(*out)},
        18,
    )


@pytest.mark.parametrize(
    ("op", "x", "out", "axes", "attrs"),
    [
        ("ReduceSum", (2, 2, 4), (2, 4), [0, -3], {"keepdims": 0}),  # onnxruntime removes dim 0 once
        ("ReduceMax", (2, 3), (2, 1), [1, -1], {"keepdims": 1}),
        ("Squeeze", (2, 3, 1), (2, 3), [2, -1], {}),
        ("Unsqueeze", (2, 3), (2, 3, 1, 1), [2, -1], {}),  # distinct at the output's rank: typed
    ],
)  # fmt: skip
def test_a_node_naming_one_dim_twice_in_its_axes_stays_opaque(
    op: str, x: tuple[int, ...], out: tuple[int, ...], axes: list[int], attrs: dict[str, object]
) -> None:
    """ONNX leaves a repeated axis undefined and onnxruntime counts it once, while the rules' analyses
    (``reduce-map``) and the verifier take each axis as its own dim: the shipped ``reduce-sum-split`` fired on
    ``ReduceSum(x, (0, -3))`` at rank 3 and combined the wrong dim (issue 21, sixth adversary). Such a node is
    carried opaquely; Unsqueeze's (2, -1) names two dims of its rank-4 output and is typed."""
    enc = encode(_one_node_graph(op, x, out, axes, **attrs), Mesh(("x",), (2,)))
    assert enc.opaque_count == (0 if op == "Unsqueeze" else 1), enc.program


def test_a_node_with_an_empty_tensor_stays_opaque() -> None:
    """A tensor with a dim of 0 (an empty KV cache) as an operand is outside every rule's proof (no verifier
    instance has one; ``ReduceSum(x, [d]) = x`` for dim d <= 1 was proven and is wrong at 0): the nodes reading
    it stay opaque, the others are typed."""
    graph = _mlp_graph(batch=0)
    enc = encode(graph, Mesh(("x",), (2,)))
    assert enc.opaque_count == 3, enc.program
    assert encode(_mlp_graph(batch=1), Mesh(("x",), (2,))).opaque_count == 0
