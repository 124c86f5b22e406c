"""A rule's terms on a mesh: the concrete term of a case, the placement states and their inference.

A placement is a state per mesh axis (``R``, ``D``, ``P`` or ``S(d)``), inferred as analysis.egg does (the
contract is stated in :mod:`unity_eq.verify._semantics` and docs/verify.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from unity_eq.collectives import TERMS
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Term, Var, walk

PARALLEL = set(TERMS)  # the e-graph constructors of the collective kinds (unity_eq.collectives)
SYMBOLIC = "<symbolic>"  # the value of a float attribute variable: a free symbol in proofs
LEAVES = {"Input", "Weight", "NoneT", "Opaque", "Tensor"}
LISTS = {"TNil", "TCons", "PList"}

State = tuple[str, int]  # ("R", -1), ("D", -1), ("P", -1), ("S", dim)
R: State = ("R", -1)
D: State = ("D", -1)
P: State = ("P", -1)


def S(dim: int) -> State:
    return ("S", dim)


def state_str(state: State) -> str:
    return f"S({state[1]})" if state[0] == "S" else state[0]


def parse_state(term: Term) -> State | None:
    """A placement literal in a guard: (R), (D), (P), (S 1)."""
    if isinstance(term, App):
        if term.head in ("R", "D", "P") and not term.args:
            return (term.head, -1)
        if term.head == "S" and len(term.args) == 1 and isinstance(term.args[0], Lit):
            return S(int(term.args[0].value))
    return None


# ----------------------------------------------------------------------------------------------------------
# Instantiation: substitute a case's bindings into a rule's terms


def instantiate(term: Term, binding: dict[str, Any], sorts: dict[str, str]) -> Term:
    """The concrete term of a case: attribute variables become literals, arithmetic is evaluated, list
    variables become explicit TCons chains of element variables ``l#0``…, and PList is expanded."""
    if isinstance(term, Lit):
        return term
    if isinstance(term, Var):
        sort = sorts.get(term.name)
        value = binding.get(term.name)
        if sort == "T":
            return App("NoneT") if value is None else Var(term.name)
        if sort == "TList":
            out: Term = App("TNil")
            for i in reversed(range(len(value or ()))):
                out = App("TCons", (Var(f"{term.name}#{i}"), out))
            return out
        if sort == "f64" and value == SYMBOLIC:
            return Lit(term.name, "symbol")  # a free real, named after the variable
        return Lit(value, sort or "i64")
    args = tuple(instantiate(a, binding, sorts) for a in term.args)
    if term.head in ("+", "-", "*", "/", "%", "min", "max") and all(isinstance(a, Lit) for a in args):
        x, y = (int(a.value) for a in args)
        return Lit(_arith(term.head, x, y), "i64")
    if term.head == "vec-of" and all(isinstance(a, Lit) for a in args):
        return Lit(tuple(int(a.value) for a in args), "IVec")
    if term.head == "vec-empty":
        return Lit((), "IVec")
    if term.head == "PList":
        items, d, ax = list_elements(args[0]), args[1], args[2]
        if items is not None:
            out = App("TNil")
            for item in reversed(items):
                out = App("TCons", (App("Partition", (item, d, ax)), out))
            return out
    return App(term.head, args)


def _arith(op: str, x: int, y: int) -> int:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "/":
        return int(x / y) if y else 0
    if op == "%":
        return int(math.fmod(x, y)) if y else 0
    return min(x, y) if op == "min" else max(x, y)


def list_elements(term: Term) -> list[Term] | None:
    items: list[Term] = []
    while isinstance(term, App) and term.head == "TCons":
        items.append(term.args[0])
        term = term.args[1]
    if isinstance(term, App) and term.head == "TNil":
        return items
    return None


TENSOR_ARGS = {name: spec.tensor_args for name, spec in OPS.items()}


def _tensor_args(term: App) -> list[Term]:
    """The T-sorted children of a regular op (list elements flattened)."""
    spec = OPS.get(term.head)
    if spec is None:
        return []
    out: list[Term] = []
    for i in TENSOR_ARGS[term.head]:
        if i >= len(term.args):
            continue
        arg = term.args[i]
        if spec.args[i].sort == "TList":
            out.extend(list_elements(arg) or [])
        else:
            out.append(arg)
    return out


# ----------------------------------------------------------------------------------------------------------
# Placement inference


@dataclass
class Placements:
    """States per (tensor term, axis). A well-formed rule has exactly one state per term and axis."""

    axes: tuple[str, ...]
    states: dict[tuple[Term, str], set[State]] = field(default_factory=dict)

    def get(self, term: Term, axis: str) -> set[State]:
        return self.states.get((term, axis), set())

    def add(self, term: Term, axis: str, state: State) -> bool:
        got = self.states.setdefault((term, axis), set())
        if state in got:
            return False
        got.add(state)
        return True

    def one(self, term: Term) -> dict[str, State] | None:
        out = {}
        for axis in self.axes:
            got = self.get(term, axis)
            if len(got) != 1:
                return None
            out[axis] = next(iter(got))
        return out

    def describe(self, term: Term) -> str:
        parts = []
        for axis in self.axes:
            got = sorted(self.get(term, axis))
            parts.append(f"{axis}: {' and '.join(state_str(s) for s in got) or '?'}")
        return ", ".join(parts)


def every_var_is_tensor(t: Term) -> bool:
    return True


def tensor_nodes(term: Term, is_tensor_var: Any = every_var_is_tensor) -> list[Term]:
    """Every T-sorted subterm (vars, leaves, ops), parents first; list constructors are containers."""
    out: list[Term] = []
    for t in walk(term):
        if (isinstance(t, Var) and is_tensor_var(t)) or (
            isinstance(t, App) and t.head not in LISTS and (t.head in OPS or t.head in PARALLEL or t.head in LEAVES)
        ):
            out.append(t)
    return out


def lit_dim(term: Term) -> Any:
    return int(term.value)


def lit_axis(term: Term) -> str:
    return str(term.value) if isinstance(term, Lit) else ""


def propagate(
    pl: Placements,
    terms: Sequence[Term],
    dim_of: Any = lit_dim,
    axis_of: Any = lit_axis,
    is_tensor_var: Any = every_var_is_tensor,
) -> None:
    """Apply analysis.egg's placement rules to a fixpoint. ``dim_of`` and ``axis_of`` read a parallel op's
    dim and axis arguments (literals in bounded proofs, symbols in generic ones)."""
    nodes: dict[Term, None] = {}
    for t in terms:
        for node in tensor_nodes(t, is_tensor_var):
            nodes.setdefault(node, None)
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if not isinstance(node, App):
                continue
            head = node.head
            if head in LEAVES:
                for axis in pl.axes:
                    changed |= pl.add(node, axis, R)
            elif head in PARALLEL:
                x = node.args[0]
                axis = axis_of(node.args[-1])
                if head == "Partition":
                    mine, theirs = ("S", dim_of(node.args[1])), R
                elif head == "Combine":
                    mine, theirs = R, ("S", dim_of(node.args[1]))
                elif head == "Replicate":
                    mine, theirs = D, R
                else:
                    mine, theirs = R, P
                if axis in pl.axes:
                    changed |= pl.add(node, axis, mine)
                    changed |= pl.add(x, axis, theirs)
                for other in pl.axes:
                    if other == axis:
                        continue
                    for st in list(pl.get(x, other)):
                        changed |= pl.add(node, other, st)
                    for st in list(pl.get(node, other)):
                        changed |= pl.add(x, other, st)
            elif head in OPS:
                args = [a for a in _tensor_args(node) if not isinstance(a, Var) or is_tensor_var(a)]
                for axis in pl.axes:
                    if args and all(pl.get(a, axis) == {R} for a in args):
                        changed |= pl.add(node, axis, R)


def lhs_placements(
    lhs: Term,
    axes: tuple[str, ...],
    placed: dict[tuple[str, str], State],
    tensor_vars: Sequence[str],
    defaults: bool = True,
) -> Placements:
    """Placements the left-hand side alone implies: its structure, the ``placed`` guards, then (with
    ``defaults``) R for every variable still without a state."""
    pl = Placements(axes)
    for (var, axis), st in placed.items():
        pl.add(Var(var), axis, st)
    propagate(pl, [lhs])
    if not defaults:
        return pl
    for var in tensor_vars:
        for axis in axes:
            if not pl.get(Var(var), axis):
                pl.add(Var(var), axis, R)
    propagate(pl, [lhs])
    return pl


def infer_placements(
    lhs: Term,
    rhs: Term,
    axes: tuple[str, ...],
    placed: dict[tuple[str, str], State],
    tensor_vars: Sequence[str],
) -> Placements:
    """Infer placements of a concrete rule. ``placed`` holds the states that ``placed`` guards give
    variables; other variables default to R after the left-hand side's structure has spoken."""
    pl = lhs_placements(lhs, axes, placed, tensor_vars)
    lhs_items, rhs_items = list_elements(lhs), list_elements(rhs)
    pairs = (
        list(zip(lhs_items, rhs_items, strict=False))
        if lhs_items is not None and rhs_items is not None
        else [(lhs, rhs)]
    )
    changed = True
    while changed:
        before = sum(len(s) for s in pl.states.values())
        for left, right in pairs:
            for axis in axes:
                for st in list(pl.get(left, axis)):
                    pl.add(right, axis, st)
                for st in list(pl.get(right, axis)):
                    pl.add(left, axis, st)
        propagate(pl, [lhs, rhs])
        changed = sum(len(s) for s in pl.states.values()) != before
    return pl
