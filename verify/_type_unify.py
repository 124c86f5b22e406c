"""Unifying the type variables of a rule's op applications: dtype classes as a union-find over type slots.

Steps 1 and 2 of :func:`unity_eq.verify._types.check_types` (the method is stated there)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from unity_eq.collectives import TERMS
from unity_eq.ops.dtypes import FLOAT_DTYPES, INTEGER_DTYPES, onnx_dtype_name, op_types
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Term, Var

PARALLEL = set(TERMS)  # the collective kinds' constructors (unity_eq.collectives): dtype-preserving
UNIVERSE = frozenset(FLOAT_DTYPES | INTEGER_DTYPES | {"bool"})


class TypeProblem(Exception):
    """A term is ill-typed for a concrete assignment of dtypes (the message says which op and operands)."""


# ----------------------------------------------------------------------------------------------------------
# Unification


class TypeSlots:
    """Union-find over type slots, each with the set of dtypes it may take."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.allowed: list[frozenset[str]] = []

    def new(self, allowed: Iterable[str] = UNIVERSE) -> int:
        self.parent.append(len(self.parent))
        self.allowed.append(frozenset(allowed))
        return len(self.parent) - 1

    def find(self, s: int) -> int:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.allowed[ra] = self.allowed[ra] & self.allowed[rb]
        return ra

    def narrow(self, s: int, allowed: Iterable[str]) -> None:
        r = self.find(s)
        self.allowed[r] = self.allowed[r] & frozenset(allowed)

    def of(self, s: int) -> frozenset[str]:
        return self.allowed[self.find(s)]


@dataclass
class Typer:
    """Gives every tensor term of a rule a slot, unifying as the ops' type constraints say."""

    slots: TypeSlots = field(default_factory=TypeSlots)
    memo: dict[Term, int | None] = field(default_factory=dict)
    var_slot: dict[str, int] = field(default_factory=dict)
    sorts: dict[str, str] = field(default_factory=dict)

    def var(self, name: str) -> int:
        if name not in self.var_slot:
            self.var_slot[name] = self.slots.new()
        return self.var_slot[name]

    def list_slots(self, term: Term) -> list[int]:
        if isinstance(term, Var):
            return [self.var(term.name)]
        if isinstance(term, App) and term.head == "TCons":
            head = self.slot(term.args[0])
            return ([] if head is None else [head]) + self.list_slots(term.args[1])
        if isinstance(term, App) and term.head == "PList" and term.args:
            return self.list_slots(term.args[0])
        return []

    def slot(self, term: Term) -> int | None:
        if term in self.memo:
            return self.memo[term]
        got = self._slot(term)
        self.memo[term] = got
        return got

    def _slot(self, term: Term) -> int | None:
        if isinstance(term, Var):
            return self.var(term.name) if self.sorts.get(term.name, "T") in ("T", "TList") else None
        if not isinstance(term, App) or term.head in ("NoneT", "TNil"):
            return None
        if term.head in PARALLEL:
            return self.slot(term.args[0])
        spec = OPS.get(term.head)
        if spec is None:
            return self.slots.new()  # a leaf (Input, Weight, Opaque…): any dtype
        types = op_types(term.head)
        tvars: dict[str, int] = {}
        first: int | None = None
        for arg, value in zip(spec.args, term.args, strict=False):
            if arg.sort not in ("T", "TList"):
                continue
            got = self.list_slots(value) if arg.sort == "TList" else [s for s in [self.slot(value)] if s is not None]
            for s in got:
                first = s if first is None else first
                if types is None:
                    continue
                tv = types.inputs.get(arg.name)
                if tv is None:
                    continue
                if tv not in tvars:
                    tvars[tv] = self.slots.new(types.allowed[tv])
                self.slots.union(tvars[tv], s)
        if types is None:
            return first if first is not None else self.slots.new()
        if types.output == "=bool":
            return self.slots.new({"bool"})
        if types.output == "=to":
            to = term.args[spec.arg_index("to")]
            name = onnx_dtype_name(int(to.value)) if isinstance(to, Lit) else None
            return self.slots.new({name} if name else ()) if isinstance(to, Lit) else self.slots.new()
        if types.output not in tvars:
            tvars[types.output] = self.slots.new(types.allowed[types.output])
        return tvars[types.output]


def side_roots(term: Term) -> list[Term]:
    items: list[Term] = []
    t = term
    while isinstance(t, App) and t.head == "TCons":
        items.append(t.args[0])
        t = t.args[1]
    return items if isinstance(t, App) and t.head == "TNil" and items else [term]


def dtype_guards(typer: Typer, guards: Iterable[Term]) -> None:
    """Narrow the classes by the guards that name dtypes (others are left out: that only widens them)."""
    alias: dict[str, Term] = {}
    for g in guards:
        if isinstance(g, App) and g.head == "=" and len(g.args) == 2:
            for a, b in (g.args, g.args[::-1]):
                if isinstance(a, Var) and isinstance(b, App) and b.head == "dtype":
                    alias[a.name] = b.args[0]

    def slot_of(t: Term) -> int | None:
        if isinstance(t, App) and t.head == "dtype" and t.args:
            return typer.slot(t.args[0])
        if isinstance(t, Var) and t.name in alias:
            return typer.slot(alias[t.name])
        return None

    for g in guards:
        if not isinstance(g, App):
            continue
        if g.head == "float-dtype" and len(g.args) == 1:
            s = slot_of(g.args[0])
            if s is not None:
                typer.slots.narrow(s, FLOAT_DTYPES)
        elif g.head in ("=", "!=") and len(g.args) == 2:
            for a, b in (g.args, g.args[::-1]):
                s = slot_of(a)
                if s is not None and isinstance(b, Lit) and b.sort == "String":
                    keep = {str(b.value)} if g.head == "=" else UNIVERSE - {str(b.value)}
                    typer.slots.narrow(s, keep)
