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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from unity_eq.ops.cases import (
    shape_pool,
    shapes_of_rank,
)
from unity_eq.ops.registry import OPS
from unity_eq.ops.spec import OpSpec
from unity_eq.rulefile.terms import App, Lit, Term, Var, walk
from unity_eq.verify._instances import GenConfig, instances_by_output, op_instances
from unity_eq.verify._rank_facts import RankFacts, project, rank_facts
from unity_eq.verify._semantics import LISTS, PARALLEL, SYMBOLIC, VarSpec
from unity_eq.verify._tensor import NEGATIVE_AXES

# The instances per operator live in _instances; the prover imports them from here.
__all__ = ["SYMBOLIC", "GenConfig", "RankFacts", "generate_lhs", "op_instances", "rank_facts", "shapes_of_rank"]

NONE = "<none>"  # a wanted NoneT
Hints = dict[str, int]  # ranks and values of variables an instance gives an op's operands before they are bound
_NO_HINTS: Hints = {}


# ----------------------------------------------------------------------------------------------------------
# Shapes


_LIST_POOL = [(2,), (4,), (1, 2), (2, 2), (4, 2)]


# ----------------------------------------------------------------------------------------------------------
# Left-hand sides


def generate_lhs(
    lhs: Term,
    sorts: dict[str, str],
    axes: Sequence[str],
    cfg: GenConfig = GenConfig(),
    facts: RankFacts | None = None,
) -> Iterator[dict[str, Any]]:
    """Bindings of the left-hand side's variables: tensor variables map to VarSpec (or None for NoneT),
    list variables to lists of VarSpec, attribute variables to values, axis variables to mesh axes.
    ``facts``: the rule's rank facts (:func:`unity_eq.verify._rank_facts.rank_facts`); a binding on which one
    is false is dropped as soon as the variables it reads are known (the guards would reject every case of
    it), so the bindings that come are those of the search without them, in the same order, less some that
    the guards reject."""
    gen = _Gen(sorts, tuple(axes), cfg, facts if facts else None)
    # the root is searched, not memoized: its bindings come one by one (a caller may stop early)
    if sorts.get(str(lhs)) == "TList" or (isinstance(lhs, App) and lhs.head in LISTS):
        for binding, _shapes in gen._list(lhs, None, {}, _NO_HINTS):
            yield binding
    else:
        for binding, _shape in gen._tensor(lhs, None, {}, False, hints=_NO_HINTS):
            yield binding


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    return (type(value).__name__, value)


class _Gen:
    """The search for bindings, top-down. What a subterm yields depends only on the term, what it must
    produce, the values already bound to its own variables and, under rank facts, what is known of the
    variables those facts tie to its own (bound elsewhere, or ``hints``: the shapes and values that a parent
    op's instance gives its variable operands, known before the operands nested beside them are searched).
    So it is computed once per such key and replayed (a nested operator is otherwise searched again under
    every instance of its parent, most of them dead ends): the same bindings in the same order, much faster."""

    def __init__(self, sorts: dict[str, str], axes: tuple[str, ...], cfg: GenConfig, facts: RankFacts | None) -> None:
        self.sorts = sorts
        self.axes = axes
        self.cfg = cfg
        self.facts = facts
        self._vars: dict[Term, tuple[str, ...]] = {}
        self._related: dict[Term, tuple[str, ...]] = {}
        self._memo: dict[Any, list[tuple[dict[str, Any], Any]]] = {}

    # --- rank facts
    def _known(self, name: str, binding: dict[str, Any], hints: Hints) -> int | None:
        if name in binding:
            return project(binding[name], self.sorts.get(name))
        return hints.get(name)

    def _rejects(self, names: Iterable[str], binding: dict[str, Any], hints: Hints) -> bool:
        """True when a rank fact over ``names`` is false on what is known (``hints`` override nothing bound)."""
        facts = self.facts
        assert facts is not None
        for index in {facts.component_of[n] for n in names if n in facts.component_of}:
            known = tuple(self._known(n, binding, hints) for n in facts.components[index].lhs_vars)
            if facts.violated(index, known):
                return True
        return False

    def _rejects_rank(self, name: str, rank: int, binding: dict[str, Any], hints: Hints) -> bool:
        facts = self.facts
        return (
            facts is not None and name in facts.component_of and self._rejects((name,), binding, {**hints, name: rank})
        )

    def _context(self, term: Term, binding: dict[str, Any], hints: Hints) -> tuple[int | None, ...]:
        """What the search of ``term`` reads beyond its own bound variables: the known values of every
        variable that a rank fact ties to one of its own."""
        if self.facts is None:
            return ()
        related = self._related.get(term)
        if related is None:
            facts = self.facts
            own = {t.name for t in walk(term) if isinstance(t, Var)}
            comps = sorted({facts.component_of[n] for n in own if n in facts.component_of})
            related = tuple(n for c in comps for n in facts.components[c].lhs_vars)
            self._related[term] = related
        return tuple(self._known(n, binding, hints) for n in related)

    def _hints(
        self, pattern: Sequence[Term], args: Sequence[Any], sorts: Sequence[str], binding: dict[str, Any], hints: Hints
    ) -> Hints | None:
        """``hints`` with what this instance gives the variable operands not bound yet (the first occurrence
        of one: a second that differs yields nothing anyway); None when a rank fact is then false."""
        facts = self.facts
        if facts is None:
            return hints
        new: dict[str, int] = {}
        for p, value, sort in zip(pattern, args, sorts, strict=False):
            if isinstance(p, Var) and p.name in facts.component_of and p.name not in binding and p.name not in new:
                known = project(value, sort)
                if known is not None:
                    new[p.name] = known
        if not new:
            return hints
        merged = {**hints, **new}
        return None if self._rejects(new, binding, merged) else merged

    # --- the search
    def _replay(
        self,
        key: Any,
        term: Term,
        binding: dict[str, Any],
        hints: Hints,
        search: Callable[[], Iterator[tuple[dict[str, Any], Any]]],
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        names = self._vars.get(term)
        if names is None:
            names = tuple(dict.fromkeys(t.name for t in walk(term) if isinstance(t, Var)))
            self._vars[term] = names
        bound = tuple((n, _frozen(binding[n])) for n in names if n in binding)
        full = (key, bound, self._context(term, binding, hints))
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
        hints: Hints = _NO_HINTS,
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        """Bindings under which ``term`` is a tensor of shape ``want`` (None: any; NONE: absent)."""
        if not isinstance(term, App):
            return self._tensor(term, want, binding, optional, integer, pool, hints)
        key = ("T", term, want, optional, integer, None if pool is None else tuple(pool))
        return self._replay(
            key, term, binding, hints, lambda: self._tensor(term, want, binding, optional, integer, pool, hints)
        )

    def _tensor(
        self,
        term: Term,
        want: Any,
        binding: dict[str, Any],
        optional: bool,
        integer: VarSpec | None = None,
        pool: Sequence[tuple[int, ...]] | None = None,
        hints: Hints = _NO_HINTS,
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        if isinstance(term, Var):
            yield from self._variable(term.name, want, binding, optional, integer, pool, hints)
            return
        if isinstance(term, Lit):
            return
        head = term.head
        if head == "NoneT":
            if want is None or want == NONE:
                yield binding, NONE
            return
        if head in PARALLEL:
            yield from self._parallel(term, want, binding, hints)
            return
        spec = OPS.get(head)
        if spec is None:
            return  # Input/Weight/Opaque leaves in a pattern: not generated
        instances = op_instances(head, self.cfg) if want is None else instances_by_output(head, self.cfg).get(want, ())
        for args, out in instances:
            yield from self._unify(spec, term.args, args, binding, out, hints)

    def _variable(
        self,
        name: str,
        want: Any,
        binding: dict[str, Any],
        optional: bool,
        integer: VarSpec | None,
        pool: Sequence[tuple[int, ...]] | None,
        hints: Hints,
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        if name in binding:
            spec = binding[name]
            shape = NONE if spec is None else spec.shape
            if want is None or want == shape:
                yield binding, shape
            return
        if want == NONE:
            if not self._rejects_rank(name, 0, binding, hints):
                yield {**binding, name: None}, NONE
            return
        if want is not None:
            if not self._rejects_rank(name, len(want), binding, hints):
                spec = integer if integer is not None and integer.shape == want else VarSpec(want)
                yield {**binding, name: spec}, want
            return
        rejected: dict[int, bool] = {}
        for shape in pool if pool is not None else shape_pool(self.cfg):
            rank = len(shape)
            if rank not in rejected:
                rejected[rank] = self._rejects_rank(name, rank, binding, hints)
            if not rejected[rank]:
                yield {**binding, name: VarSpec(shape)}, shape
        if optional and not self._rejects_rank(name, 0, binding, hints):
            yield {**binding, name: None}, NONE

    def _parallel(
        self, term: App, want: Any, binding: dict[str, Any], hints: Hints
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        x, axis_arg = term.args[0], term.args[-1]
        for b1, _axis in self._value(axis_arg, list(self.axes), binding):
            for b2, shape in self.tensor(x, want, b1, False, hints=hints):
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
        self,
        spec: OpSpec,
        pattern: Sequence[Term],
        args: Sequence[Any],
        binding: dict[str, Any],
        out: Any,
        hints: Hints = _NO_HINTS,
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        sorts = [a.sort for a in spec.args] + (["i64"] if spec.multi_output else [])
        optional = [a.optional for a in spec.args] + ([False] if spec.multi_output else [])
        # A variable scalar axis ranges over the non-negative spellings only (the encoder's: every axis in
        # the engine's e-graph is one, and a bounded proof's domain records the axis values it covered, so
        # the engine fires the rule only on them); a literal axis, -1 included, matches the instance that
        # spells it. Vectors of axes (Slice, reductions) range over every spelling: a domain records only
        # their length.
        negative_at = NEGATIVE_AXES[spec.name][0] if spec.name in NEGATIVE_AXES else -1
        # what this instance gives its variable operands, checked before the operands nested beside them are
        # searched (and known while they are)
        inner = self._hints(pattern, args, sorts, binding, hints)
        if inner is None:
            return

        def go(i: int, b: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if i == len(pattern):
                yield b
                return
            p, value, sort = pattern[i], args[i], sorts[i]
            if sort == "T":
                want = NONE if value is None else value.shape
                integer = value if isinstance(value, VarSpec) and value.integer else None
                for b2, _s in self.tensor(p, want, b, optional[i], integer, hints=inner):
                    yield from go(i + 1, b2)
            elif sort == "TList":
                for b2, _s in self.list_(p, value, b, inner):
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
        self, term: Term, want: list[VarSpec] | None, binding: dict[str, Any], hints: Hints = _NO_HINTS
    ) -> Iterator[tuple[dict[str, Any], list[Any]]]:
        if not isinstance(term, App):
            return self._list(term, want, binding, hints)
        key = ("TList", term, None if want is None else tuple(want))
        return self._replay(key, term, binding, hints, lambda: self._list(term, want, binding, hints))

    def _list(
        self, term: Term, want: list[VarSpec] | None, binding: dict[str, Any], hints: Hints = _NO_HINTS
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
            for b1, shape in self.tensor(term.args[0], head_want, binding, False, pool=_LIST_POOL, hints=hints):
                if shape == NONE:
                    continue
                rest_want = want[1:] if want is not None else None
                for b2, rest in self.list_(term.args[1], rest_want, b1, hints):
                    yield b2, [VarSpec(shape), *rest]
            return
        if term.head == "PList":
            for b1, _axis in self._value(term.args[2], list(self.axes), binding):
                for b2, items in self.list_(term.args[0], want, b1, hints):
                    for b3, _d in self._value(term.args[1], list(range(4)), b2):
                        yield b3, items
