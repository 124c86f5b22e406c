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

from collections.abc import Iterator
from typing import Any

import numpy as np

from unity_eq.ir import Mesh
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Term, Var, walk
from unity_eq.verify._case import CaseEvaluator, CaseValues, Equation, EvalFailure, VarSpec, chunk_of
from unity_eq.verify._gradient import gradient_placements, gradient_problem
from unity_eq.verify._placement import (
    LEAVES,
    LISTS,
    PARALLEL,
    SYMBOLIC,
    Placements,
    R,
    S,
    State,
    infer_placements,
    instantiate,
    lhs_placements,
    list_elements,
    parse_state,
    propagate,
    state_str,
    tensor_nodes,
)
from unity_eq.verify._tensor import ShapeError

# The contract's parts live in _placement (states and their inference), _gradient (training) and _case (one
# case's values); the prover's other modules import them from here, where the contract is stated.
__all__ = [
    "LISTS",
    "PARALLEL",
    "SYMBOLIC",
    "CaseValues",
    "Equation",
    "EvalFailure",
    "Placements",
    "R",
    "S",
    "State",
    "VarSpec",
    "chunk_of",
    "evaluate_case",
    "gradient_placements",
    "gradient_problem",
    "infer_placements",
    "instantiate",
    "lhs_placements",
    "list_elements",
    "parse_state",
    "placement_equations",
    "propagate",
    "state_str",
    "tensor_nodes",
]


def _shape_of(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(value.shape)


def _consistency(case: CaseEvaluator, term: Term, label: str, equations: list[Equation]) -> None:
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
    case = CaseEvaluator(mesh, pl, specs, attrs, bk, dtypes)
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
    case = CaseEvaluator(mesh, pl, specs, {}, bk)
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
