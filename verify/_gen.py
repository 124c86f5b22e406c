"""Small instances of left-hand sides: shapes of the pattern variables and values of the attributes.

These instances *are* the ranges of a bounded proof (docs/verify.md, "Ranges"): the proof is exhaustive over
them, so every generator below enumerates its range completely (no sampling) unless ``GenConfig.sample`` is
set (the numeric back-up, which only wants a few large cases, samples rank 3-4 from an orthogonal array).

* every dim of every tensor of a left-hand side (variables and intermediate results) is in ``dims`` (1-4);
* free tensors (a variable no operator constrains) and unary/normalization operands: every shape of rank
  0-4 (``max_rank``); other families (conv, pool, reshape, slice, gather, reduce…): rank <= ``other_rank``;
* broadcasting ops: every output shape and every pattern of which operands are full, size 1 or missing at
  each position (rank <= 3; at rank 4 the dims are ``rank4_dims``, 1, 2 and 4);
* MatMul: every rank pair 1-4 x 1-4, every (m, k, n), every batch dim with every broadcast pattern (rank-4
  pairs: m, k, n and batch dims in ``rank4_dims``);
* Concat (rank 1-4): 1-2 operands (3 up to rank 2), every axis, every size of every operand along it;
  Split (rank 1-4): every composition of the dim into 1-3 parts; Transpose (rank 1-4): every permutation.

``SYMBOLIC`` stands for a float attribute (alpha, epsilon…): it is a free symbol in the proof.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from unity_eq.ops.cases import (
    shape_pool,
    shapes_of_rank,
)
from unity_eq.ops.registry import OPS
from unity_eq.ops.spec import OpSpec
from unity_eq.rulefile.terms import App, Lit, Term, Var, walk
from unity_eq.verify._instances import GenConfig, instances_by_output, op_instances
from unity_eq.verify._semantics import LISTS, PARALLEL, SYMBOLIC, VarSpec
from unity_eq.verify._tensor import NEGATIVE_AXES

# The instances per operator live in _instances; the prover imports them from here.
__all__ = ["SYMBOLIC", "GenConfig", "generate_lhs", "op_instances", "required_ranks", "shapes_of_rank"]

NONE = "<none>"  # a wanted NoneT


# ----------------------------------------------------------------------------------------------------------
# Shapes


_LIST_POOL = [(2,), (4,), (1, 2), (2, 2), (4, 2)]


# ----------------------------------------------------------------------------------------------------------
# Left-hand sides


def required_ranks(guards: Sequence[Term]) -> dict[str, int]:
    """The ranks a rule's guards pin with a literal: ``(= 4 (vec-length (shape q)))`` (either side). Each is a
    conjunct of the guards, so a binding of another rank fails them: the search drops it where it binds the
    variable instead of enumerating everything nested beside it first (the same cases come out)."""
    ranks: dict[str, int] = {}
    for guard in guards:
        if not (isinstance(guard, App) and guard.head == "=" and len(guard.args) == 2):
            continue
        for lit, term in (guard.args, guard.args[::-1]):
            if (
                isinstance(lit, Lit)
                and isinstance(lit.value, int)
                and isinstance(term, App)
                and term.head == "vec-length"
                and isinstance(shape := term.args[0], App)
                and shape.head == "shape"
                and isinstance(var := shape.args[0], Var)
            ):
                ranks[var.name] = lit.value
    return ranks


def generate_lhs(
    lhs: Term,
    sorts: dict[str, str],
    axes: Sequence[str],
    cfg: GenConfig = GenConfig(),
    ranks: dict[str, int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Bindings of the left-hand side's variables: tensor variables map to VarSpec (or None for NoneT),
    list variables to lists of VarSpec, attribute variables to values, axis variables to mesh axes.
    ``ranks``: tensor variables bound only to shapes of that rank (:func:`required_ranks`)."""
    gen = _Gen(sorts, tuple(axes), cfg, ranks or {})
    # the root is searched, not memoized: its bindings come one by one (a caller may stop early)
    if sorts.get(str(lhs)) == "TList" or (isinstance(lhs, App) and lhs.head in LISTS):
        for binding, _shapes in gen._list(lhs, None, {}):
            yield binding
    else:
        for binding, _shape in gen._tensor(lhs, None, {}, False):
            yield binding


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    return (type(value).__name__, value)


class _Gen:
    """The search for bindings, top-down. What a subterm yields depends only on the term, what it must
    produce and the values already bound to its own variables, so it is computed once per such key and
    replayed (a nested operator is otherwise searched again under every instance of its parent, most of
    them dead ends): the same bindings in the same order, much faster."""

    def __init__(self, sorts: dict[str, str], axes: tuple[str, ...], cfg: GenConfig, ranks: dict[str, int]) -> None:
        self.sorts = sorts
        self.axes = axes
        self.cfg = cfg
        self.ranks = ranks
        self._vars: dict[Term, tuple[str, ...]] = {}
        self._memo: dict[Any, list[tuple[dict[str, Any], Any]]] = {}

    def _replay(
        self, key: Any, term: Term, binding: dict[str, Any], search: Callable[[], Iterator[tuple[dict[str, Any], Any]]]
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        names = self._vars.get(term)
        if names is None:
            names = tuple(dict.fromkeys(t.name for t in walk(term) if isinstance(t, Var)))
            self._vars[term] = names
        bound = tuple((n, _frozen(binding[n])) for n in names if n in binding)
        full = (key, bound)
        got = self._memo.get(full)
        if got is None:
            got = []
            for b, out in search():
                got.append(({k: v for k, v in b.items() if k not in binding}, out))
            self._memo[full] = got
        for delta, out in got:
            shape = list(out) if isinstance(out, list) else out
            if not delta:
                yield binding, shape
            else:
                yield {**binding, **{k: list(v) if isinstance(v, list) else v for k, v in delta.items()}}, shape

    def tensor(
        self,
        term: Term,
        want: Any,
        binding: dict[str, Any],
        optional: bool,
        integer: VarSpec | None = None,
        pool: Sequence[tuple[int, ...]] | None = None,
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        """Bindings under which ``term`` is a tensor of shape ``want`` (None: any; NONE: absent)."""
        if not isinstance(term, App):
            return self._tensor(term, want, binding, optional, integer, pool)
        key = ("T", term, want, optional, integer, None if pool is None else tuple(pool))
        return self._replay(key, term, binding, lambda: self._tensor(term, want, binding, optional, integer, pool))

    def _tensor(
        self,
        term: Term,
        want: Any,
        binding: dict[str, Any],
        optional: bool,
        integer: VarSpec | None = None,
        pool: Sequence[tuple[int, ...]] | None = None,
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        if isinstance(term, Var):
            if term.name in binding:
                spec = binding[term.name]
                shape = NONE if spec is None else spec.shape
                if want is None or want == shape:
                    yield binding, shape
                return
            if want == NONE:
                yield {**binding, term.name: None}, NONE
                return
            rank = self.ranks.get(term.name)
            if want is not None:
                if rank is not None and len(want) != rank:
                    return
                spec = integer if integer is not None and integer.shape == want else VarSpec(want)
                yield {**binding, term.name: spec}, want
                return
            for shape in pool if pool is not None else shape_pool(self.cfg):
                if rank is None or len(shape) == rank:
                    yield {**binding, term.name: VarSpec(shape)}, shape
            if optional:
                yield {**binding, term.name: None}, NONE
            return
        if isinstance(term, Lit):
            return
        head = term.head
        if head == "NoneT":
            if want is None or want == NONE:
                yield binding, NONE
            return
        if head in PARALLEL:
            yield from self._parallel(term, want, binding)
            return
        spec = OPS.get(head)
        if spec is None:
            return  # Input/Weight/Opaque leaves in a pattern: not generated
        instances = op_instances(head, self.cfg) if want is None else instances_by_output(head, self.cfg).get(want, ())
        for args, out in instances:
            yield from self._unify(spec, term.args, args, binding, out)

    def _parallel(self, term: App, want: Any, binding: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Any]]:
        x, axis_arg = term.args[0], term.args[-1]
        for b1, _axis in self._value(axis_arg, list(self.axes), binding):
            for b2, shape in self.tensor(x, want, b1, False):
                if shape == NONE:
                    continue
                if term.head in ("Partition", "Combine"):
                    for b3, _d in self._value(term.args[1], list(range(len(shape))), b2):
                        yield b3, shape
                else:
                    yield b2, shape

    def _value(
        self, term: Term, candidates: list[Any], binding: dict[str, Any]
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        if isinstance(term, Var):
            if term.name in binding:
                yield binding, binding[term.name]
            else:
                for c in candidates:
                    yield {**binding, term.name: c}, c
        elif isinstance(term, Lit):
            yield binding, term.value

    def _unify(
        self, spec: OpSpec, pattern: Sequence[Term], args: Sequence[Any], binding: dict[str, Any], out: Any
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        sorts = [a.sort for a in spec.args] + (["i64"] if spec.multi_output else [])
        optional = [a.optional for a in spec.args] + ([False] if spec.multi_output else [])
        # A variable scalar axis ranges over the non-negative spellings only (the encoder's: every axis in
        # the engine's e-graph is one, and a bounded proof's domain records the axis values it covered, so
        # the engine fires the rule only on them); a literal axis, -1 included, matches the instance that
        # spells it. Vectors of axes (Slice, reductions) range over every spelling: a domain records only
        # their length.
        negative_at = NEGATIVE_AXES[spec.name][0] if spec.name in NEGATIVE_AXES else -1
        for p, value, sort in zip(pattern, args, sorts, strict=False):
            rank = self.ranks.get(p.name) if isinstance(p, Var) and sort == "T" else None
            if rank is not None and value is not None and len(value.shape) != rank:
                return  # a variable of a pinned rank, before the operands nested beside it are searched

        def go(i: int, b: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if i == len(pattern):
                yield b
                return
            p, value, sort = pattern[i], args[i], sorts[i]
            if sort == "T":
                want = NONE if value is None else value.shape
                integer = value if isinstance(value, VarSpec) and value.integer else None
                for b2, _s in self.tensor(p, want, b, optional[i], integer):
                    yield from go(i + 1, b2)
            elif sort == "TList":
                for b2, _s in self.list_(p, value, b):
                    yield from go(i + 1, b2)
            elif isinstance(p, Var):
                if p.name in b:
                    if b[p.name] == value or (sort == "f64"):
                        yield from go(i + 1, b)
                elif not (i == negative_at and isinstance(value, int) and value < 0):
                    yield from go(i + 1, {**b, p.name: value})
            elif isinstance(p, Lit):
                if sort == "f64" or p.value == value or (sort == "IVec" and tuple(p.value) == tuple(value)):
                    yield from go(i + 1, b)
            elif (
                isinstance(p, App)
                and p.head in ("vec-of", "vec-empty")
                and tuple(int(a.value) for a in p.args if isinstance(a, Lit)) == tuple(value)
            ):
                yield from go(i + 1, b)

        for b in go(0, binding):
            yield b, out

    def list_(
        self, term: Term, want: list[VarSpec] | None, binding: dict[str, Any]
    ) -> Iterator[tuple[dict[str, Any], list[Any]]]:
        if not isinstance(term, App):
            return self._list(term, want, binding)
        key = ("TList", term, None if want is None else tuple(want))
        return self._replay(key, term, binding, lambda: self._list(term, want, binding))

    def _list(
        self, term: Term, want: list[VarSpec] | None, binding: dict[str, Any]
    ) -> Iterator[tuple[dict[str, Any], list[Any]]]:
        if isinstance(term, Var):
            if term.name in binding:
                got = binding[term.name]
                if want is None or [s.shape for s in want] == [s.shape for s in got]:
                    yield binding, got
                return
            if want is not None:
                yield {**binding, term.name: list(want)}, list(want)
                return
            for length in range(3):
                for shapes in itertools.product(_LIST_POOL, repeat=length):
                    specs = [VarSpec(s) for s in shapes]
                    yield {**binding, term.name: specs}, specs
            return
        if not isinstance(term, App):
            return
        if term.head == "TNil":
            if not want:
                yield binding, []
            return
        if term.head == "TCons":
            head_want = want[0].shape if want else None
            if want is not None and not want:
                return
            for b1, shape in self.tensor(term.args[0], head_want, binding, False, pool=_LIST_POOL):
                if shape == NONE:
                    continue
                rest_want = want[1:] if want is not None else None
                for b2, rest in self.list_(term.args[1], rest_want, b1):
                    yield b2, [VarSpec(shape), *rest]
            return
        if term.head == "PList":
            for b1, _axis in self._value(term.args[2], list(self.axes), binding):
                for b2, items in self.list_(term.args[0], want, b1):
                    for b3, _d in self._value(term.args[1], list(range(4)), b2):
                        yield b3, items
