"""The rule generator's exact fingerprints: its inputs, and every term evaluated globally and on every device.

The fingerprint (shape, placement, global value on random integer inputs, with exact arithmetic) is described
in :mod:`unity_eq.verify._enumerate`: two terms with equal fingerprints are one e-class.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from unity_eq.collectives import TERMS
from unity_eq.ir import Mesh
from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._semantics import State, chunk_of
from unity_eq.verify._tensor import NumpyBackend, ShapeError, evaluate

PARALLEL_OPS = TERMS  # the collective kinds' constructors, in registry order (unity_eq.collectives)
AXIS = "x"
AXIS_SIZE = 2
MESH = Mesh((AXIS,), (AXIS_SIZE,))


R: State = ("R", -1)
D: State = ("D", -1)
P: State = ("P", -1)


@dataclass(frozen=True)
class InputSpec:
    """An input tensor of the enumeration: ``kind`` R (replicated; Partition and Replicate of it are free
    leaves), S (any value sharded along ``dim``) or P (any pending sum)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "R"
    dim: int = -1

    @property
    def state(self) -> State:
        return ("S", self.dim) if self.kind == "S" else (self.kind, -1)


#: x @ w and x @ v type-check (and h @ w, h a batch of x), w and v concatenate along their columns (the MatMul
#: merge), y and z have the
#: shape of x @ w (Add), b broadcasts over it (a bias); s and t are sharded values and p, q pending sums of
#: that shape. The dims are distinct where the ops allow it, so that an equal dim in a rule is a real constraint.
DEFAULT_INPUTS = (
    InputSpec("x", (4, 6)),
    InputSpec("h", (2, 4, 6)),
    InputSpec("w", (6, 8)),
    InputSpec("v", (6, 10)),
    InputSpec("y", (4, 8)),
    InputSpec("z", (4, 8)),
    InputSpec("b", (8,)),
    InputSpec("s", (4, 8), "S", 0),
    InputSpec("t", (4, 8), "S", 1),
    InputSpec("p", (4, 8), "P"),
    InputSpec("q", (4, 8), "P"),
)


class ExactBackend(NumpyBackend):
    """Exact evaluation for fingerprints: object arrays of Python integers (and fractions, where a division
    makes one); every uninterpreted function is a random oracle on exact values."""

    name = "exact"
    exact = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(np.random.default_rng(seed))
        self._rand = random.Random(seed)
        self._oracle: dict[tuple[str, tuple[Any, ...]], int] = {}

    def _draw(self) -> int:
        return self._rand.randint(-(10**6), 10**6)

    def symbols(self, prefix: str, shape: tuple[int, ...], integer: bool = False, high: int = 0) -> np.ndarray:
        out = np.empty(shape, dtype=object)
        flat = out.reshape(-1)
        for i in range(flat.size):
            flat[i] = self._rand.randint(-high, high - 1) if integer and high else self._draw()
        return out

    def scalar(self, name: str) -> Any:
        return Fraction(self._draw(), 1)

    def apply(self, name: str, *args: Any) -> Any:
        arrays = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in args])
        out = np.empty(arrays[0].shape, dtype=object)
        flat = out.reshape(-1)
        columns = [a.reshape(-1) for a in arrays]
        for i in range(flat.size):
            key = (name, tuple(c[i] for c in columns))
            value = self._oracle.get(key)
            if value is None:
                value = self._oracle[key] = self._draw()
            flat[i] = value
        return out

    def div(self, a: Any, b: Any) -> Any:
        return np.frompyfunc(lambda x, y: Fraction(x) / y if y else Fraction(0), 2, 1)(a, b)

    def truth(self, cond: Any) -> Any:
        return np.frompyfunc(lambda c: 1 if c else 0, 1, 1)(cond)

    def sum_pieces(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        out = np.asarray(pieces[0], dtype=object)
        for piece in pieces[1:]:
            out = out + piece
        return np.asarray(out, dtype=object)


@dataclass
class TermInfo:
    """What the enumeration knows about one term."""

    term: Term
    shape: tuple[int, ...]
    state: State
    glob: np.ndarray
    pieces: list[np.ndarray]
    core: bool  # a regular op whose placement comes from its pieces (it needs a parallel op around it)
    nodes: frozenset[Term]  # the counted operator subterms (its DAG)
    vars: frozenset[str]
    fingerprint: tuple[Any, ...] = ()
    index: int = 0  # order of creation (representatives only)

    @property
    def size(self) -> int:
        return len(self.nodes)


class _Invalid(Exception):
    """The term is not a term of a sound e-graph (a placement conflict, pieces that fit no placement)."""


def lit_int(value: int) -> Lit:
    return Lit(value, "i64")


def axis_lit() -> Lit:
    return Lit(AXIS, "String")


def ivec(values: Sequence[int]) -> Lit:
    return Lit(tuple(int(v) for v in values), "IVec")


def tlist(items: Sequence[Term]) -> Term:
    out: Term = App("TNil")
    for item in reversed(items):
        out = App("TCons", (item, out))
    return out


def list_items(term: Term) -> list[Term]:
    items: list[Term] = []
    while isinstance(term, App) and term.head == "TCons":
        items.append(term.args[0])
        term = term.args[1]
    return items


def is_variant(term: Term) -> bool:
    """``Partition(x, d, ax)`` or ``Replicate(x, ax)`` of an input: a free leaf."""
    return isinstance(term, App) and term.head in ("Partition", "Replicate") and isinstance(term.args[0], Var)


class Evaluator:
    """Evaluates terms globally and on every device of the mesh, with caches shared by all terms."""

    def __init__(self, inputs: Sequence[InputSpec], seed: int = 0) -> None:
        self.bk = ExactBackend(seed)
        self.inputs = {spec.name: spec for spec in inputs}
        self.infos: dict[Term, TermInfo | None] = {}

    def _leaf(self, spec: InputSpec) -> TermInfo:
        glob = self.bk.symbols(spec.name, spec.shape)
        if spec.kind == "R":
            pieces = [glob] * MESH.size
        elif spec.kind == "S":
            pieces = [chunk_of(glob, spec.dim, r, AXIS_SIZE) for r in range(MESH.size)]
        else:  # P: random pieces that sum to the value
            first = self.bk.symbols(spec.name + ".0", spec.shape)
            pieces = [first, glob - first]
        info = TermInfo(
            Var(spec.name), spec.shape, spec.state, glob, pieces, False, frozenset(), frozenset({spec.name})
        )
        info.fingerprint = _fingerprint(info)
        return info

    def info(self, term: Term) -> TermInfo | None:
        """The term's info, or None when it is invalid (shapes do not fit, placements conflict)."""
        if term in self.infos:
            return self.infos[term]
        if isinstance(term, Var):
            got: TermInfo | None = self._leaf(self.inputs[term.name])
            self.infos[term] = got
            return got
        try:
            got = self._eval(term)
        except (_Invalid, ShapeError, ValueError, IndexError, KeyError, ZeroDivisionError):
            got = None
        self.infos[term] = got
        return got

    def _need(self, term: Term) -> TermInfo:
        got = self.info(term)
        if got is None:
            raise _Invalid(str(term))
        return got

    def _eval(self, term: Term) -> TermInfo:
        assert isinstance(term, App), term
        head, args = term.head, term.args
        if head in PARALLEL_OPS:
            return self._parallel(term)
        operands: list[TermInfo] = []
        values: list[Any] = []
        for arg in args:
            if isinstance(arg, App) and arg.head in ("TCons", "TNil"):
                items = [self._need(t) for t in list_items(arg)]
                operands.extend(items)
                values.append(items)
            elif isinstance(arg, App) and arg.head == "NoneT":
                values.append(None)
            elif isinstance(arg, Var | App):
                item = self._need(arg)
                operands.append(item)
                values.append(item)
            else:
                values.append(_exact(arg.value))
        if any(o.core for o in operands):
            raise _Invalid("a core inside a core: its placement cannot be inferred")
        glob = evaluate(head, [_glob(v) for v in values], self.bk)
        nodes = frozenset({term}).union(*(o.nodes for o in operands))
        names = frozenset().union(*(o.vars for o in operands))
        if all(o.state == R for o in operands):
            info = TermInfo(term, tuple(glob.shape), R, glob, [glob] * MESH.size, False, nodes, names)
        else:
            if any(o.state == R for o in operands):
                # sharded work reads a replicated value through Replicate (which carries its gradient)
                raise _Invalid("an R operand of sharded work without Replicate")
            if head == "Reshape":
                state, pieces = self._reshape_core(values, glob)
            else:
                pieces = [evaluate(head, [_piece(v, r) for v in values], self.bk) for r in range(MESH.size)]
                state = self._core_state(glob, pieces)
            info = TermInfo(term, tuple(glob.shape), state, glob, pieces, True, nodes, names)
        info.fingerprint = _fingerprint(info)
        return info

    def _reshape_core(self, values: list[Any], glob: np.ndarray) -> tuple[State, list[np.ndarray]]:
        for d, n in enumerate(glob.shape):  # the pieces' target shape depends on the placement: try each
            if n % AXIS_SIZE:
                continue
            local = list(glob.shape)
            local[d] //= AXIS_SIZE
            try:
                pieces = [
                    evaluate("Reshape", [_piece(values[0], r), tuple(local), values[2]], self.bk)
                    for r in range(MESH.size)
                ]
            except (ShapeError, ValueError):
                continue
            if self._consistent(glob, pieces, ("S", d)):
                return ("S", d), pieces
        raise _Invalid("Reshape pieces fit no placement")

    def _consistent(self, glob: np.ndarray, pieces: list[np.ndarray], state: State) -> bool:
        if state[0] == "P":
            return _equal(self.bk.sum_pieces(pieces), glob)
        if state[0] == "S":
            d = state[1]
            if d >= glob.ndim or glob.shape[d] % AXIS_SIZE:
                return False
            return all(_equal(p, chunk_of(glob, d, r, AXIS_SIZE)) for r, p in enumerate(pieces))
        return all(_equal(p, glob) for p in pieces)

    def _core_state(self, glob: np.ndarray, pieces: list[np.ndarray]) -> State:
        if self._consistent(glob, pieces, R):
            raise _Invalid("a regular op of replicated-for-sharding operands: no sharded consumer")
        found = [st for st in [("S", d) for d in range(glob.ndim)] + [P] if self._consistent(glob, pieces, st)]
        if len(found) != 1:
            raise _Invalid(f"pieces fit {len(found)} placements")
        return found[0]

    def _parallel(self, term: App) -> TermInfo:
        head, x = term.head, self._need(term.args[0])
        if x.core and head not in ("Combine", "Reduce"):
            raise _Invalid(f"{head} of a core")
        free = is_variant(term)
        nodes = x.nodes if free else x.nodes | {term}
        if head == "Partition":
            d = int(term.args[1].value)
            if x.state != R:
                raise _Invalid("Partition of a value that is not R")
            pieces = [chunk_of(x.glob, d, r, AXIS_SIZE) for r in range(MESH.size)]
            state: State = ("S", d)
        elif head == "Replicate":
            if x.state != R:
                raise _Invalid("Replicate of a value that is not R")
            pieces, state = list(x.pieces), D
        elif head == "Combine":
            d = int(term.args[1].value)
            if x.state != ("S", d):
                raise _Invalid("Combine of a value that is not S(d)")
            whole = np.concatenate(x.pieces, axis=d)
            pieces, state = [whole] * MESH.size, R
        else:
            if x.state != P:
                raise _Invalid("Reduce of a value that is not P")
            whole = self.bk.sum_pieces(x.pieces)
            pieces, state = [whole] * MESH.size, R
        info = TermInfo(term, x.shape, state, x.glob, pieces, False, nodes, x.vars)
        info.fingerprint = _fingerprint(info)
        return info


def _exact(value: Any) -> Any:
    return Fraction(value) if isinstance(value, float) else value


def _glob(value: Any) -> Any:
    if isinstance(value, TermInfo):
        return value.glob
    if isinstance(value, list):
        return [v.glob for v in value]
    return value


def _piece(value: Any, rank: int) -> Any:
    if isinstance(value, TermInfo):
        return value.pieces[rank]
    if isinstance(value, list):
        return [v.pieces[rank] for v in value]
    return value


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(a == b))


def _fingerprint(info: TermInfo) -> tuple[Any, ...]:
    return (info.shape, info.state, hash(tuple(info.glob.reshape(-1).tolist())))
