"""Dtypes in the verifier: right-hand sides type-checked against ONNX's type constraints for every dtype the
left-hand side accepts (verify/_types.py), integer tensors checked with integer semantics, and the encoder
keeping nodes of dtypes the verifier never considered opaque.

The type check is pure Python (no z3): these tests cost well under a second, except the two integer proofs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from unity_eq.egraph.typed_nodes import typed_values, used_outputs
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ops.dtypes import node_types_allowed, op_types
from unity_eq.ops.registry import OPS, spec_for
from unity_eq.rulefile.terms import Rule
from unity_eq.verify._tensor import NumpyIntegerBackend, Z3IntegerBackend
from unity_eq.verify._types import check_types, integer_assignments
from unity_eq.verify._verify import Options, load_program, verify_program


def _rules(tmp_path: Path, text: str) -> tuple[object, dict[str, Rule]]:
    path = tmp_path / "r.egg"
    path.write_text(text)
    program, _files = load_program([path])
    assert program.errors == []
    return program, {r.name: r for r in program.rules if r.file.endswith("r.egg")}


def test_every_typed_op_has_type_constraints() -> None:
    """An op without an entry would let any operand through the right-hand side check: every built-in has one
    (a plug-in family without a ``types`` hook takes every dtype, as SpaceToDepth does)."""
    missing = [op for op in OPS if op_types(op) is None]
    assert missing == ["SpaceToDepth"]
    for op in OPS:
        types = op_types(op)
        if types is not None:
            spec = OPS[op]
            tensor_args = {a.name for a in spec.args if a.sort in ("T", "TList")}
            assert set(types.inputs) == tensor_args, op


def test_ill_typed_right_hand_sides_are_named_with_the_dtype(tmp_path: Path) -> None:
    _program, rules = _rules(
        tmp_path,
        """
(rewrite (Where (Less a b) x (Sub x x)) (Mul (Less a b) x) :name "bool-times-float")
(rewrite (Gather x i k) (Gather (Add x (Sub i i)) i k) :name "index-into-data")
(rewrite (Identity a) (Relu a) :name "relu-on-ints")
(rewrite (Identity a) (Cast a 1 1) :name "cast-changes-dtype")
(rewrite (Add a b) (Add b a) :name "add-commutes")
(rewrite (Gather x i k) (Gather (Identity x) i k) :name "gather-identity")
""",
    )
    bool_float = check_types(rules["bool-times-float"]).problem
    assert "Mul does not take bool" in bool_float and "x: float32" in bool_float
    assert "share one dtype, here float32 and int64" in check_types(rules["index-into-data"]).problem
    assert "Relu does not take int64" in check_types(rules["relu-on-ints"]).problem
    cast = check_types(rules["cast-changes-dtype"]).problem
    assert "left-hand side is int64 and the right-hand side float32" in cast
    assert check_types(rules["add-commutes"]).problem == ""
    assert check_types(rules["gather-identity"]).problem == ""


def test_a_value_sound_ill_typed_rule_is_refuted_by_verify(tmp_path: Path) -> None:
    """Where(Less(a, b), x, 0) = Mul(Less(a, b), x) holds over the reals (a comparison is 1 or 0), so the value
    proofs prove it; onnxruntime refuses Mul of a bool and a float. The report names the dtypes."""
    program, rules = _rules(tmp_path, '(rewrite (Where (Less a b) x (Sub x x)) (Mul (Less a b) x) :name "w")\n')
    (report,) = verify_program(program, [rules["w"]], Options(jobs=1))
    assert report.status == "refuted" and report.kind == "types", report.message
    cex = report.counterexample
    assert cex is not None and cex.kind == "type" and "bool" in cex.message and "x: float32" in cex.case


def test_every_shipped_rule_is_well_typed() -> None:
    program, _files = load_program(None)
    bad = []
    for rule in program.rules:
        for r in [rule, rule.reversed()] if rule.bidirectional else [rule]:
            problem = check_types(r).problem
            if problem:
                bad.append(f"{r.name}: {problem}")
    assert not bad, bad


def test_integer_assignments_follow_the_types_and_the_float_guard(tmp_path: Path) -> None:
    _program, rules = _rules(
        tmp_path,
        """
(rewrite (Div a b) (Div a (Identity b)) :name "div")
(rewrite (Div a b) (Div a (Identity b)) :when ((float-dtype (dtype a))) :name "div-float")
(rewrite (Relu a) (Relu (Identity a)) :name "relu")
(rewrite (Add a b) (Add b a) :name "add")
""",
    )
    assert integer_assignments(rules["div"], check_types(rules["div"])) == [{"a": "int64", "b": "int64"}]
    assert integer_assignments(rules["div-float"], check_types(rules["div-float"])) == []
    assert integer_assignments(rules["relu"], check_types(rules["relu"])) == []  # Relu takes floats only
    assert integer_assignments(rules["add"], check_types(rules["add"])) == []  # exact on integers: nothing to redo


def test_the_old_mean_of_means_rule_is_refuted_on_int64_and_the_shipped_one_proven(tmp_path: Path) -> None:
    """The text of reduce-mean-split-reduced before its float guard: proven over the reals, refuted with an
    int64 counterexample; the shipped rule (with `(float-dtype (dtype a))`) has no integer case left."""
    program, rules = _rules(
        tmp_path,
        """
(rewrite (ReduceMean a axes k nop)
         (ReduceMean (Combine (ReduceMean (Partition a d ax) (vec-of j) 1 nop) d ax) axes k nop)
         :when ((can-split a d ax) (vec-contains axes d) (dim-range j) (!= j d) (vec-contains axes j)
                (= s (shape a)) (> (vec-get s j) 1) (= r (vec-length s)) (reduce-map (vec-of j) 1 r d d))
         :name "old")
""",
    )
    options = Options(jobs=1, generic=False, numeric=False)
    (old,) = verify_program(program, [rules["old"]], options)
    assert old.status == "refuted", old.message
    assert "int64" in old.message and old.counterexample is not None and "a: int64" in old.counterexample.case
    shipped = next(r for r in program.rules if r.name == "reduce-mean-split-reduced")
    assert integer_assignments(shipped, check_types(shipped)) == []


def test_integer_division_truncates_as_onnxruntime_does() -> None:
    a = np.array([-7, 7, -7, 7, 5, -1], dtype=np.int64)
    b = np.array([2, -2, -2, 2, 3, 2], dtype=np.int64)
    nodes = [helper.make_node("Div", ["a", "b"], ["o"])]
    graph = helper.make_graph(
        nodes,
        "div",
        [helper.make_tensor_value_info(n, TensorProto.INT64, [6]) for n in ("a", "b")],
        [helper.make_tensor_value_info("o", TensorProto.INT64, [6])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "b": b}
    )
    got = NumpyIntegerBackend().div(a.astype(float), b.astype(float))
    assert np.array_equal(got, want)
    import z3

    terms = Z3IntegerBackend().div(np.array([z3.RealVal(int(v)) for v in a], dtype=object), b.astype(object))
    assert [z3.simplify(t).as_long() for t in terms] == want.tolist()


def _one_node(tmp_path: Path, op: str, dtypes: list[int], out: int, **attrs: object) -> bool:
    """Whether the encoder types a one-node model with inputs of these ONNX dtypes."""
    names = [f"in{i}" for i in range(len(dtypes))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["o"], name="n", **attrs)],
        "g",
        [helper.make_tensor_value_info(n, d, [2, 2]) for n, d in zip(names, dtypes, strict=True)],
        [helper.make_tensor_value_info("o", out, [2, 2])],
    )
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    g = load_onnx(path)
    (node,) = g.nodes
    spec = spec_for(node.op_type)
    assert spec is not None
    return typed_values(node, g, spec, used_outputs(g)) is not None


@pytest.mark.parametrize(
    ("op", "dtypes", "out", "typed"),
    [
        ("Gemm", [TensorProto.FLOAT] * 2, TensorProto.FLOAT, True),
        ("Gemm", [TensorProto.INT64] * 2, TensorProto.INT64, False),  # no integer Gemm in onnxruntime
        ("MatMul", [TensorProto.INT64] * 2, TensorProto.INT64, True),
        ("Relu", [TensorProto.INT32], TensorProto.INT32, False),
        ("Add", [TensorProto.BOOL] * 2, TensorProto.BOOL, False),
        ("Equal", [TensorProto.BOOL] * 2, TensorProto.BOOL, True),
        ("Equal", [TensorProto.STRING] * 2, TensorProto.BOOL, False),
    ],
)
def test_the_encoder_types_only_dtypes_the_verifier_considered(
    tmp_path: Path, op: str, dtypes: list[int], out: int, typed: bool
) -> None:
    assert _one_node(tmp_path, op, dtypes, out) is typed


def test_node_types_allowed_needs_shared_dtypes() -> None:
    assert node_types_allowed("Add", {"A": "float32", "B": "float32"})
    assert not node_types_allowed("Add", {"A": "float32", "B": "float16"})
    assert node_types_allowed("Gather", {"data": "float32", "indices": "int64"})
    assert not node_types_allowed("Gather", {"data": "float32", "indices": "float32"})
