"""How an analysis declaration's query becomes cases: its root pattern, and the declarations a first fact joins.

The method is stated in :mod:`unity_eq.verify._analysis`."""

from __future__ import annotations

from collections.abc import Iterator

from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import AnalysisDecl, App, Term, Var, walk
from unity_eq.verify._bounded import bounded_token
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._semantics import (
    PARALLEL,
)

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


#: relations only the encoder states, from the model and the mesh (rules/analysis.egg): a declaration that
#: derives one could make every rewrite guarded by it fire where it does not hold (``(nonzero-values e)`` of a
#: Relu lets a rule divide by zero), and the verifier cannot check it against a meaning beyond "the encoder
#: said so", so it is refused
ENCODER_FACTS = frozenset({"float-dtype", "nonzero-values", "mesh-axis", "dim-range", "axes-1", "axes-2", "axes-3"})


class CannotEnumerate(Exception):
    """The query has no root the instance generators can enumerate."""


def rooted_cases(
    decl: AnalysisDecl, claims: list[App], facts: DerivedFacts
) -> Iterator[tuple[Term, tuple[Term, ...], list[Term]]]:
    """(root pattern, the other query facts, the claims), the root's variable replaced by its pattern."""
    query = list(decl.query)
    for i, fact in enumerate(query):
        if is_root(fact):
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
        raise CannotEnumerate(
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


def is_root(fact: Term) -> bool:
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
