"""What a term means on a mesh: its global value, its placement per axis, and its piece on every device.

This module implements the contract every rule must keep (see docs/verify.md):

* **Global value** ``G(t)``: ops evaluated on global values; Partition, Combine, Replicate and Reduce are the
  identity.
* **Placement** ``π(t)`` per mesh axis (``R``, ``D``, ``P`` or ``S(d)``), inferred as analysis.egg does:
  leaves are ``R``; pattern variables are ``R`` unless the left-hand side's structure or a ``placed`` guard
  says otherwise; a parallel op fixes its own axis on both sides (``Partition(x, d, ax)`` is ``S(d)`` and
  its operand ``R``; ``Combine`` is ``R`` and its operand ``S(d)``; ``Replicate`` is ``D`` and its operand
  ``R``; ``Reduce`` is ``R`` and its operand ``P``) and passes the other axes through in both directions; a
  regular op whose operands are all ``R`` on an axis is ``R`` there; both sides of the rule are one e-class.
* **Pieces** ``L(t, device)``, bottom-up: a pattern variable's pieces follow its placement (``S(d)``: chunk
  i of n along d; ``P``: free pieces whose sum is the global value); Partition slices, Combine concatenates
  the group's pieces in axis order, Reduce sums them in group order, Replicate is the identity, a regular op
  applies to the pieces (Reshape and Expand targets made local from the op's own placement).

A rewrite is sound iff, for all inputs on which the left-hand side's root has pieces consistent with its
placement (a term of a sound e-graph does), the two sides have the same global value and placement and every
term of the right-hand side has pieces consistent with its placement.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import z3

from unity_eq.collectives import TERMS
from unity_eq.ir import Mesh
from unity_eq.ops.dtypes import is_integer
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Term, Var, walk
from unity_eq.verify._tensor import (
    NumpyBackend,
    NumpyIntegerBackend,
    ShapeError,
    Z3Backend,
    Z3IntegerBackend,
    evaluate,
)
from unity_eq.verify._types import TypeProblem, term_dtypes

__all__ = [
    "PARALLEL",
    "SYMBOLIC",
    "Equation",
    "EvalFailure",
    "Placements",
    "VarSpec",
    "evaluate_case",
    "gradient_placements",
    "gradient_problem",
    "infer_placements",
    "instantiate",
    "lhs_placements",
    "placement_equations",
    "state_str",
]

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


@dataclass(frozen=True)
class VarSpec:
    """A tensor pattern variable in one case: its global shape; ``integer`` for index tensors (Gather),
    whose values lie in [-high, high)."""

    shape: tuple[int, ...]
    integer: bool = False
    high: int = 0


class EvalFailure(Exception):
    """A term cannot be evaluated in this case: ``kind`` is ``shape`` or ``placement``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


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


_TENSOR_ARGS = {name: spec.tensor_args for name, spec in OPS.items()}


def _tensor_args(term: App) -> list[Term]:
    """The T-sorted children of a regular op (list elements flattened)."""
    spec = OPS.get(term.head)
    if spec is None:
        return []
    out: list[Term] = []
    for i in _TENSOR_ARGS[term.head]:
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


def _is_tensor_var(t: Term) -> bool:
    return True


def tensor_nodes(term: Term, is_tensor_var: Any = _is_tensor_var) -> list[Term]:
    """Every T-sorted subterm (vars, leaves, ops), parents first; list constructors are containers."""
    out: list[Term] = []
    for t in walk(term):
        if (isinstance(t, Var) and is_tensor_var(t)) or (
            isinstance(t, App) and t.head not in LISTS and (t.head in OPS or t.head in PARALLEL or t.head in LEAVES)
        ):
            out.append(t)
    return out


def _lit_dim(term: Term) -> Any:
    return int(term.value)


def _lit_axis(term: Term) -> str:
    return str(term.value) if isinstance(term, Lit) else ""


def propagate(
    pl: Placements,
    terms: Sequence[Term],
    dim_of: Any = _lit_dim,
    axis_of: Any = _lit_axis,
    is_tensor_var: Any = _is_tensor_var,
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


# ----------------------------------------------------------------------------------------------------------
# Training: the placement of the gradient the backward pass delivers to every term
#
# A rule must keep what training synchronizes, not only the forward values. The backward pass delivers to
# every term a gradient with a placement of its own (DESIGN.md, the parallel ops' backward column):
#
# * the root's gradient is the dual of its forward placement (``R`` -> ``R``, ``S(d)`` -> ``S(d)``, ``D`` ->
#   ``P``: sharded consumers each hold a part, ``P`` -> ``R``: every piece gets the whole gradient);
# * ``Replicate`` all-reduces a ``P`` gradient to ``R`` (the data-parallel gradient all-reduce);
#   ``Partition`` all-gathers an ``S(d)`` gradient to ``R``; ``Combine`` slices an ``R`` gradient to
#   ``S(d)``; ``Reduce`` passes an ``R`` gradient to every partial piece; on their other axes they pass the
#   gradient through;
# * a regular op that is ``R`` on an axis (replicated work) passes its gradient to its operands unchanged
#   (the backward of an op is linear in its gradient); a regular op doing sharded work (``S``, ``P`` or
#   ``D``) whose gradient is the dual of its placement gives an ``S(d)`` operand an ``S(d)`` gradient, a
#   ``P`` operand an ``R`` one, and a replicated (``R`` or ``D``) operand a ``P`` one: each device's part
#   of the operand's gradient is a partial sum, which only a ``Replicate`` above the operand all-reduces;
# * anything else (an all-reduce of a complete gradient, a sum of gradients of two layouts) is ``X``: no
#   valid layout.
#
# A rewrite keeps training's synchronization iff every pattern variable and leaf gets, on every axis, the
# same gradient placement from both sides (where it occurs on both). Dropping a ``Replicate`` under sharded
# work turns an all-reduced ``R`` gradient into an unreduced ``P``: the plan would train on a partial
# gradient, and the rule is refuted.

X: State = ("X", -1)
_DUAL = {"R": R, "D": P, "P": R}


def _dual(state: State) -> State:
    return state if state[0] == "S" else _DUAL.get(state[0], X)


def _grad_str(state: State) -> str:
    if state == R:
        return "R (complete on every device)"
    if state == P:
        return "P (a pending sum: each device holds a part, and no Replicate all-reduces it)"
    if state[0] == "S":
        return f"S({state[1]}) (sharded along dim {state[1]})"
    return "X (no valid layout: an all-reduce of a complete gradient, or parts of two layouts summed)"


def _backward_parallel(head: str, mine: bool, dim: Any, grad: State) -> State:
    """The gradient a parallel op hands its operand, on its own axis (``mine``) or another one."""
    if not mine:
        return grad
    if head == "Replicate":
        return R if grad == P else X
    if head == "Partition":
        return R if grad == ("S", dim) else X
    if head == "Combine":
        return ("S", dim) if grad == R else X
    return R if grad == R else X  # Reduce: every partial piece gets the whole gradient


def _backward_op(node: Term, operand: Term, axis: str, grad: State, pl: Placements) -> State:
    """The gradient a regular op hands one tensor operand on ``axis``."""
    mine, theirs = pl.get(node, axis), pl.get(operand, axis)
    if len(mine) != 1 or len(theirs) != 1:
        return X
    state, operand_state = next(iter(mine)), next(iter(theirs))
    if state == R and operand_state == R:
        return grad  # replicated work: the backward is linear in the gradient
    if grad != _dual(state):
        return X
    if operand_state[0] == "S":
        return operand_state
    return R if operand_state == P else P


def gradient_placements(
    roots: Sequence[Term],
    pl: Placements,
    dim_of: Any = _lit_dim,
    axis_of: Any = _lit_axis,
    is_tensor_var: Any = _is_tensor_var,
) -> dict[tuple[Term, str], State]:
    """The gradient placement the backward pass delivers to every tensor term below ``roots`` (see above),
    per axis; a term reached by several consumers sums their gradients (one layout, or ``X``)."""
    pl = Placements(pl.axes, {key: set(states) for key, states in pl.states.items()})
    list_vars = _list_placements(roots, pl, dim_of, axis_of)

    def is_node(v: Var) -> bool:
        return v in list_vars or bool(is_tensor_var(v))

    order: list[Term] = []
    seen: set[Term] = set()
    children: dict[Term, list[Term]] = {}

    def visit(t: Term) -> None:  # post-order: every consumer comes before its operands once reversed
        if t in seen:
            return
        seen.add(t)
        kids = _grad_children(t, is_node)
        children[t] = kids
        for k in kids:
            visit(k)
        order.append(t)

    for root in roots:
        visit(root)
    parts: dict[tuple[Term, str], set[State]] = {}
    for root in roots:
        for axis in pl.axes:
            got = pl.get(root, axis)
            parts.setdefault((root, axis), set()).add(_dual(next(iter(got))) if len(got) == 1 else X)
    out: dict[tuple[Term, str], State] = {}
    for node in reversed(order):
        for axis in pl.axes:
            handed_in = parts.get((node, axis))
            if not handed_in:
                continue
            grad = next(iter(handed_in)) if len(handed_in) == 1 else X
            out[(node, axis)] = grad
            for kid in children[node]:
                if isinstance(node, App) and node.head == "TCons":
                    handed = grad  # a list's gradient is its elements' gradients
                elif isinstance(node, App) and node.head == "PList":
                    mine = axis_of(node.args[2]) == axis
                    handed = _backward_parallel("Partition", mine, dim_of(node.args[1]) if mine else None, grad)
                elif isinstance(node, App) and node.head in PARALLEL:
                    mine = axis_of(node.args[-1]) == axis
                    dim = dim_of(node.args[1]) if node.head in ("Partition", "Combine") and mine else None
                    handed = _backward_parallel(node.head, mine, dim, grad)
                else:
                    handed = _backward_op(node, kid, axis, grad, pl)
                parts.setdefault((kid, axis), set()).add(handed)
    return out


def _grad_children(term: Term, is_node: Any) -> list[Term]:
    """The operands a term's backward pass hands gradients to: tensors, explicit lists flattened; a list
    that is not explicit (a list variable, ``PList``, a ``TCons`` ending in one) is one node whose elements
    all get its gradient placement (bounded cases have none: lists are expanded there)."""
    if not isinstance(term, App):
        return []
    kids: list[Term] = []
    if term.head in PARALLEL or term.head == "PList":
        kids = [term.args[0]]
    elif term.head == "TCons":
        kids = list(term.args)
    elif term.head in OPS:
        spec = OPS[term.head]
        for i in _TENSOR_ARGS[term.head]:
            if i >= len(term.args):
                continue
            arg = term.args[i]
            items = list_elements(arg) if spec.args[i].sort == "TList" else [arg]
            kids.extend(items if items is not None else [arg])
    return [
        k
        for k in kids
        if (isinstance(k, Var) and is_node(k)) or (isinstance(k, App) and k.head not in ("NoneT", "TNil"))
    ]


def _list_placements(terms: Sequence[Term], pl: Placements, dim_of: Any, axis_of: Any) -> set[Term]:
    """Give the list nodes of ``terms`` that are not explicit lists a placement (the one all their elements
    share): a list variable's elements are ``R`` unless ``pl`` says otherwise, ``PList(l, d, ax)`` is
    ``S(d)`` on ``ax``, ``TCons(x, r)`` what ``x`` and ``r`` share. Returns the list variables seen."""
    list_vars: set[Term] = set()

    def visit(t: Term, in_list: bool) -> None:
        if isinstance(t, Var):
            if in_list:
                list_vars.add(t)
                for axis in pl.axes:
                    if not pl.get(t, axis):
                        pl.add(t, axis, R)
            return
        if not isinstance(t, App):
            return
        spec = OPS.get(t.head)
        for i, arg in enumerate(t.args):
            listy = (t.head, i) in (("PList", 0), ("TCons", 1)) or (
                spec is not None and i < len(spec.args) and spec.args[i].sort == "TList"
            )
            visit(arg, listy)
        if t.head == "PList":
            axis = axis_of(t.args[2])
            for other in pl.axes:
                st = ("S", dim_of(t.args[1])) if other == axis else _shared(pl.get(t.args[0], other))
                if st is not None and not pl.get(t, other):
                    pl.add(t, other, st)
        elif t.head == "TCons":
            for other in pl.axes:
                tail = t.args[1]
                states = pl.get(t.args[0], other) | (
                    set() if isinstance(tail, App) and tail.head == "TNil" else pl.get(tail, other)
                )
                st = _shared(states)
                if st is not None and not pl.get(t, other):
                    pl.add(t, other, st)

    for term in terms:
        visit(term, isinstance(term, Var))
    return list_vars


def _shared(states: set[State]) -> State | None:
    return next(iter(states)) if len(states) == 1 else (X if states else None)


def gradient_problem(
    lhs: Term,
    rhs: Term,
    pl: Placements,
    dim_of: Any = _lit_dim,
    axis_of: Any = _lit_axis,
    is_tensor_var: Any = _is_tensor_var,
    mesh: Mesh | None = None,
) -> str | None:
    """Why the rule changes what training synchronizes (a variable or leaf gets its gradient in another
    placement on one side than on the other), or None. With a concrete ``mesh``, axes of size 1 are left
    out: their all-reduce is the identity."""
    lhs_items, rhs_items = list_elements(lhs), list_elements(rhs)
    left_roots = lhs_items if lhs_items is not None and rhs_items is not None else [lhs]
    right_roots = rhs_items if lhs_items is not None and rhs_items is not None else [rhs]
    left = gradient_placements(left_roots, pl, dim_of, axis_of, is_tensor_var)
    right = gradient_placements(right_roots, pl, dim_of, axis_of, is_tensor_var)
    trivial = {a for a, n in zip(mesh.axes, mesh.sizes, strict=True) if n == 1} if mesh is not None else set()
    for (term, axis), want in left.items():
        if axis in trivial or not (isinstance(term, Var) or (isinstance(term, App) and term.head in LEAVES)):
            continue
        got = right.get((term, axis))
        if got is None or got == want:
            continue
        return (
            f"gradient of {term} on axis {axis}: in training the left-hand side delivers it as {_grad_str(want)}, "
            f"the right-hand side as {_grad_str(got)}: the rule changes what training synchronizes "
            "(a Replicate's backward is the gradient all-reduce)"
        )
    return None


# ----------------------------------------------------------------------------------------------------------
# Evaluation of a case


@dataclass
class Equation:
    """``left == right`` elementwise must hold for the rule to be sound; ``what`` says which check."""

    what: str
    left: np.ndarray
    right: np.ndarray
    term: str = ""
    assume: bool = False  # the left-hand side's own consistency: a premise, not a claim of the rule
    node: Term | None = None  # the term whose values these are (the float32 pass asks whether it is discrete)


@dataclass
class CaseValues:
    """Everything evaluated for one case (for counterexamples): inputs, both sides' values."""

    inputs: dict[str, np.ndarray]
    pieces_of_inputs: dict[str, list[np.ndarray]]
    lhs_global: Any
    rhs_global: Any
    assumptions: list[Any] = field(default_factory=list)


def chunk_of(x: np.ndarray, dim: int, index: int, parts: int) -> np.ndarray:
    if not 0 <= dim < x.ndim:  # a parallel op's dim is never negative
        raise ShapeError(f"dim {dim} of a rank-{x.ndim} tensor")
    size = x.shape[dim]
    if size % parts:
        raise ShapeError(f"dim {dim} of size {size} does not split into {parts} equal pieces")
    step = size // parts
    sl = [slice(None)] * x.ndim
    sl[dim] = slice(index * step, (index + 1) * step)
    return x[tuple(sl)]


class _Case:
    """Evaluates the terms of one concrete case on one backend."""

    def __init__(
        self,
        mesh: Mesh,
        pl: Placements,
        specs: dict[str, VarSpec],
        attrs: dict[str, Any],
        bk: Any,
        dtypes: dict[str, str] | None = None,
    ) -> None:
        self.mesh = mesh
        self.pl = pl
        self.specs = specs
        self.bk = bk
        # integer tensors (``dtypes``: variable -> dtype): integer-valued inputs, ops on them by the integer
        # backend (truncating division)
        self.dtypes = dtypes or {}
        self.int_bk: Any = None
        if any(is_integer(d) for d in self.dtypes.values()):
            self.int_bk = Z3IntegerBackend() if isinstance(bk, Z3Backend) else NumpyIntegerBackend(bk.rng)
        self.term_dtypes: dict[Term, str] = {}
        self.attrs = attrs
        self.coords = [mesh.coords(r) for r in range(mesh.size)]
        self.global_cache: dict[Term, Any] = {}
        self.piece_cache: dict[tuple[Term, tuple[int, ...]], Any] = {}
        self.erased: dict[Term, Term] = {}
        self.varies: dict[Term, tuple[int, ...]] = {}
        self.var_pieces: dict[str, list[Any]] = {}
        self.assumptions: list[Any] = []
        self.inputs: dict[str, Any] = {}

    # --- placements
    def placement(self, term: Term) -> dict[str, State]:
        got = self.pl.one(term)
        if got is None:
            raise EvalFailure("placement", f"{term} has no single placement ({self.pl.describe(term)})")
        return got

    def expected(self, value: np.ndarray, placement: dict[str, State], rank: int) -> np.ndarray:
        for i, axis in enumerate(self.mesh.axes):
            st = placement[axis]
            if st[0] == "S":
                value = chunk_of(value, st[1], self.coords[rank][i], self.mesh.sizes[i])
        return value

    def local_shape(self, shape: tuple[int, ...], placement: dict[str, State]) -> tuple[int, ...]:
        out = list(shape)
        for i, axis in enumerate(self.mesh.axes):
            st = placement[axis]
            if st[0] == "S":
                if st[1] >= len(out) or out[st[1]] % self.mesh.sizes[i]:
                    raise ShapeError(f"dim {st[1]} of {list(shape)} does not split into {self.mesh.sizes[i]}")
                out[st[1]] //= self.mesh.sizes[i]
        return tuple(out)

    # --- variables
    def _make_var(self, name: str) -> None:
        spec = self.specs[name]
        placement = self.placement(Var(name))
        partial = [i for i, axis in enumerate(self.mesh.axes) if placement[axis][0] == "P"]
        combos = [()] if not partial else list(np.ndindex(*[self.mesh.sizes[i] for i in partial]))
        parts = {}
        for combo in combos:
            tag = name if not partial else f"{name}.part{'_'.join(map(str, combo))}"
            if isinstance(self.bk, Z3Backend):
                parts[combo] = self.bk.symbols(tag, spec.shape, spec.integer)
            else:
                parts[combo] = self.bk.symbols(tag, spec.shape, spec.integer, spec.high)
                if spec.integer and combo != combos[0]:
                    parts[combo] = np.zeros_like(parts[combo])  # random indices in range: their sum is too
        total = parts[()] if not partial else self.bk.sum_pieces([parts[c] for c in combos])
        self.global_cache[Var(name)] = total
        self.inputs[name] = total
        integer = self.int_bk is not None and is_integer(self.dtypes.get(name.split("#")[0], ""))
        if integer and isinstance(self.bk, Z3Backend):
            for part in parts.values():
                self.assumptions.extend(z3.IsInt(sym) for sym in part.reshape(-1) if not sym.is_int())
        if spec.integer and isinstance(self.bk, Z3Backend):
            for sym in total.reshape(-1):
                self.assumptions.append(sym >= -spec.high)
                self.assumptions.append(sym < spec.high)
        pieces = []
        for rank in range(self.mesh.size):
            combo = tuple(self.coords[rank][i] for i in partial)
            pieces.append(self.expected(parts[combo], placement, rank))
        self.var_pieces[name] = pieces

    def backend(self, term: Term) -> Any:
        """The backend an op application is evaluated with: the integer one when its dtype is an integer."""
        if self.int_bk is None:
            return self.bk
        try:
            dtype = term_dtypes(term, self.dtypes, self.term_dtypes).get(term, "")
        except TypeProblem:
            dtype = ""  # the rule's type check reports it; the values are compared as reals
        return self.int_bk if is_integer(dtype) else self.bk

    # --- global values
    def erase(self, term: Term) -> Term:
        """The term without parallel ops: it has the same global value."""
        got = self.erased.get(term)
        if got is None:
            if isinstance(term, App) and term.head in PARALLEL:
                got = self.erase(term.args[0])
            elif isinstance(term, App) and term.args:
                got = App(term.head, tuple(self.erase(a) for a in term.args))
            else:
                got = term
            self.erased[term] = got
        return got

    def glob(self, term: Term) -> Any:
        key = self.erase(term)
        if key in self.global_cache:
            return self.global_cache[key]
        value = self._glob(key)
        self.global_cache[key] = value
        return value

    def varying(self, term: Term) -> tuple[int, ...]:
        """Mesh axes (indices) along which the term's pieces may differ; elsewhere they are equal."""
        got = self.varies.get(term)
        if got is not None:
            return got
        out: set[int] = set()
        if isinstance(term, Var) and term.name in self.specs:
            placement = self.placement(term)
            out = {i for i, a in enumerate(self.mesh.axes) if placement[a][0] in ("S", "P")}
        elif isinstance(term, App):
            for arg in term.args:
                out |= set(self.varying(arg))
            if term.head in PARALLEL:
                i = self.mesh.axes.index(str(term.args[-1].value))
                if term.head == "Partition":
                    out.add(i)
                elif term.head in ("Combine", "Reduce"):
                    out.discard(i)
        got = tuple(sorted(out))
        self.varies[term] = got
        return got

    def _glob(self, term: Term) -> Any:
        if isinstance(term, Lit):
            return self._lit(term)
        if isinstance(term, Var):
            if term.name in self.specs:
                self._make_var(term.name)
                return self.global_cache[term]
            return self.attrs[term.name]
        head = term.head
        if head == "NoneT":
            return None
        if head in PARALLEL:
            return self.glob(term.args[0])
        if head == "TNil":
            return []
        if head == "TCons":
            return [self.glob(term.args[0]), *self.glob(term.args[1])]
        if head in OPS:
            return evaluate(head, [self.glob(a) for a in term.args], self.backend(term))
        raise EvalFailure("shape", f"no semantics for constructor {head}")

    def _lit(self, term: Lit) -> Any:
        if term.sort == "symbol":
            return self.bk.scalar(str(term.value))
        if term.sort == "f64":
            return term.value if isinstance(self.bk, NumpyBackend) else _real(float(term.value))
        return term.value

    # --- pieces
    def piece(self, term: Term, rank: int) -> Any:
        coords = self.coords[rank]
        key = (term, tuple(coords[i] for i in self.varying(term)))
        if key in self.piece_cache:
            return self.piece_cache[key]
        value = self._piece(term, rank)
        self.piece_cache[key] = value
        return value

    def _piece(self, term: Term, rank: int) -> Any:
        if isinstance(term, Lit):
            return self._lit(term)
        if isinstance(term, Var):
            if term.name in self.specs:
                if term.name not in self.var_pieces:
                    self.glob(term)
                return self.var_pieces[term.name][rank]
            return self.attrs[term.name]
        head = term.head
        if head == "NoneT":
            return None
        if head == "TNil":
            return []
        if head == "TCons":
            return [self.piece(term.args[0], rank), *self.piece(term.args[1], rank)]
        if head in PARALLEL:
            x = term.args[0]
            axis = str(term.args[-1].value)
            i = self.mesh.axes.index(axis)
            if head == "Replicate":
                return self.piece(x, rank)
            value = self.piece(x, rank)
            if value is None:
                return None
            if head == "Partition":
                dim = int(term.args[1].value)
                return chunk_of(value, dim, self.coords[rank][i], self.mesh.sizes[i])
            group = self.mesh.group(rank, axis)
            pieces = [self.piece(x, r) for r in group]
            if head == "Combine":
                dim = int(term.args[1].value)
                if any(not 0 <= dim < p.ndim for p in pieces):  # a parallel op's dim is never negative
                    raise ShapeError(f"Combine along dim {dim} of a rank-{pieces[0].ndim} piece")
                return np.concatenate(pieces, axis=dim)
            return self.bk.sum_pieces(pieces)
        if head in OPS:
            args = [self.piece(a, rank) for a in term.args]
            if head in ("Reshape", "Expand"):
                # as lowering does: the target becomes this device's piece of the op's (global) output
                out = self.glob(term)
                args[1] = self.local_shape(tuple(out.shape), self.placement(term))
            return evaluate(head, args, self.backend(term))
        raise EvalFailure("shape", f"no semantics for constructor {head}")


_REALS: dict[float, Any] = {}


def _real(value: float) -> Any:
    import z3

    if value not in _REALS:
        _REALS[value] = z3.RealVal(value)
    return _REALS[value]


def _shape_of(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(value.shape)


def _consistency(case: _Case, term: Term, label: str, equations: list[Equation]) -> None:
    """Equations saying that ``term``'s pieces match its placement (R/D: every piece is the global value;
    S(d): piece i is chunk i along d; P: the pieces of a group sum to the value)."""
    placement = case.placement(term)
    g = case.glob(term)
    if g is None:
        for rank in range(case.mesh.size):
            if case.piece(term, rank) is not None:
                raise EvalFailure("shape", f"{label} {term} is absent globally but present on device {rank}")
        return
    partial = [i for i, axis in enumerate(case.mesh.axes) if placement[axis][0] == "P"]
    seen: set[tuple[int, ...]] = set()
    for rank in range(case.mesh.size):
        coords = case.coords[rank]
        if any(coords[i] for i in partial):
            continue
        try:
            want = case.expected(g, placement, rank)
        except ShapeError as exc:
            raise EvalFailure("shape", f"{label} {term} is {_pl_str(placement)} but {exc}") from None
        if partial:
            members = []
            for combo in np.ndindex(*[case.mesh.sizes[i] for i in partial]):
                c = list(coords)
                for i, v in zip(partial, combo, strict=True):
                    c[i] = v
                members.append(case.mesh.rank_of(tuple(c)))
            pieces = [case.piece(term, r) for r in members]
            for r, p in zip(members, pieces, strict=True):
                _check_shape(p, want, label, term, placement, r)
            got = case.bk.sum_pieces(pieces)
        else:
            got = case.piece(term, rank)
            _check_shape(got, want, label, term, placement, rank)
        key = tuple(coords)
        if key in seen:
            continue
        seen.add(key)
        what = f"{label} on device {rank} ({_coord_str(case.mesh, rank)})"
        equations.append(Equation(what, got, want, str(term), node=term))


def _check_shape(got: Any, want: np.ndarray, label: str, term: Term, placement: dict[str, State], rank: int) -> None:
    shape = _shape_of(got)
    if shape != want.shape:
        raise EvalFailure(
            "shape",
            f"{label} {term} is {_pl_str(placement)}, so device {rank} should hold a piece of shape "
            f"{list(want.shape)}, but it holds {list(shape) if shape is not None else 'nothing'}",
        )


def _pl_str(placement: dict[str, State]) -> str:
    return "[" + ", ".join(f"{a}: {state_str(s)}" for a, s in placement.items()) + "]"


def _coord_str(mesh: Mesh, rank: int) -> str:
    return ", ".join(f"{a}={c}" for a, c in zip(mesh.axes, mesh.coords(rank), strict=True))


def _subterms(term: Term) -> Iterator[Term]:
    seen: dict[Term, None] = {}
    for t in walk(term):
        if isinstance(t, App) and (t.head in OPS or t.head in PARALLEL) and t not in seen:
            seen[t] = None
    yield from seen


def evaluate_case(
    lhs: Term,
    rhs: Term,
    mesh: Mesh,
    pl: Placements,
    specs: dict[str, VarSpec],
    attrs: dict[str, Any],
    bk: Any,
    gradients: bool = True,
    dtypes: dict[str, str] | None = None,
) -> tuple[list[Equation] | None, CaseValues | None, str | None]:
    """Evaluate one case. Returns (equations, values, None) when the left-hand side is well formed, or
    (None, None, reason) to skip the case (the left-hand side cannot exist: e.g. a piece that does not
    split). Raises EvalFailure when the right-hand side is ill formed (a refutation), or, with
    ``gradients``, when the sides give a variable its training gradient in different placements (a caller
    that passes False, to report a value counterexample first, must call :func:`gradient_problem` itself).
    ``dtypes``: the dtype of each tensor variable where some is an integer (ops on integer tensors get
    integer semantics, integer inputs integer values); None: every tensor a real one."""
    case = _Case(mesh, pl, specs, attrs, bk, dtypes)
    lhs_items, rhs_items = list_elements(lhs), list_elements(rhs)
    equations: list[Equation] = []
    try:
        for name, _spec in specs.items():
            case.glob(Var(name))
        g_lhs = case.glob(lhs)
        for t in _subterms(lhs):
            for rank in range(mesh.size):
                case.piece(t, rank)
        # a left-hand side whose pieces do not fit its placement is not a term of a sound e-graph: the
        # case is skipped when the shapes do not fit, and the values' fit is a premise of the z3 query
        for left in lhs_items if lhs_items is not None else [lhs]:
            if isinstance(left, App) and left.head not in LEAVES:
                _consistency(case, left, "left-hand side", equations)
    except (ShapeError, EvalFailure) as exc:
        return None, None, str(exc)
    for eq in equations:
        eq.assume = True
    problem = gradient_problem(lhs, rhs, pl, mesh=mesh) if gradients else None
    if problem:
        raise EvalFailure("placement", problem)
    try:
        g_rhs = case.glob(rhs)
    except ShapeError as exc:
        raise EvalFailure("shape", f"the right-hand side cannot be evaluated: {exc}") from None
    if lhs_items is not None and rhs_items is not None:
        if len(lhs_items) != len(rhs_items):
            raise EvalFailure("shape", f"the two sides are lists of {len(lhs_items)} and {len(rhs_items)} tensors")
        roots = list(zip(lhs_items, rhs_items, strict=True))
    else:
        roots = [(lhs, rhs)]
    for left, right in roots:
        gl, gr = case.glob(left), case.glob(right)
        if (gl is None) != (gr is None) or (gl is not None and gl.shape != gr.shape):
            raise EvalFailure(
                "shape",
                f"the sides have global shapes {_shape_of(gl)} and {_shape_of(gr)} ({left} vs {right})",
            )
        if gl is not None:
            equations.append(Equation("global value", gr, gl, str(right), node=right))  # got: right, want: left
    try:
        for t in _subterms(rhs):
            _consistency(case, t, "right-hand side term", equations)
    except ShapeError as exc:
        raise EvalFailure("shape", str(exc)) from None
    values = CaseValues(case.inputs, case.var_pieces, g_lhs, g_rhs, case.assumptions)
    return equations, values, None


def placement_equations(
    term: Term, mesh: Mesh, pl: Placements, specs: dict[str, VarSpec], bk: Any
) -> tuple[list[Equation], CaseValues] | None:
    """What a placement an analysis declaration derives for an op means (verify/_analysis.py): ``term``, a
    regular op over variables, applied to its operands' pieces (each variable's placement in ``pl``) gives
    pieces consistent with ``term``'s own placement in ``pl`` (R/D: copies of its global value; S(d): its
    chunks; P: pieces summing to it). Returns the equations that say so, or None when the operands cannot
    have these placements (a sharded dim that does not split). Raises EvalFailure when the op's pieces
    cannot be consistent (a shape that does not fit): a refutation."""
    case = _Case(mesh, pl, specs, {}, bk)
    try:
        for name in specs:
            case.glob(Var(name))
        g = case.glob(term)
    except (ShapeError, EvalFailure):
        return None
    equations: list[Equation] = []
    try:
        _consistency(case, term, "the op's pieces under the derived placement:", equations)
    except ShapeError as exc:
        raise EvalFailure("shape", f"the op's pieces under the derived placement: {exc}") from None
    return equations, CaseValues(case.inputs, case.var_pieces, g, g, case.assumptions)
