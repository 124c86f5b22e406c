"""Guards evaluated in Python on concrete shapes: one predicate per relation of rules/analysis.egg.

A rule's ``:when`` facts are a conjunctive query, as in egglog: the evaluator tries them in order, defers a
fact until the variables it needs are bound, and enumerates the solutions of relations that bind variables
(``(can-split a d ax)`` binds ``d`` and ``ax``). Each relation (:mod:`unity_eq.verify._guard_relations`)
mirrors the egglog rules that derive it; ``reshape-map`` and ``reduce-map`` reuse the encoder's own functions.
``bcast-operand`` and any other relation that rule files declare with ``(rule ((= e (Op ...))) ((rel e x
...)))`` are derived by matching those declarations (:mod:`unity_eq.verify._guard_context`).

A relation with no mirror here and no such declaration makes the rule *unknown* (the verifier cannot tell
when it holds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._guard_context import DerivedFacts, GuardContext, NoValue
from unity_eq.verify._guard_relations import BUILTIN_RELATIONS, S_UNBOUND, UNBOUND, derived_facts
from unity_eq.verify._semantics import (
    LISTS,
    PARALLEL,
    S,
    parse_state,
)

__all__ = [
    "BUILTIN_RELATIONS",
    "GUARD_ARITHMETIC",
    "DerivedFacts",
    "GuardContext",
    "GuardError",
    "guard_value",
    "solve_guards",
    "unsupported_relations",
]


#: the value guard: a tensor's elements are all finite and non-zero (rules/analysis.egg)
NONZERO = "nonzero-values"


class GuardError(Exception):
    """A guard cannot be evaluated (no Python mirror for a relation, or a fact never becomes evaluable)."""


# ----------------------------------------------------------------------------------------------------------
# Values of guard terms


def _value(term: Term, binding: dict[str, Any], ctx: GuardContext) -> Any:
    if isinstance(term, Lit):
        return term.value
    if isinstance(term, Var):
        sort = ctx.sorts.get(term.name)
        if sort in ("T", "TList"):
            return ctx.tensor(term, binding)
        if term.name not in binding:
            raise NoValue(term.name)
        return binding[term.name]
    head = term.head
    if head in ("R", "D", "P", "S"):
        if head == "S":
            return S(int(_value(term.args[0], binding, ctx)))
        return (head, -1)
    if head == "shape":
        return ctx.shape(ctx.tensor(term.args[0], binding))
    if head == "dtype":
        t = ctx.tensor(term.args[0], binding)
        spec = ctx.specs.get(t.name) if isinstance(t, Var) else None
        return "none" if isinstance(t, App) and t.head == "NoneT" else ("int64" if spec and spec.integer else "float32")
    if head == "vec-get":
        vec, i = _value(term.args[0], binding, ctx), _value(term.args[1], binding, ctx)
        if not 0 <= i < len(vec):
            raise _Undefined(f"vec-get {i} of {list(vec)}")
        return vec[i]
    if head == "vec-length":
        return len(_value(term.args[0], binding, ctx))
    if head == "vec-of":
        return tuple(_value(a, binding, ctx) for a in term.args)
    if head == "vec-empty":
        return ()
    if head == "vec-set":
        vec, i, x = (_value(a, binding, ctx) for a in term.args)
        if not 0 <= i < len(vec):
            raise _Undefined(f"vec-set {i} of {list(vec)}")
        return (*vec[:i], x, *vec[i + 1 :])
    arith = GUARD_ARITHMETIC.get(head)
    if arith is not None:
        x, y = (_value(a, binding, ctx) for a in term.args)
        if head in ("/", "%") and y == 0:
            raise _Undefined("division by zero")
        return arith(x, y)
    if head in OPS or head in PARALLEL or head in LISTS or head == "NoneT":
        return ctx.tensor(term, binding)
    raise GuardError(f"'{head}' has no value in a guard")


def guard_value(term: Term, binding: dict[str, Any], ctx: GuardContext) -> Any:
    """The value of a guard term (an axis, a placement ``(S d)``, a dim…) under ``binding``; GuardError when
    it has none."""
    try:
        return _value(term, binding, ctx)
    except (NoValue, _Undefined) as exc:
        raise GuardError(f"{term} has no value here ({exc})") from None


# the integer arithmetic of guards (egglog's i64: division truncates toward zero), one function per head, made
# once (a dict of lambdas built per evaluation cost a third of the guards' time on 4-tensor rules)
GUARD_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda x, y: x + y,
    "-": lambda x, y: x - y,
    "*": lambda x, y: x * y,
    "/": lambda x, y: int(x / y),
    "%": lambda x, y: x - y * int(x / y),
    "min": min,
    "max": max,
}


class _Undefined(Exception):
    """The fact is false in egglog (it does not match): vec-get out of range, division by zero."""


_COMPARE = {
    "<": lambda x, y: x < y,
    ">": lambda x, y: x > y,
    "<=": lambda x, y: x <= y,
    ">=": lambda x, y: x >= y,
    "!=": lambda x, y: x != y,
}


def unsupported_relations(guards: Sequence[Term], facts: DerivedFacts) -> list[str]:
    """Relations in ``guards`` that the verifier cannot evaluate."""
    out = []
    for guard in guards:
        if not isinstance(guard, App):
            continue
        head = guard.head
        if head in BUILTIN_RELATIONS or head in _COMPARE or head in ("=", "vec-contains", "vec-not-contains", NONZERO):
            continue
        if head not in facts.relations:
            out.append(head)
    return out


def solve_guards(guards: Sequence[Term], binding: dict[str, Any], ctx: GuardContext) -> Iterator[dict[str, Any]]:
    """Every extension of ``binding`` under which all guards hold."""
    yield from _solve(list(guards), dict(binding), ctx, 0)


def _solve(pending: list[Term], binding: dict[str, Any], ctx: GuardContext, stalled: int) -> Iterator[dict[str, Any]]:
    if not pending:
        yield binding
        return
    if stalled > len(pending):
        raise GuardError(f"cannot evaluate guard {pending[0]}: a variable it needs is never bound")
    fact, rest = pending[0], pending[1:]
    try:
        solutions = list(_fact(fact, binding, ctx))
    except NoValue:
        yield from _solve([*rest, fact], binding, ctx, stalled + 1)
        return
    except _Undefined:
        return
    for new in solutions:
        yield from _solve(rest, new, ctx, 0)


def _fact(fact: Term, binding: dict[str, Any], ctx: GuardContext) -> Iterator[dict[str, Any]]:
    if not isinstance(fact, App):
        raise GuardError(f"a guard must be a fact, got {fact}")
    head = fact.head
    if head == "=":
        left, right = fact.args
        for target, other in ((left, right), (right, left)):
            if (
                isinstance(target, Var)
                and target.name not in binding
                and ctx.sorts.get(target.name) not in ("T", "TList")
            ):
                value = _value(other, binding, ctx)
                yield {**binding, target.name: value}
                return
        if _value(left, binding, ctx) == _value(right, binding, ctx):
            yield binding
        return
    if head in _COMPARE:
        if _COMPARE[head](_value(fact.args[0], binding, ctx), _value(fact.args[1], binding, ctx)):
            yield binding
        return
    if head == NONZERO:
        # a premise on the values, not a choice of case: the case's variable is drawn non-zero
        # (bounded_check.concrete_rule), so it holds of a tensor variable and is refused on any other term
        if len(fact.args) != 1 or not isinstance(fact.args[0], Var) or ctx.sorts.get(fact.args[0].name) != "T":
            raise GuardError(f"{fact}: `{NONZERO}` takes one tensor variable of the left-hand side")
        if not (isinstance(t := ctx.tensor(fact.args[0], binding), App) and t.head == "NoneT"):
            yield binding  # an absent input has no values: the encoder never states it of one
        return
    if head in ("vec-contains", "vec-not-contains"):
        vec, x = _value(fact.args[0], binding, ctx), _value(fact.args[1], binding, ctx)
        if (x in vec) == (head == "vec-contains"):
            yield binding
        return
    entry = BUILTIN_RELATIONS.get(head)
    if entry is None:
        yield from _derived_fact(fact, binding, ctx)
        return
    rel, enumerable = entry
    args: list[Any] = []
    unbound: dict[int, str] = {}
    shard_dim = ""  # ``(placed x ax (S d))`` with ``d`` unbound, matched against fixed placements
    for i, arg in enumerate(fact.args):
        if isinstance(arg, Var) and arg.name not in binding and ctx.sorts.get(arg.name) not in ("T", "TList"):
            if i not in enumerable:
                raise NoValue(arg.name)
            unbound[i] = arg.name
            args.append(UNBOUND)
        elif (
            isinstance(arg, App)
            and arg.head == "S"
            and isinstance(arg.args[0], Var)
            and arg.args[0].name not in binding
        ):
            if head != "placed" or not ctx.fixed_placements:
                raise NoValue(arg.args[0].name)
            shard_dim = arg.args[0].name
            args.append(S_UNBOUND)
        else:
            value = _value(arg, binding, ctx)
            state = parse_state(arg) if isinstance(arg, App) else None
            args.append(state if state is not None else value)
    for solution in rel(ctx, args):
        new = dict(binding)
        ok = True
        for i, name in unbound.items():
            if name in new and new[name] != solution[i]:
                ok = False
            new[name] = solution[i]
        if shard_dim:
            new[shard_dim] = solution[2][1]
        if ok:
            yield new


def _derived_fact(fact: App, binding: dict[str, Any], ctx: GuardContext) -> Iterator[dict[str, Any]]:
    if not fact.args:
        raise GuardError(f"relation '{fact.head}' has no Python mirror in unity_eq.verify")
    e = _value(fact.args[0], binding, ctx)
    if not isinstance(e, (Var, App)):
        raise GuardError(f"relation '{fact.head}' has no Python mirror in unity_eq.verify")
    for derived in derived_facts(ctx, fact.head, e):
        new = dict(binding)
        ok = True
        for arg, value in zip(fact.args[1:], derived[1:], strict=False):
            if isinstance(arg, Var) and arg.name not in new and ctx.sorts.get(arg.name) not in ("T", "TList"):
                new[arg.name] = value.value if isinstance(value, Lit) else value
            elif _value(arg, new, ctx) != (value.value if isinstance(value, Lit) else value):
                ok = False
        if ok:
            yield new
