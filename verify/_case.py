"""One case of a rule evaluated on one backend: every term's global value and its piece on every device.

:mod:`unity_eq.verify._semantics` turns these values into the equations a sound rule satisfies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import z3

from unity_eq.ir import Mesh
from unity_eq.ops.dtypes import is_integer
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._placement import PARALLEL, Placements, State
from unity_eq.verify._tensor import (
    NumpyBackend,
    NumpyIntegerBackend,
    ShapeError,
    Z3Backend,
    Z3IntegerBackend,
    evaluate,
)
from unity_eq.verify._types import TypeProblem, term_dtypes


@dataclass(frozen=True)
class VarSpec:
    """A tensor pattern variable in one case: its global shape; ``integer`` for index tensors (Gather),
    whose values lie in [-high, high)."""

    shape: tuple[int, ...]
    integer: bool = False
    high: int = 0
    #: a ``(nonzero-values x)`` guard holds: every element is drawn (numpy) or assumed (z3) non-zero
    nonzero: bool = False


class EvalFailure(Exception):
    """A term cannot be evaluated in this case: ``kind`` is ``shape`` or ``placement``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


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


class CaseEvaluator:
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
        if spec.nonzero and not isinstance(self.bk, Z3Backend):
            parts = {c: np.where(p == 0, 1.0, p) for c, p in parts.items()}  # drawn again where it hit 0
        total = parts[()] if not partial else self.bk.sum_pieces([parts[c] for c in combos])
        if spec.nonzero and isinstance(self.bk, Z3Backend):
            for sym in total.reshape(-1):
                self.assumptions += [sym != 0, sym * self.bk.reciprocal(sym) == 1]
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
