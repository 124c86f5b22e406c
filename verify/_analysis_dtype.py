"""Dtype facts of analysis declarations, checked against ONNX's type constraints (issue 21).

Rules guard on dtypes (``(float-dtype (dtype a))`` keeps a rule off integer tensors, whose division
truncates), and the engine takes an op's dtype from whatever ``(rule ...)`` sets it: ``(function dtype ...
:merge old)`` keeps the first value set. A user's declaration ``(set (dtype e) t)`` with ``t`` the dtype of
the wrong operand (a Where's condition: bool) or a literal dtype would make dtype-guarded rewrites fire on
the wrong tensors while ``verify`` passed. So each dtype a declaration sets is checked, without cases (types
are structural), against :func:`unity_eq.ops.dtypes.op_types`:

* on a regular op's output ``e`` (the query's root ``(= e (Op ...))``): the dtype of an operand that shares
  the output's type variable (``(= t (dtype a))`` in the query), or the fixed dtype the op's output has
  (``"bool"`` for a comparison);
* on an operand: the output's dtype, or another operand's, of the same type variable (an optional operand,
  which may be ``NoneT`` of dtype ``"none"``, neither gives nor takes one);
* a parallel op (Partition, Combine, Replicate, Reduce) moves values: its input and output share a dtype
  either way; ``NoneT``'s dtype is ``"none"``.

An op of a plug-in family without a type table has its first operand's dtype (as the verifier assumes
everywhere). Anything else is refuted when the types say it is wrong, and left *unknown* (which fails) when
they cannot tell (Cast's ``to``, a dtype bound another way).
"""

from __future__ import annotations

from dataclasses import dataclass

from unity_eq.ops.dtypes import op_types
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import AnalysisDecl, App, Lit, Term, Var
from unity_eq.verify._analysis_query import is_root
from unity_eq.verify._fingerprint import list_items
from unity_eq.verify._semantics import PARALLEL

__all__ = ["DtypeProblem", "dtype_claims", "dtype_problem"]


@dataclass(frozen=True)
class DtypeProblem:
    status: str  # refuted | unknown
    message: str


def dtype_claims(decl: AnalysisDecl) -> list[App]:
    """The ``(set (dtype x) t)`` actions of ``decl``, as the facts they claim, ``(= (dtype x) t)``."""
    return [
        App("=", (a.args[0], a.args[1]))
        for a in decl.actions
        if isinstance(a, App)
        and a.head == "set"
        and len(a.args) == 2
        and isinstance(a.args[0], App)
        and a.args[0].head == "dtype"
    ]


def dtype_problem(decl: AnalysisDecl) -> DtypeProblem | None:
    """The first dtype ``decl`` sets that ONNX's types do not give (or that they cannot tell), or None."""
    claims = dtype_claims(decl)
    if not claims:
        return None
    root = next((f for f in decl.query if is_root(f)), None)
    sources = _dtype_sources(decl)
    for claim in claims:
        target, value = claim.args[0].args[0], claim.args[1]
        why = _check(root, target, value, sources)
        if why is not None:
            return why
    return None


def _dtype_sources(decl: AnalysisDecl) -> dict[str, Term]:
    """``t -> x`` for every ``(= t (dtype x))`` (or ``(= (dtype x) t)``) of the query."""
    out: dict[str, Term] = {}
    for fact in decl.query:
        if not (isinstance(fact, App) and fact.head == "=" and len(fact.args) == 2):
            continue
        for var, other in (fact.args, fact.args[::-1]):
            if isinstance(var, Var) and isinstance(other, App) and other.head == "dtype" and other.args:
                out[var.name] = other.args[0]
    return out


def _check(root: Term | None, target: Term, value: Term, sources: dict[str, Term]) -> DtypeProblem | None:
    shown = f"(set (dtype {target}) {value})"
    if not isinstance(root, App):
        return DtypeProblem("unknown", f"{shown}: the query has no root `(= e (Op ...))`, so its types are unknown")
    e, pattern = root.args
    assert isinstance(e, Var) and isinstance(pattern, App)
    source = sources.get(value.name) if isinstance(value, Var) else None
    literal = value.value if isinstance(value, Lit) and isinstance(value.value, str) else None
    if pattern.head == "NoneT":
        ok = target == e and literal == "none"
        return None if ok else DtypeProblem("refuted", f'{shown}: an absent tensor\'s dtype is "none"')
    if pattern.head in PARALLEL:
        ends = {e, pattern.args[0]}
        if target in ends and source in ends and source != target:
            return None
        return DtypeProblem(
            "refuted" if literal is not None or source is not None else "unknown",
            f"{shown}: a {pattern.head} moves values, so its input and output share one dtype; set one from the other",
        )
    if pattern.head not in OPS:
        return DtypeProblem("unknown", f"{shown}: `{pattern.head}` has no type constraints to check it against")
    return _check_op(pattern, e, target, source, literal, shown)


def _type_vars(pattern: App) -> dict[Term, str]:
    """Each operand of ``pattern`` (list elements too) with its type variable. An op of a plug-in family that
    states no types has its first operand's dtype, as everywhere in the verifier (``op_types``)."""
    types = op_types(pattern.head)
    spec = OPS[pattern.head]
    out: dict[Term, str] = {}
    for n, i in enumerate(spec.tensor_args):
        if i >= len(pattern.args) or spec.args[i].optional:
            continue  # an optional operand may be NoneT, whose dtype is "none" (Gemm's C, a Clip bound)
        var = "T" if types is None and n == 0 else types.inputs.get(spec.args[i].name) if types else None
        if var is None:
            continue
        arg = pattern.args[i]
        items = list_items(arg) if spec.args[i].sort == "TList" else [arg]
        for item in items:
            out.setdefault(item, var)
    return out


def _check_op(
    pattern: App, e: Var, target: Term, source: Term | None, literal: str | None, shown: str
) -> DtypeProblem | None:
    types = op_types(pattern.head)
    operands = _type_vars(pattern)
    output = types.output if types is not None else "T"
    if output == "=to":
        return DtypeProblem("unknown", f"{shown}: a Cast's dtype is its `to`, which the checker does not read")

    def var_of(term: Term | None) -> str | None:
        return output if term == e else operands.get(term) if term is not None else None

    want = var_of(target)
    if want is None:
        return DtypeProblem("unknown", f"{shown}: {target} is neither the query's {pattern.head} nor an operand of it")
    if want.startswith("="):  # a fixed dtype (a comparison's bool)
        if literal == want[1:]:
            return None
        return DtypeProblem(
            "refuted", f"{shown}: {pattern.head}'s output is always \"{want[1:]}\" (ONNX's type constraints)"
        )
    if literal is not None:
        allowed = types.allowed.get(want, frozenset()) if types is not None else frozenset()
        if allowed == {literal}:
            return None
        return DtypeProblem(
            "refuted",
            f"{shown}: {target} may be any of {', '.join(sorted(allowed))} for {pattern.head}; set it from an "
            "operand of the same type instead",
        )
    got = var_of(source)
    if source is None or got is None:
        return DtypeProblem("unknown", f"{shown}: its value is not the dtype of the {pattern.head} or an operand")
    if got == want:  # (the target itself: a no-op)
        return None
    return DtypeProblem(
        "refuted",
        f"{shown}: {pattern.head}'s type constraints do not make {target} the dtype of {source} (type variables "
        f"{want} and {got}, unity_eq/ops/dtypes.py): a rewrite guarded by a dtype would fire on the wrong "
        "tensors. Set it from an operand of the output's type",
    )
