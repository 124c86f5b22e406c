"""The rule AST: what the prover reads. Data only; built by :mod:`unity_eq.rulefile.parse`.

A term is a :class:`Var` (a pattern variable), a :class:`Lit` (an ``i64``/``f64``/``String`` literal) or an
:class:`App` (a constructor, function, relation or primitive applied to terms). Terms are frozen and hashable
and compare structurally (positions are left out of equality), so equal terms are one e-node, as in egglog.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

__all__ = ["AnalysisDecl", "App", "Lit", "Pos", "Rule", "Term", "Var", "term_vars", "walk"]


@dataclass(frozen=True)
class Pos:
    """Where something is written: file (as displayed), 1-based line and column."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Var:
    name: str
    pos: Pos | None = field(default=None, compare=False, hash=False, repr=False)

    def __hash__(self) -> int:
        return hash(("Var", self.name))

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    """A literal: ``sort`` is ``i64``, ``f64``, ``String`` or ``IVec`` (a tuple of ints)."""

    value: int | float | str | tuple[int, ...]
    sort: str
    pos: Pos | None = field(default=None, compare=False, hash=False, repr=False)

    def __hash__(self) -> int:
        return hash(("Lit", self.value, self.sort))

    def __str__(self) -> str:
        if self.sort == "String":
            return '"' + str(self.value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(self.value) if self.sort == "f64" else str(self.value)


@dataclass(frozen=True)
class App:
    head: str
    args: tuple[Term, ...] = ()
    pos: Pos | None = field(default=None, compare=False, hash=False, repr=False)
    _hash: int = field(default=0, init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        # terms are hashed constantly (placements, caches): hash once, not once per lookup per level
        object.__setattr__(self, "_hash", hash((self.head, self.args)))

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return f"({' '.join([self.head, *map(str, self.args)])})"


Term = Var | Lit | App


def walk(term: Term) -> Iterator[Term]:
    """Every subterm, parents before children."""
    yield term
    if isinstance(term, App):
        for arg in term.args:
            yield from walk(arg)


def term_vars(term: Term) -> list[str]:
    """Pattern variables in order of first appearance."""
    seen: dict[str, None] = {}
    for t in walk(term):
        if isinstance(t, Var):
            seen.setdefault(t.name, None)
    return list(seen)


#: Relations that only narrow where a rule applies and say nothing about the values it rewrites
#: (rules/analysis.egg: ``merge-operand``, which orders the weights a merge may concatenate). A rule with such a
#: premise matches a subset of what it matches without it, so proving it without the premise (and without the
#: comparisons between numbers that only such premises bind) proves it with the premise.
APPLICABILITY_FILTERS = frozenset({"merge-operand"})


@dataclass(frozen=True)
class Rule:
    """One rewrite (``rewrite``, ``birewrite``, or a ``rule`` whose action is a ``union``).

    ``guards`` are the ``:when`` facts (for a ``rule``: its query without the matched patterns). A ``rule`` with
    several unions (``roots`` > 1) has the list ``(TCons p1 (TCons p2 (TNil)))`` of its patterns as ``lhs`` and
    the list of their replacements as ``rhs``: every root pair must hold. ``sorts`` maps
    every variable to its egglog sort, inferred from where it is used. ``annotation`` is the reason given in a
    ``; verify: unknown-ok <reason>`` comment right above the rule, if any.
    """

    name: str
    pos: Pos
    lhs: Term
    rhs: Term
    guards: tuple[Term, ...]
    ruleset: str
    bidirectional: bool = False
    sorts: tuple[tuple[str, str], ...] = ()
    annotation: str | None = None
    text: str = ""
    roots: int = 1  # a multi-pattern rule: lhs and rhs are TCons lists of this many root patterns
    filters: tuple[Term, ...] = ()  # premises over APPLICABILITY_FILTERS, left out of the proof
    digest: str = ""  # of the command's text (unity_eq.rulefile.certificate.command_digest)

    @property
    def file(self) -> str:
        return self.pos.file

    @property
    def line(self) -> int:
        return self.pos.line

    @property
    def var_sorts(self) -> dict[str, str]:
        return dict(self.sorts)

    def where(self) -> str:
        return f"rule '{self.name}' ({self.pos})"

    def reversed(self) -> Rule:
        """The right-to-left direction of a ``birewrite``."""
        return replace(self, name=self.name + " (reverse)", lhs=self.rhs, rhs=self.lhs, bidirectional=False)


@dataclass(frozen=True)
class AnalysisDecl:
    """A ``rule`` that only adds analysis facts (``(bcast-operand e a)``…): declared, not proven."""

    pos: Pos
    query: tuple[Term, ...]
    actions: tuple[Term, ...]
    ruleset: str
