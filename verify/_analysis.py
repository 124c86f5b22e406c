"""Analysis facts checked against what they mean (issue 21): a ``(rule ...)`` that derives a relation the
guards rely on must derive it only where it holds.

The guards of every rule read relations such as ``can-split``, ``perm-map``, ``bc-dim`` or ``mm-row``; the
verifier evaluates them with the Python mirrors of :mod:`unity_eq.verify._guards` (their meaning), while
the engine evaluates them with whatever ``(rule ...)`` commands derive them. A rule file that adds
``(rule ((= e (Relu x)) (mesh-axis ax n) (dim-range d) ...) ((can-split e d ax)))`` without the
divisibility test, or a wrong ``perm-map``, therefore made every rewrite guarded by them unsound in the
engine while ``verify`` passed. Each such declaration is now checked like a rewrite's bounded proof: over
every case of the ranges where its query holds (the query's root pattern enumerated by the instance
generators, its facts solved by the guard evaluator), each fact of a checked relation it derives must hold
by the mirror. A case where it does not is a counterexample; a query the checker cannot enumerate (several
unrelated tensors) leaves the declaration *unknown*.

How a query becomes cases: ``(= e (Op ...))`` roots it at that pattern; a first fact of a relation that
other declarations derive by matching (``(bcast-operand e x)``) is joined with each of those declarations
(``e`` their pattern, ``x`` their argument), ops that share instances checked once; a query over one tensor
variable ranges over every free tensor; a query without tensors over the mesh and the integers alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from unity_eq.ops.registry import OPS
from unity_eq.rulefile.checks import Checker
from unity_eq.rulefile.env import Env
from unity_eq.rulefile.terms import AnalysisDecl, App, Rule, Term, Var, walk
from unity_eq.verify._bounded import Case, bounded_token, rule_meshes
from unity_eq.verify._gen import GenConfig, generate_lhs, required_ranks
from unity_eq.verify._guards import DerivedFacts, GuardContext, GuardError, solve_guards
from unity_eq.verify._semantics import PARALLEL, Placements

__all__ = ["CHECKED_RELATIONS", "AnalysisOutcome", "check_analysis_decl", "checked_claims"]

#: relations with a meaning the guards rely on (a Python mirror in _guards.py): a declaration deriving one
#: is checked. ``placed``, ``shape`` and ``dtype`` facts of ops are the encoder's and the engine's
#: bookkeeping, and ``bcast-operand``-like relations are defined by their declarations.
CHECKED_RELATIONS = frozenset(
    {
        "can-split",
        "can-split-opt",
        "splittable-size",
        "list-can-split",
        "shards-not",
        "bc-dim",
        "bc-bcast",
        "mm-row",
        "mm-batch",
        "mm-col",
        "mm-k",
        "perm-map",
        "reshape-map",
        "reduce-map",
    }
)


@dataclass
class AnalysisOutcome:
    """The verdict on one declaration: ``proven`` (every case checked holds), ``refuted`` (``case`` and
    ``message`` say where a derived fact is false) or ``unknown`` (``message`` says why)."""

    status: str
    checked: int
    message: str = ""
    case: str = ""
    seconds: float = 0.0


def checked_claims(decl: AnalysisDecl) -> list[App]:
    """The facts of checked relations ``decl`` derives, and the shapes it sets (``(set (shape e) s)``, as the
    fact ``(= (shape e) s)``): the guards read ``(shape t)``, and the engine takes it from whatever declaration
    sets it, so a wrong shape (a Transpose's operand's shape, a mean's kept axis) made rewrites guarded by it
    unsound while ``verify`` passed (issue 21's adversary corpus)."""
    out = [a for a in decl.actions if isinstance(a, App) and a.head in CHECKED_RELATIONS]
    out += [_shape_fact(a) for a in decl.actions if _is_shape_set(a)]
    return out


def _is_shape_set(action: Term) -> bool:
    """``(set (shape x) s)``."""
    return (
        isinstance(action, App)
        and action.head == "set"
        and len(action.args) == 2
        and isinstance(action.args[0], App)
        and action.args[0].head == "shape"
    )


def _shape_fact(action: Term) -> App:
    """``(set (shape x) s)`` as the fact it claims, ``(= (shape x) s)``, checked by the guard evaluator (which
    computes ``(shape x)`` of an op term by the op's shape inference)."""
    assert isinstance(action, App)
    return App("=", action.args)


def check_analysis_decl(
    decl: AnalysisDecl, env: Env, facts: DerivedFacts, sizes: Sequence[int] = (1, 2, 3, 4)
) -> AnalysisOutcome:
    """Every case where ``decl``'s query holds, checked against each checked fact it derives."""
    start = time.perf_counter()
    claims = checked_claims(decl)
    outcome = AnalysisOutcome("proven", 0)
    try:
        for lhs, guards, actions in _rooted(decl, claims, facts):
            if _check_one(decl, env, facts, sizes, lhs, guards, actions, outcome):
                break
    except _CannotEnumerate as exc:
        outcome = AnalysisOutcome("unknown", outcome.checked, str(exc))
    except GuardError as exc:
        outcome = AnalysisOutcome("unknown", outcome.checked, f"a fact cannot be evaluated: {exc}")
    if outcome.status == "proven" and not outcome.checked:
        outcome = AnalysisOutcome("unknown", 0, "no case of the ranges satisfies the query")
    outcome.seconds = time.perf_counter() - start
    return outcome


class _CannotEnumerate(Exception):
    """The query has no root the instance generators can enumerate."""


def _check_one(
    decl: AnalysisDecl,
    env: Env,
    facts: DerivedFacts,
    sizes: Sequence[int],
    lhs: Term,
    guards: tuple[Term, ...],
    actions: list[Term],
    outcome: AnalysisOutcome,
) -> bool:
    """Checks one rooted form of the query; True when it found a counterexample (``outcome`` says it)."""
    rule = Checker(env, Rule("analysis", decl.pos, lhs, lhs, guards, decl.ruleset)).check()
    sorts = rule.var_sorts
    cfg = GenConfig()
    for mesh in rule_meshes(rule, sizes):
        axes = mesh.axes
        for inst in generate_lhs(lhs, sorts, axes, cfg, required_ranks(guards)):
            specs = {v: inst[v] for v, s in sorts.items() if s == "T" and v in inst}
            lists = {v: inst[v] for v, s in sorts.items() if s == "TList" and v in inst}
            attrs = {k: v for k, v in inst.items() if k not in specs and k not in lists}
            ctx = GuardContext(
                axes, dict(zip(axes, mesh.sizes, strict=True)), sorts, specs, lists, Placements(axes), facts
            )
            for solution in solve_guards(guards, attrs, ctx):
                outcome.checked += 1
                for action in actions:
                    if not any(True for _ in solve_guards([action], solution, ctx)):
                        case = Case(mesh, {**solution, **specs, **lists}, dict(ctx.placed))
                        outcome.status = "refuted"
                        outcome.case = case.describe(sorts)
                        outcome.message = (
                            f"derives {action} where it does not hold (by its meaning in unity_eq.verify's "
                            "mirror of rules/analysis.egg): a rewrite guarded by it would apply where it is unsound"
                        )
                        return True
    return False


def _rooted(
    decl: AnalysisDecl, claims: list[App], facts: DerivedFacts
) -> Iterator[tuple[Term, tuple[Term, ...], list[Term]]]:
    """(root pattern, the other query facts, the claims), the root's variable replaced by its pattern."""
    query = list(decl.query)
    for i, fact in enumerate(query):
        if _is_root(fact):
            assert isinstance(fact, App)
            name = fact.args[0]
            assert isinstance(name, Var)
            names = {name.name: fact.args[1]}
            rest = query[:i] + query[i + 1 :]
            yield fact.args[1], tuple(_subst(f, names) for f in rest), [_subst(c, names) for c in claims]
            return
    first = query[0] if query else None
    if isinstance(first, App) and first.head in facts.relations and first.head not in CHECKED_RELATIONS:
        yield from _joined(first, query[1:], claims, facts)
        return
    tensors = _tensor_vars(decl)
    if len(tensors) > 1:
        raise _CannotEnumerate(
            f"the query has no (= e (Op ...)) root and {len(tensors)} tensors ({', '.join(tensors)}): its cases "
            "cannot be enumerated"
        )
    lhs: Term = Var(tensors[0]) if tensors else App("NoneT")
    yield lhs, tuple(query), list(claims)


def _joined(
    first: App, rest: list[Term], claims: list[App], facts: DerivedFacts
) -> Iterator[tuple[Term, tuple[Term, ...], list[Term]]]:
    """The query joined with every declaration that derives ``first``'s relation by matching, once per
    layout of ops (ops of one bounded token share their instances and their meaning here)."""
    seen: set[str] = set()
    for head, entries in sorted(facts.by_head.items()):
        for var, pattern, actions in entries:
            for action in actions:
                if not (isinstance(action, App) and action.head == first.head and action.args[:1] == (Var(var),)):
                    continue
                if len(action.args) != len(first.args):
                    continue
                renamed = _rename(pattern, "m_")
                names: dict[str, Term] = {}
                for mine, theirs in zip(first.args, action.args, strict=True):
                    value = renamed if theirs == Var(var) else _rename(theirs, "m_")
                    if isinstance(mine, Var):
                        names[mine.name] = value
                key = f"{bounded_token(head)}|{_rename_head(renamed, head)}|{first}|{action}"
                if key in seen:
                    continue
                seen.add(key)
                yield renamed, tuple(_subst(f, names) for f in rest), [_subst(c, names) for c in claims]


def _is_root(fact: Term) -> bool:
    """``(= e (Op ...))`` with ``Op`` a constructor (not ``shape``, ``vec-get``…)."""
    return (
        isinstance(fact, App)
        and fact.head == "="
        and len(fact.args) == 2
        and isinstance(fact.args[0], Var)
        and isinstance(fact.args[1], App)
        and (fact.args[1].head in OPS or fact.args[1].head in _LIST_HEADS or fact.args[1].head in PARALLEL)
    )


_LIST_HEADS = ("TCons", "TNil", "NoneT", "PList")


_TENSOR_FIRST = ("placed", "can-split", "splittable-size", "can-split-opt")


def _tensor_vars(decl: AnalysisDecl) -> list[str]:
    """Variables of the query in a tensor position of a relation (the first argument of ``placed``,
    ``can-split``…), in order."""
    out: dict[str, None] = {}
    for fact in decl.query:
        first = fact.args[0] if isinstance(fact, App) and fact.args else None
        if isinstance(fact, App) and fact.head in _TENSOR_FIRST and isinstance(first, Var):
            out.setdefault(first.name, None)
        if isinstance(fact, App):
            for t in walk(fact):
                if isinstance(t, App) and t.head in ("shape", "dtype") and t.args and isinstance(t.args[0], Var):
                    out.setdefault(t.args[0].name, None)
    return list(out)


def _subst(term: Term, names: dict[str, Term]) -> Term:
    if isinstance(term, Var):
        return names.get(term.name, term)
    if isinstance(term, App):
        return App(term.head, tuple(_subst(a, names) for a in term.args))
    return term


def _rename(term: Term, prefix: str) -> Term:
    if isinstance(term, Var):
        return Var(prefix + term.name)
    if isinstance(term, App):
        return App(term.head, tuple(_rename(a, prefix) for a in term.args))
    return term


def _rename_head(term: Term, head: str) -> str:
    return str(term).replace(f"({head} ", "(#op ")
