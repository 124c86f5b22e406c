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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unity_eq.errors import OptionError
from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._fingerprint import (
    AXIS,
    AXIS_SIZE,
    DEFAULT_INPUTS,
    PARALLEL_OPS,
    Evaluator,
    ExactBackend,
    InputSpec,
    TermInfo,
    axis_lit,
    is_variant,
    ivec,
    list_items,
    lit_int,
    tlist,
)
from unity_eq.verify._placement import P, R
from unity_eq.verify._tensor import ShapeError, infer_shape

# The inputs and the fingerprints live in _fingerprint; the generator's other modules import them from here.
__all__ = [
    "AXIS",
    "AXIS_SIZE",
    "DEFAULT_INPUTS",
    "DEFAULT_OPS",
    "PARALLEL_OPS",
    "SUPPORTED_OPS",
    "Enumeration",
    "Evaluator",
    "ExactBackend",
    "InputSpec",
    "TermInfo",
    "check_ops",
    "enumerate_terms",
    "is_variant",
    "list_items",
    "tlist",
]

#: the operators of issue #5's example run
DEFAULT_OPS = ("MatMul", "Add", "Relu", "Concat", "Split", "Transpose", *PARALLEL_OPS)
SUPPORTED_OPS = (*DEFAULT_OPS, "Gemm", "Reshape")


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
                yield App("Combine", (t, lit_int(rep.state[1]), axis_lit()))
            if rep.state == P and "Reduce" in self.ops:
                yield App("Reduce", (t, axis_lit()))
            return
        if "Relu" in self.ops:
            yield App("Relu", (t,))
        if "Transpose" in self.ops:
            for perm in _transpose_perms(len(shape)):
                yield App("Transpose", (t, ivec(perm)))
        if "Split" in self.ops:
            for sizes, axis in _split_options(shape, self.dims, self.boundaries):
                for index in range(len(sizes)):
                    yield App("Split", (t, ivec(sizes), lit_int(axis), lit_int(index)))
        if "Reshape" in self.ops:
            for target in _reshape_targets(shape):
                yield App("Reshape", (t, ivec(target), lit_int(0)))
        leaf = isinstance(t, Var) or is_variant(t)  # Partition/Replicate of an input are leaves already
        if "Partition" in self.ops and rep.state == R and not leaf:
            for d, n in enumerate(shape):
                if n % AXIS_SIZE == 0:
                    yield App("Partition", (t, lit_int(d), axis_lit()))
        if "Combine" in self.ops and rep.state[0] == "S":
            yield App("Combine", (t, lit_int(rep.state[1]), axis_lit()))
        if "Reduce" in self.ops and rep.state == P:
            yield App("Reduce", (t, axis_lit()))

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
                    yield App("Concat", (tlist([ta, tb]), lit_int(axis)))
        if "Gemm" in self.ops and len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0]:
            one = Lit(1.0, "f64")
            yield App("Gemm", (ta, tb, App("NoneT"), one, one, lit_int(0), lit_int(0)))
            for bias in self.biases:
                yield App("Gemm", (ta, tb, bias, one, one, lit_int(0), lit_int(0)))


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
                    out.append(App("Partition", (v, lit_int(d), axis_lit())))
        if "Replicate" in ops:
            out.append(App("Replicate", (v, axis_lit())))
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


def check_ops(text: str | Sequence[str]) -> list[str]:
    """The operator names of ``--ops`` (comma-separated), or an :class:`OptionError` naming the unknown ones."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [n.strip() for n in text]
    names = [n for n in names if n]
    if not names:
        raise OptionError(f"`--ops`: expected a comma-separated list of operators, got {text!r}.")
    known = {op.lower(): op for op in SUPPORTED_OPS}
    unknown = [n for n in names if n not in SUPPORTED_OPS and n.lower() not in known]
    if unknown:
        raise OptionError(
            f"`--ops`: unknown operator(s) {', '.join(unknown)}; the generator knows {', '.join(SUPPORTED_OPS)}."
        )
    out: list[str] = []
    for n in names:
        op = n if n in SUPPORTED_OPS else known[n.lower()]
        if op not in out:
            out.append(op)
    return out
