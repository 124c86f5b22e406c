"""Dtypes of a rule's terms: the right-hand side type-checked against ONNX's type constraints for every dtype
the left-hand side accepts, and the dtype assignments a rule must also be proven on with integer semantics.

The value proofs evaluate over the reals; the e-graph's tensors have element types, and onnxruntime refuses a
graph whose node gets an operand of a dtype it does not take (a bool operand of Mul, a float index of
Gather). :func:`check_types` unifies the type variables of every op application (``unity_eq.ops.dtypes``):

1. the left-hand side's: each pattern variable's class of dtypes is the set of dtypes some well-typed term it
   matches may have (a rule never matches an ill-typed term); dtype guards narrow it (``(float-dtype (dtype
   a))``, ``(= (dtype a) "float32")``, ``(!= t "int64")`` with ``(= t (dtype a))``); any other guard is left
   out, which only widens the sets: more is checked, never less;
2. then the right-hand side's, on the same classes, with its root unified with the left-hand side's (one
   e-class, one dtype). The rule is well-typed iff no class of the left-hand side was narrowed and no two of
   them merged (unless both are one and the same dtype), and no class of the right-hand side's own is empty.
   A failure is reported with a concrete assignment of dtypes that the left-hand side accepts and the
   right-hand side does not, checked again bottom-up (:func:`term_dtypes`).

:func:`integer_assignments` lists the dtype assignments a rule holding an integer-sensitive op (``Div``,
``ReduceMean``) must also be proven on with integer semantics: every combination of float and integer over
its classes that allow both, with at least one integer (a class that is integer only is always integer).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from unity_eq.ops.dtypes import FLOAT_DTYPES, INTEGER_DTYPES, INTEGER_SENSITIVE, is_integer, onnx_dtype_name, op_types
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var, walk
from unity_eq.verify._type_unify import PARALLEL, UNIVERSE, TypeProblem, Typer, dtype_guards, side_roots

__all__ = ["TypeCheck", "TypeProblem", "check_types", "integer_assignments", "term_dtypes"]

# ----------------------------------------------------------------------------------------------------------
# Concrete checking


def _pick(allowed: frozenset[str], avoid: str | None = None) -> str:
    """A representative dtype of a set: float32, then int64, then bool, then the first by name."""
    for want in ("float32", "int64", "bool", *sorted(allowed)):
        if want in allowed and want != avoid:
            return want
    return sorted(allowed)[0]


def term_dtypes(term: Term, var_dtypes: dict[str, str], out: dict[Term, str] | None = None) -> dict[Term, str]:
    """The dtype of every tensor term of a concrete term (list variables' elements ``l#i`` named as in
    :func:`unity_eq.verify._semantics.instantiate`, or the list variable itself), bottom-up. Raises
    :class:`TypeProblem` at the first op whose operands ONNX does not accept."""
    out = {} if out is None else out
    _dtype(term, var_dtypes, out)
    return out


def _dtype(term: Term, var_dtypes: dict[str, str], out: dict[Term, str]) -> str | None:
    if term in out:
        return out[term]
    got: str | None = None
    if isinstance(term, Var):
        got = var_dtypes.get(term.name) or var_dtypes.get(term.name.split("#")[0])
    elif isinstance(term, App) and term.head in PARALLEL:
        got = _dtype(term.args[0], var_dtypes, out)
    elif isinstance(term, App) and term.head in OPS:
        got = _op_dtype(term, var_dtypes, out)
    elif isinstance(term, App) and term.head == "TCons":
        _dtype(term.args[0], var_dtypes, out)
        _dtype(term.args[1], var_dtypes, out)
        return None
    if got is not None:
        out[term] = got
    return got


def _list_dtypes(term: Term, var_dtypes: dict[str, str], out: dict[Term, str]) -> list[str | None]:
    if isinstance(term, App) and term.head == "TCons":
        return [_dtype(term.args[0], var_dtypes, out), *_list_dtypes(term.args[1], var_dtypes, out)]
    if isinstance(term, App) and term.head == "PList" and term.args:
        return _list_dtypes(term.args[0], var_dtypes, out)
    if isinstance(term, Var):
        return [var_dtypes.get(term.name)]
    return []


def _op_dtype(term: App, var_dtypes: dict[str, str], out: dict[Term, str]) -> str | None:
    spec = OPS[term.head]
    types = op_types(term.head)
    bound: dict[str, str] = {}
    first: str | None = None
    for arg, value in zip(spec.args, term.args, strict=False):
        if arg.sort not in ("T", "TList"):
            continue
        got = _list_dtypes(value, var_dtypes, out) if arg.sort == "TList" else [_dtype(value, var_dtypes, out)]
        for dtype in got:
            if dtype is None:
                continue
            first = first or dtype
            tv = types.inputs.get(arg.name) if types is not None else None
            if types is None or tv is None:
                continue
            if dtype not in types.allowed[tv]:
                raise TypeProblem(
                    f"{term.head} does not take {dtype} for {arg.name} (ONNX allows {_show(types.allowed[tv])}): {term}"
                )
            if bound.setdefault(tv, dtype) != dtype:
                raise TypeProblem(
                    f"{term.head} needs its operands of type {tv} to share one dtype, here {bound[tv]} and "
                    f"{dtype}: {term}"
                )
    if types is None:
        return first
    if types.output == "=bool":
        return "bool"
    if types.output == "=to":
        to = term.args[spec.arg_index("to")]
        return onnx_dtype_name(int(to.value)) if isinstance(to, Lit) else None
    return bound.get(types.output)


def _show(dtypes: frozenset[str]) -> str:
    if dtypes == UNIVERSE:
        return "every dtype"
    if dtypes >= FLOAT_DTYPES and dtypes - FLOAT_DTYPES:
        return "floats and " + ", ".join(sorted(dtypes - FLOAT_DTYPES))
    return ", ".join(sorted(dtypes))


# ----------------------------------------------------------------------------------------------------------
# A rule


@dataclass
class TypeCheck:
    """The outcome for one rule. ``problem``: why the right-hand side is ill-typed (with the dtypes), or "";
    ``classes``: the dtypes each tensor variable of the left-hand side may have (variables of one class share
    a dtype: ``class_of``); ``never``: the left-hand side matches no well-typed term (under its dtype guards)."""

    problem: str = ""
    dtypes: dict[str, str] = field(default_factory=dict)
    classes: dict[int, frozenset[str]] = field(default_factory=dict)
    class_of: dict[str, int] = field(default_factory=dict)
    never: bool = False


def check_types(rule: Rule) -> TypeCheck:
    """Type-check ``rule`` (module docstring)."""
    sorts = rule.var_sorts
    typer = Typer(sorts=dict(sorts))
    lhs_roots = side_roots(rule.lhs)
    left = [typer.slot(r) for r in lhs_roots]
    lhs_vars = [t.name for t in walk(rule.lhs) if isinstance(t, Var) and sorts.get(t.name) in ("T", "TList")]
    for name in lhs_vars:
        typer.var(name)
    dtype_guards(typer, rule.guards)
    slots = typer.slots
    result = TypeCheck()
    before = {name: (slots.find(typer.var_slot[name]), slots.of(typer.var_slot[name])) for name in lhs_vars}
    root_before = [(slots.find(s), slots.of(s)) for s in left if s is not None]
    if any(not allowed for _r, allowed in [*before.values(), *root_before]):
        result.never = True
        return result
    result.class_of = {name: rep for name, (rep, _a) in before.items()}
    result.classes = {rep: allowed for rep, allowed in before.values()}
    right = [typer.slot(r) for r in side_roots(rule.rhs)]
    for a, b in zip(left, right, strict=False):
        if a is not None and b is not None:
            slots.union(a, b)
    # LHS classes (variables' and roots'): narrowed, or two merged
    lhs_classes = {rep: allowed for rep, allowed in [*before.values(), *root_before]}
    assignment: dict[int, str] | None = None
    merged: dict[int, list[int]] = {}
    for rep, allowed in lhs_classes.items():
        now = slots.of(rep)
        if not allowed <= now:
            assignment = {rep: _pick(allowed - now)}
            break
        merged.setdefault(slots.find(rep), []).append(rep)
    if assignment is None:
        for group in merged.values():
            if len(group) > 1:
                first, second = group[0], group[1]
                one = _pick(lhs_classes[first])
                other = lhs_classes[second] - {one}
                if other:
                    assignment = {first: one, second: _pick(other)}
                    break
                two = lhs_classes[first] - {one}
                if two:
                    assignment = {first: _pick(two), second: one}
                    break
    if assignment is None:
        touched = {slots.find(s) for s in typer.memo.values() if s is not None}
        if any(not slots.allowed[r] for r in touched):
            assignment = {}
    if assignment is None:
        return result
    dtypes = {name: assignment.get(rep, _pick(lhs_classes[rep])) for name, (rep, _a) in before.items()}
    result.dtypes = dtypes
    result.problem = _explain(rule, lhs_roots, dtypes)
    return result


def _explain(rule: Rule, lhs_roots: list[Term], dtypes: dict[str, str]) -> str:
    """The message for a concrete assignment the left-hand side accepts and the right-hand side does not."""
    shown = ", ".join(f"{k}: {v}" for k, v in sorted(dtypes.items())) or "every dtype"
    try:
        left = term_dtypes(rule.lhs, dtypes)
    except TypeProblem as exc:  # pragma: no cover - the assignment is one the left-hand side accepts
        return f"with dtypes {shown}: {exc}"
    try:
        right = term_dtypes(rule.rhs, dtypes)
    except TypeProblem as exc:
        return f"the right-hand side is ill-typed with dtypes {shown} (the left-hand side accepts them): {exc}"
    for lroot, rroot in zip(lhs_roots, side_roots(rule.rhs), strict=False):
        a, b = left.get(lroot), right.get(rroot)
        if a is not None and b is not None and a != b:
            return f"with dtypes {shown} the left-hand side is {a} and the right-hand side {b}: {rroot}"
    return f"the right-hand side is ill-typed for some dtypes the left-hand side accepts (e.g. {shown})"


def integer_assignments(rule: Rule, check: TypeCheck) -> list[dict[str, str]]:
    """The dtype assignments to prove ``rule`` on again with integer semantics (module docstring); none when
    the rule holds no integer-sensitive op or no class may be an integer."""
    heads = {t.head for term in (rule.lhs, rule.rhs) for t in walk(term) if isinstance(t, App)}
    if check.never or not heads & INTEGER_SENSITIVE:
        return []
    reps = sorted(check.classes)
    options: list[list[str]] = []
    for rep in reps:
        allowed = check.classes[rep]
        opts = []
        if allowed & FLOAT_DTYPES:
            opts.append(_pick(allowed & FLOAT_DTYPES))
        if allowed & INTEGER_DTYPES:
            opts.append(_pick(allowed & INTEGER_DTYPES))
        options.append(opts or [_pick(allowed)])
    out: list[dict[str, str]] = []
    for combo in itertools.product(*options):
        if not any(is_integer(d) for d in combo):
            continue
        chosen = dict(zip(reps, combo, strict=True))
        out.append({name: chosen[rep] for name, rep in check.class_of.items()})
    return out


def describe_dtypes(dtypes: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(dtypes.items()))
