"""The rule generator's first phases: enumerate small terms over an operator set and fingerprint them exactly.

Terms are built Ruler-style, size by size, over the *representatives* of the fingerprint classes found so
far: a new term whose fingerprint is new becomes the representative of a new class (and a building block of
larger terms); a new term whose fingerprint is known is an **equation** with that class's representative, a
candidate rule. Size is the number of operators in the term's DAG, with two exceptions that stand for how a
device reads an input: ``Partition(x, d, ax)`` and ``Replicate(x, ax)`` of an input tensor are free (they
are also free in the cost model: weights and inputs are sliced when loaded).

**Inputs** (:class:`InputSpec`): a few tensors with concrete shapes chosen so that the operators (and
splitting on a mesh axis of size 2) apply, each replicated (``R``), or standing for any sharded (``S(d)``)
or pending-sum (``P``) value, whose placement the left-hand side of a rule must then pin.

**Fingerprint**: the term is evaluated on one mesh axis of size 2, on random integer inputs, with exact
arithmetic (Python integers and fractions, :class:`ExactBackend`) through the verifier's own operator
semantics (:func:`unity_eq.verify._tensor.evaluate`), both globally and on every device. Uninterpreted
functions (Relu…) are random oracles: a fixed random integer per (function, argument), so equal fingerprints
mean equal for every function, as the prover assumes. The placement of a term follows from its parallel ops
(``Partition`` is ``S(d)``, ``Combine`` and ``Reduce`` are ``R``, ``Replicate`` is ``D``, a regular op of
replicated operands is ``R``); a regular op with a sharded, partial or replicated-for-sharding operand is a
*core* whose placement is the one its pieces are consistent with. The fingerprint is (shape, placement,
global value): two terms with equal fingerprints are one e-class.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from unity_eq.collectives import TERMS
from unity_eq.ir import Mesh
from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._semantics import State, chunk_of
from unity_eq.verify._tensor import NumpyBackend, ShapeError, evaluate, infer_shape

__all__ = [
    "DEFAULT_INPUTS",
    "DEFAULT_OPS",
    "PARALLEL_OPS",
    "Enumeration",
    "ExactBackend",
    "InputSpec",
    "TermInfo",
    "enumerate_terms",
]

AXIS = "x"
AXIS_SIZE = 2
MESH = Mesh((AXIS,), (AXIS_SIZE,))
PARALLEL_OPS = TERMS  # the collective kinds' constructors, in registry order (unity_eq.collectives)
#: the operators of issue #5's example run
DEFAULT_OPS = ("MatMul", "Add", "Relu", "Concat", "Split", "Transpose", *PARALLEL_OPS)
SUPPORTED_OPS = (*DEFAULT_OPS, "Gemm", "Reshape")

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


@dataclass
class Enumeration:
    """Every class representative, every equation (term, representative) and the counts."""

    inputs: tuple[InputSpec, ...]
    ops: tuple[str, ...]
    max_size: int
    reps: list[TermInfo] = field(default_factory=list)
    classes: dict[tuple[Any, ...], TermInfo] = field(default_factory=dict)
    equations: list[tuple[TermInfo, TermInfo]] = field(default_factory=list)
    evaluated: int = 0
    invalid: int = 0
    by_size: dict[int, int] = field(default_factory=dict)
    evaluator: Evaluator | None = None


class _Invalid(Exception):
    """The term is not a term of a sound e-graph (a placement conflict, pieces that fit no placement)."""


def _lit_int(value: int) -> Lit:
    return Lit(value, "i64")


def _axis_lit() -> Lit:
    return Lit(AXIS, "String")


def _ivec(values: Sequence[int]) -> Lit:
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


# ----------------------------------------------------------------------------------------------------------
# Candidate terms


def _split_options(
    shape: tuple[int, ...], dims: set[int], boundaries: dict[tuple[int, int], set[tuple[int, int]]]
) -> Iterator[tuple[tuple[int, ...], int]]:
    """Sizes and axis of the Splits tried on a tensor of ``shape``.

    Per axis: a split at no natural boundary (its first part the smallest size that is no input dim), which
    stands for any sizes; and every split at the boundary of two inputs concatenated along that axis, counted
    from the last (the MatMul merge splits x @ Concat(w, v) where w ends)."""
    for axis, n in enumerate(shape):
        first = next((k for k in range(1, n) if k not in dims and n - k not in dims and 2 * k != n), None)
        if first is not None:
            yield (first, n - first), axis
        for a, b in sorted(boundaries.get((len(shape) - axis, 0), ())):
            if a + b == n:
                yield (a, b), axis


def _transpose_perms(rank: int) -> list[tuple[int, ...]]:
    if rank == 2:
        return [(1, 0)]
    if rank == 3:
        return [(0, 2, 1), (1, 0, 2)]
    return []


def _reshape_targets(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Merge the two leading dims, or split the first in two (rank 2 <-> 3)."""
    out: list[tuple[int, ...]] = []
    if len(shape) == 3:
        out.append((shape[0] * shape[1], shape[2]))
    if len(shape) == 2 and shape[0] % 2 == 0 and shape[0] > 2:
        out.append((2, shape[0] // 2, shape[1]))
    return out


class _Builder:
    def __init__(self, ops: Sequence[str], inputs: Sequence[InputSpec]) -> None:
        self.ops = set(ops)
        self.dims = {n for spec in inputs for n in spec.shape}
        self.boundaries: dict[tuple[int, int], set[tuple[int, int]]] = {}
        plain = [spec for spec in inputs if spec.kind == "R"]
        for a, b in itertools.product(plain, repeat=2):  # dims at the same place counted from the last
            for back in range(1, min(len(a.shape), len(b.shape)) + 1):
                self.boundaries.setdefault((back, 0), set()).add((a.shape[-back], b.shape[-back]))
        self.biases = [Var(s.name) for s in inputs if s.kind == "R" and len(s.shape) == 1]

    def unary(self, rep: TermInfo) -> Iterator[Term]:
        t, shape = rep.term, rep.shape
        if rep.core:  # a core only under the collective that ends it
            if rep.state[0] == "S" and "Combine" in self.ops:
                yield App("Combine", (t, _lit_int(rep.state[1]), _axis_lit()))
            if rep.state == P and "Reduce" in self.ops:
                yield App("Reduce", (t, _axis_lit()))
            return
        if "Relu" in self.ops:
            yield App("Relu", (t,))
        if "Transpose" in self.ops:
            for perm in _transpose_perms(len(shape)):
                yield App("Transpose", (t, _ivec(perm)))
        if "Split" in self.ops:
            for sizes, axis in _split_options(shape, self.dims, self.boundaries):
                for index in range(len(sizes)):
                    yield App("Split", (t, _ivec(sizes), _lit_int(axis), _lit_int(index)))
        if "Reshape" in self.ops:
            for target in _reshape_targets(shape):
                yield App("Reshape", (t, _ivec(target), _lit_int(0)))
        leaf = isinstance(t, Var) or is_variant(t)  # Partition/Replicate of an input are leaves already
        if "Partition" in self.ops and rep.state == R and not leaf:
            for d, n in enumerate(shape):
                if n % AXIS_SIZE == 0:
                    yield App("Partition", (t, _lit_int(d), _axis_lit()))
        if "Combine" in self.ops and rep.state[0] == "S":
            yield App("Combine", (t, _lit_int(rep.state[1]), _axis_lit()))
        if "Reduce" in self.ops and rep.state == P:
            yield App("Reduce", (t, _axis_lit()))

    def binary(self, a: TermInfo, b: TermInfo) -> Iterator[Term]:
        if a.core or b.core:
            return
        ta, tb, sa, sb = a.term, b.term, a.shape, b.shape
        if "MatMul" in self.ops and len(sa) >= 2 and len(sb) >= 2 and sa[-1] == sb[-2]:
            yield App("MatMul", (ta, tb))
        if "Add" in self.ops and a.index < b.index and _broadcasts(sa, sb):
            yield App("Add", (ta, tb))  # one operand order (commutativity is not a rule, DESIGN.md), no x + x
        if "Concat" in self.ops and len(sa) == len(sb) and sa:
            for axis in range(len(sa)):
                if all(x == y for i, (x, y) in enumerate(zip(sa, sb, strict=True)) if i != axis):
                    yield App("Concat", (tlist([ta, tb]), _lit_int(axis)))
        if "Gemm" in self.ops and len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0]:
            one = Lit(1.0, "f64")
            yield App("Gemm", (ta, tb, App("NoneT"), one, one, _lit_int(0), _lit_int(0)))
            for bias in self.biases:
                yield App("Gemm", (ta, tb, bias, one, one, _lit_int(0), _lit_int(0)))


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        infer_shape("Add", [a, b])
    except ShapeError:
        return False
    return True


def _leaves(inputs: Sequence[InputSpec], ops: Sequence[str]) -> list[Term]:
    out: list[Term] = []
    for spec in inputs:
        v = Var(spec.name)
        out.append(v)
        if spec.kind != "R":
            continue
        if "Partition" in ops:
            for d, n in enumerate(spec.shape):
                if n % AXIS_SIZE == 0:
                    out.append(App("Partition", (v, _lit_int(d), _axis_lit())))
        if "Replicate" in ops:
            out.append(App("Replicate", (v, _axis_lit())))
    return out


def enumerate_terms(
    ops: Sequence[str] = DEFAULT_OPS,
    max_size: int = 3,
    inputs: Sequence[InputSpec] = DEFAULT_INPUTS,
    seed: int = 0,
    progress: Any = None,
) -> Enumeration:
    """Every class of terms of up to ``max_size`` operators, with the equations found on the way."""
    unknown = [op for op in ops if op not in SUPPORTED_OPS]
    if unknown:
        raise ValueError(f"no enumeration for {', '.join(unknown)}; supported: {', '.join(SUPPORTED_OPS)}")
    enum = Enumeration(tuple(inputs), tuple(ops), max_size)
    ev = Evaluator(inputs, seed)
    enum.evaluator = ev
    builder = _Builder(ops, inputs)
    by_gen: dict[int, list[TermInfo]] = {0: []}

    def add(term: Term, generation: int) -> None:
        if term in ev.infos:
            return  # built before, from other representatives
        enum.evaluated += 1
        info = ev.info(term)
        if info is None:
            enum.invalid += 1
            return
        known = enum.classes.get(info.fingerprint)
        if known is not None:
            enum.equations.append((info, known))
            return
        info.index = len(enum.reps)
        enum.classes[info.fingerprint] = info
        enum.reps.append(info)
        by_gen.setdefault(generation, []).append(info)
        enum.by_size[info.size] = enum.by_size.get(info.size, 0) + 1

    for leaf in _leaves(inputs, ops):
        add(leaf, 0)
    for k in range(1, max_size + 1):
        before = len(enum.reps)
        for rep in by_gen.get(k - 1, []):
            for term in builder.unary(rep):
                add(term, k)
        for i in range(k):
            j = k - 1 - i
            for a, b in itertools.product(by_gen.get(i, []), by_gen.get(j, [])):
                for term in builder.binary(a, b):
                    add(term, k)
        if progress:
            progress(k, len(enum.reps) - before, enum.evaluated)
    return enum
