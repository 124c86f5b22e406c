"""Checking one case of a bounded proof: its equations evaluated symbolically and z3 asked for a counterexample.

Step 5 of :mod:`unity_eq.verify._bounded`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import z3

from unity_eq.ir import Mesh
from unity_eq.rulefile.terms import App, Rule, Term, Var
from unity_eq.verify._backends import is_z3_expr
from unity_eq.verify._bounded_cases import Case
from unity_eq.verify._guards import NONZERO
from unity_eq.verify._semantics import (
    EvalFailure,
    Placements,
    VarSpec,
    evaluate_case,
    gradient_problem,
    infer_placements,
    instantiate,
    lhs_placements,
    list_elements,
    state_str,
    tensor_nodes,
)
from unity_eq.verify._tensor import Z3Backend, same_polynomial


@dataclass
class Counterexample:
    """Why a rule fails in one case. ``kind`` is ``value`` (z3 found inputs), ``shape`` or ``placement``."""

    case: str
    kind: str
    message: str
    inputs: dict[str, Any] = field(default_factory=dict)
    lhs: Any = None
    rhs: Any = None
    check: str = ""
    got: Any = None
    want: Any = None
    functions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {}, "")}


# ----------------------------------------------------------------------------------------------------------
# Checking one case


@dataclass
class CaseOutcome:
    status: str  # proven | refuted | unknown | skipped
    counterexample: Counterexample | None = None
    reason: str = ""


def concrete_rule(rule: Rule, case: Case) -> tuple[Term, Term, list[str], dict[str, VarSpec]]:
    sorts = rule.var_sorts
    lhs = instantiate(rule.lhs, case.binding, sorts)
    rhs = instantiate(rule.rhs, case.binding, sorts)
    specs: dict[str, VarSpec] = {}
    nonzero = {g.args[0].name for g in rule.guards if isinstance(g, App) and g.head == NONZERO and g.args
               and isinstance(g.args[0], Var)}  # fmt: skip
    for name, sort in sorts.items():
        value = case.binding.get(name)
        if sort == "T" and isinstance(value, VarSpec):
            specs[name] = dataclasses.replace(value, nonzero=True) if name in nonzero else value
        elif sort == "TList" and value is not None:
            for i, spec in enumerate(value):
                specs[f"{name}#{i}"] = spec
    return lhs, rhs, list(specs), specs


def placement_problem(lhs: Term, rhs: Term, pl_lhs: Placements, pl: Placements, tensor_vars: list[str]) -> str | None:
    """A reason the rule breaks "one placement per e-class", or None."""
    rhs_nodes = tensor_nodes(rhs)
    items = list_elements(lhs)
    roots = items if items is not None else [lhs]
    must_have = [*rhs_nodes, *roots, *(Var(v) for v in tensor_vars)]
    for node in dict.fromkeys([*must_have, *tensor_nodes(lhs)]):
        if isinstance(node, App) and node.head == "NoneT":
            continue
        for axis in pl.axes:
            got = pl.get(node, axis)
            if len(got) > 1:
                where = "variable" if isinstance(node, Var) else "term"
                states = " and ".join(state_str(s) for s in sorted(got))
                return f"{where} {node} would be {states} on axis {axis}: one e-class with two placements"
            if not got and node in must_have:
                return (
                    f"term {node} has no placement on axis {axis}: no parallel op fixes it and its operands "
                    "are not all R there"
                )
    return None


@dataclass
class _Structure:
    """What a case's concrete terms imply before any shape is known: its placements, or why it is skipped
    (``skip``) or refuted (``problem``)."""

    pl: Placements | None
    skip: str = ""
    problem: str = ""
    gradients: dict[tuple[int, ...], str | None] = field(default_factory=dict)


StructureCache = dict[Any, _Structure]


def _structure(lhs: Term, rhs: Term, case: Case, tensor_vars: list[str], cache: StructureCache | None) -> _Structure:
    """Placement inference reads the concrete terms, the mesh's axis names and the ``placed`` guards, never
    the shapes or axis sizes: the thousands of cases of a rule that differ only in those share one result
    (``cache``, kept by :func:`prove_bounded`)."""
    axes = case.mesh.axes
    key = (lhs, rhs, axes, tuple(sorted(case.placed.items())), tuple(tensor_vars))
    got = cache.get(key) if cache is not None else None
    if got is not None:
        return got
    pl_lhs = lhs_placements(lhs, axes, case.placed, tensor_vars)
    if any(len(s) > 1 for s in pl_lhs.states.values()):
        got = _Structure(None, skip="the left-hand side has conflicting placements")
    else:
        pl = infer_placements(lhs, rhs, axes, case.placed, tensor_vars)
        got = _Structure(pl, problem=placement_problem(lhs, rhs, pl_lhs, pl, tensor_vars) or "")
    if cache is not None:
        cache[key] = got
    return got


def _gradient_problem(lhs: Term, rhs: Term, structure: _Structure, mesh: Mesh) -> str | None:
    """:func:`gradient_problem`, which reads the mesh only for which axes have size 1, cached per pattern."""
    assert structure.pl is not None
    trivial = tuple(i for i, n in enumerate(mesh.sizes) if n == 1)
    if trivial not in structure.gradients:
        structure.gradients[trivial] = gradient_problem(lhs, rhs, structure.pl, mesh=mesh)
    return structure.gradients[trivial]


def check_case(
    rule: Rule,
    case: Case,
    timeout_ms: int = 2000,
    structures: StructureCache | None = None,
    dtypes: dict[str, str] | None = None,
) -> CaseOutcome:
    """Prove or refute a rule in one case (see the module docstring). ``structures`` shares placement
    inference between the cases of one rule. ``dtypes``: the tensor variables' dtypes when some are integers
    (integer semantics for the ops on them); None: real tensors."""
    describe = case.describe(rule.var_sorts)
    if dtypes:
        describe += "; dtypes " + ", ".join(f"{k}: {v}" for k, v in sorted(dtypes.items()))
    lhs, rhs, tensor_vars, specs = concrete_rule(rule, case)
    structure = _structure(lhs, rhs, case, tensor_vars, structures)
    if structure.skip:
        return CaseOutcome("skipped", reason=structure.skip)
    if structure.problem:
        return CaseOutcome("refuted", Counterexample(describe, "placement", structure.problem))
    pl = structure.pl
    assert pl is not None
    bk = Z3Backend()
    attrs: dict[str, Any] = {}
    try:
        equations, values, skip = evaluate_case(
            lhs, rhs, case.mesh, pl, specs, attrs, bk, gradients=False, dtypes=dtypes
        )
    except EvalFailure as exc:
        return CaseOutcome("refuted", Counterexample(describe, exc.kind, exc.message))
    if equations is None or values is None:
        return CaseOutcome("skipped", reason=skip or "")
    outcome = _solve(equations, values, describe, timeout_ms)
    # training (Replicate = gradient all-reduce): checked after the values, whose counterexample says more
    problem = _gradient_problem(lhs, rhs, structure, case.mesh) if outcome.status != "refuted" else None
    return CaseOutcome("refuted", Counterexample(describe, "placement", problem)) if problem else outcome


def solve_equations(equations: list[Any], values: Any, describe: str, timeout_ms: int) -> CaseOutcome:
    """Prove the claims among ``equations`` (the ``assume`` ones are premises) as a case of a rule is proven:
    shortcuts first, then z3 (verify/_analysis.py checks a derived placement with it)."""
    return _solve(equations, values, describe, timeout_ms)


def _solve(equations: list[Any], values: Any, describe: str, timeout_ms: int) -> CaseOutcome:
    hard: list[tuple[Any, int, Any, Any]] = []
    premises: list[Any] = []
    for eq in equations:
        if eq.assume:
            for a, b in zip(eq.left.reshape(-1), eq.right.reshape(-1), strict=True):
                if not (is_z3_expr(a) and is_z3_expr(b) and a.ast.value == b.ast.value):
                    premises.append(_to_z3(a) == _to_z3(b))
            continue
        left, right = eq.left.reshape(-1), eq.right.reshape(-1)
        for i in range(left.size):
            a, b = left[i], right[i]
            if a is b:
                continue
            both = is_z3_expr(a) and is_z3_expr(b)
            # z3 hash-conses terms: equal terms are one AST, so comparing pointers is exact
            neither = not is_z3_expr(a) and not is_z3_expr(b)
            if (both and a.ast.value == b.ast.value) or (neither and a == b):
                continue
            hard.append((eq, i, a, b))
    remaining = []
    for eq, i, a, b in hard:
        if same_polynomial(a, b):
            continue
        cond = _to_z3(a) == _to_z3(b)
        if z3.is_true(z3.simplify(cond)):
            continue
        remaining.append((eq, i, a, b, cond))
    if not remaining:
        return CaseOutcome("proven")
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*values.assumptions, *premises)
    solver.add(z3.Or([z3.Not(c) for *_rest, c in remaining]))
    result = solver.check()
    if result == z3.unsat:
        return CaseOutcome("proven")
    if result == z3.unknown:
        return CaseOutcome("unknown", reason=f"z3: {solver.reason_unknown()} ({describe})")
    model = solver.model()
    for eq, _i, _a, _b, cond in remaining:
        if z3.is_false(model.eval(cond, model_completion=True)):
            return CaseOutcome("refuted", _counterexample(model, eq, values, describe))
    eq = remaining[0][0]  # pragma: no cover - the model falsifies one of them
    return CaseOutcome("refuted", _counterexample(model, eq, values, describe))


def _to_z3(x: Any) -> Any:
    if is_z3_expr(x):
        return x
    return z3.RealVal(float(x)) if isinstance(x, float) else z3.RealVal(int(x))


def _number(model: z3.ModelRef, x: Any) -> Any:
    if x is None:
        return None
    v = model.eval(_to_z3(x), model_completion=True) if is_z3_expr(x) or not isinstance(x, int | float) else x
    if isinstance(v, int | float):
        return v
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        f = Fraction(v.numerator_as_long(), v.denominator_as_long())
        return int(f) if f.denominator == 1 else float(f)
    if z3.is_algebraic_value(v):
        return float(v.approx(10).as_fraction())
    if z3.is_true(v):
        return 1
    if z3.is_false(v):
        return 0
    return str(v)


def _array(model: z3.ModelRef, arr: Any) -> Any:
    if arr is None:
        return None
    if isinstance(arr, list):
        return [_array(model, a) for a in arr]
    a = np.asarray(arr, dtype=object)
    flat = [_number(model, x) for x in a.reshape(-1)]
    return np.array(flat, dtype=object).reshape(a.shape).tolist()


def _counterexample(model: z3.ModelRef, eq: Any, values: Any, describe: str) -> Counterexample:
    inputs: dict[str, Any] = {}
    for name, value in values.inputs.items():
        inputs[name] = _array(model, value)
        pieces = values.pieces_of_inputs.get(name)
        if pieces is not None and any(".part" in str(x) for x in np.asarray(pieces[0], dtype=object).reshape(-1)[:1]):
            inputs[f"{name} (pieces)"] = [_array(model, p) for p in pieces]
    functions = {}
    for decl in model.decls():
        if decl.arity() > 0:
            functions[decl.name()] = _short(str(model[decl]))
    for decl in model.decls():
        if decl.arity() == 0 and "[" not in decl.name() and decl.name() not in inputs:
            inputs[decl.name()] = _number(model, decl())
    what = eq.what + (f": {eq.term}" if eq.term else "")
    return Counterexample(
        describe,
        "value",
        f"{eq.what} differs" + (f" for {eq.term}" if eq.term else ""),
        inputs,
        _array(model, values.lhs_global),
        _array(model, values.rhs_global),
        what,
        _array(model, eq.left),
        _array(model, eq.right),
        functions,
    )


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
