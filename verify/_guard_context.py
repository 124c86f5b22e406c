"""What a guard is evaluated against: the facts analysis declarations derive, and one case's context.

:mod:`unity_eq.verify._guards` evaluates and solves guards against them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unity_eq.egraph import MAX_RANK
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import AnalysisDecl, App, Lit, Term, Var
from unity_eq.verify._semantics import (
    PARALLEL,
    Placements,
    R,
    State,
    VarSpec,
    instantiate,
    list_elements,
)
from unity_eq.verify._tensor import ShapeError, infer_shape

DIMS = range(MAX_RANK)  # dim-range: the encoder states 0 .. (max rank - 1); MAX_RANK bounds it


class NoValue(Exception):
    """A term's value is not available yet (an unbound variable) or undefined (vec-get out of range)."""


class DerivedFacts:
    """Facts that analysis declarations ``(rule ((= e (Op ...))) ((rel e x ...)))`` give, by matching."""

    def __init__(self, analyses: Sequence[AnalysisDecl]) -> None:
        self.by_head: dict[str, list[tuple[str, Term, tuple[Term, ...]]]] = {}
        self.relations: set[str] = set()
        self.memo: dict[tuple[str, Term], list[tuple[Term, ...]]] = {}
        for decl in analyses:
            for action in decl.actions:
                if isinstance(action, App):
                    self.relations.add(action.head)
            if len(decl.query) != 1:
                continue
            fact = decl.query[0]
            if (
                isinstance(fact, App)
                and fact.head == "="
                and isinstance(fact.args[0], Var)
                and isinstance(fact.args[1], App)
            ):
                self.by_head.setdefault(fact.args[1].head, []).append((fact.args[0].name, fact.args[1], decl.actions))

    def derived(self, relation: str, e: Term) -> list[tuple[Term, ...]]:
        key = (relation, e)
        got = self.memo.get(key)
        if got is not None:
            return got
        out: list[tuple[Term, ...]] = []
        if isinstance(e, App):
            for var, pattern, actions in self.by_head.get(e.head, []):
                subst: dict[str, Term] = {}
                if not match_term(pattern, e, subst):
                    continue
                subst[var] = e
                for action in actions:
                    if (
                        isinstance(action, App)
                        and action.head == relation
                        and action.args
                        and action.args[0] == Var(var)
                    ):
                        try:
                            out.append(tuple(subst_term(arg, subst) for arg in action.args))
                        except KeyError:
                            continue
        self.memo[key] = out
        return out

    def mentions(self, head: str, token: str) -> tuple[str, ...]:
        """Every declaration whose pattern mentions ``head`` anywhere (not only at its root), with the op
        renamed ``token``: what a proof that uses ``head`` may have depended on (proof reuse keys)."""
        out = []
        for entries in self.by_head.values():
            for var, pattern, actions in entries:
                if not any(isinstance(t, App) and t.head == head for t in _walk(pattern)):
                    continue
                text = f"{var}={pattern}=>{' '.join(map(str, actions))}"
                out.append(text.replace(f"({head} ", f"({token} ").replace(f"({head})", f"({token})"))
        return tuple(sorted(out))

    def signature(self, head: str, token: str) -> tuple[str, ...]:
        """The declarations about ``head``, with the op renamed ``token`` (for cache keys)."""
        out = []
        for var, pattern, actions in self.by_head.get(head, []):
            text = f"{var}={pattern}=>{' '.join(map(str, actions))}"
            out.append(text.replace(f"({head} ", f"({token} "))
        return tuple(sorted(out))


@dataclass
class GuardContext:
    """What guards see in one case: the mesh, the bound variables, the left-hand side's placements."""

    axes: tuple[str, ...]
    sizes: dict[str, int]
    sorts: dict[str, str]
    specs: dict[str, VarSpec | None]
    lists: dict[str, list[VarSpec]]
    pl: Placements
    facts: DerivedFacts = field(default_factory=lambda: DerivedFacts(()))
    placed: dict[tuple[str, str], State] = field(default_factory=dict)
    memo: dict[Any, Any] = field(default_factory=dict)  # shared by the cases of one instance
    #: ``placed`` holds every variable's placement (an analysis declaration's placement check enumerates
    #: them): a ``placed`` guard then only matches it (egglog's query), never gives a variable its placement,
    #: and ``(S d)`` with ``d`` unbound binds ``d`` to the sharded dim
    fixed_placements: bool = False

    # --- terms
    def tensor(self, term: Term, binding: dict[str, Any]) -> Term:
        """The concrete tensor term of a guard argument (variables substituted)."""
        sorts = self.sorts
        if isinstance(term, Var) and sorts.get(term.name) in ("T", "TList") and sorts.get(term.name) == "T":
            spec = self.specs.get(term.name)
            return Var(term.name) if spec is not None else App("NoneT")
        attr_vars = self.memo.get(("vars", term))
        if attr_vars is None:
            attr_vars = tuple(
                dict.fromkeys(
                    t.name for t in _walk(term) if isinstance(t, Var) and sorts.get(t.name) not in ("T", "TList")
                )
            )
            self.memo[("vars", term)] = attr_vars
        if any(v not in binding for v in attr_vars):
            raise NoValue(str(term))
        key = ("tensor", term, tuple(binding[v] for v in attr_vars))
        got = self.memo.get(key)
        if got is None:
            merged = {**binding, **self.specs, **self.lists}
            got = instantiate(term, merged, sorts)
            self.memo[key] = got
        return got

    def shape(self, term: Term) -> tuple[int, ...]:
        key = ("shape", term)
        got = self.memo.get(key)
        if got is None:
            got = self._shape(term)
            self.memo[key] = got
        return got

    def _shape(self, term: Term) -> tuple[int, ...]:
        if isinstance(term, Var):
            spec = self.specs.get(term.name)
            if spec is None:
                if term.name.split("#")[0] in self.lists:
                    base, i = term.name.split("#")
                    return self.lists[base][int(i)].shape
                return ()
            return spec.shape
        if isinstance(term, App):
            if term.head == "NoneT":
                return ()
            if term.head in PARALLEL:
                return self.shape(term.args[0])
            if term.head in OPS:
                args: list[Any] = []
                op_spec = OPS[term.head]
                for k, arg in enumerate(term.args):
                    sort = op_spec.args[k].sort if k < len(op_spec.args) else "i64"
                    if sort == "T":
                        args.append(None if isinstance(arg, App) and arg.head == "NoneT" else self.shape(arg))
                    elif sort == "TList":
                        args.append([self.shape(x) for x in list_elements(arg) or []])
                    else:
                        args.append(arg.value if isinstance(arg, Lit) else None)
                try:
                    return infer_shape(term.head, args)
                except ShapeError:
                    raise NoValue(str(term)) from None
        raise NoValue(str(term))

    def placement(self, term: Term, axis: str) -> State | None:
        if isinstance(term, Var) and (term.name, axis) in self.placed:
            return self.placed[(term.name, axis)]
        got = self.pl.get(term, axis)
        if len(got) == 1:
            return next(iter(got))
        return None if got else R


def _walk(term: Term) -> Iterator[Term]:
    yield term
    if isinstance(term, App):
        for a in term.args:
            yield from _walk(a)


def match_term(pattern: Term, term: Term, subst: dict[str, Term]) -> bool:
    if isinstance(pattern, Var):
        if pattern.name in subst:
            return subst[pattern.name] == term
        subst[pattern.name] = term
        return True
    if isinstance(pattern, Lit):
        return isinstance(term, Lit) and term.value == pattern.value
    return (
        isinstance(term, App)
        and term.head == pattern.head
        and len(term.args) == len(pattern.args)
        and all(match_term(p, t, subst) for p, t in zip(pattern.args, term.args, strict=True))
    )


def subst_term(term: Term, subst: dict[str, Term]) -> Term:
    if isinstance(term, Var):
        return subst[term.name]
    if isinstance(term, App):
        return App(term.head, tuple(subst_term(a, subst) for a in term.args))
    return term
