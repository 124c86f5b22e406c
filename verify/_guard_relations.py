"""The guard relations' Python mirrors: for each relation of the rule language, the bindings that satisfy it.

Each relation takes the guard context and its arguments (bound values, or :data:`UNBOUND`) and yields the
completed argument lists; :mod:`unity_eq.verify._guards` solves a rule's guards with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from unity_eq.ops.dtypes import FLOAT_DTYPES
from unity_eq.ops.reduce import reduce_pairs
from unity_eq.ops.reshape import reshape_pairs
from unity_eq.rulefile.terms import App, Term, Var
from unity_eq.verify._guard_context import DIMS, GuardContext, NoValue
from unity_eq.verify._semantics import (
    R,
    S,
    State,
    list_elements,
)

# ----------------------------------------------------------------------------------------------------------
# Relations


Rel = Callable[[GuardContext, list[Any]], Iterator[list[Any]]]
UNBOUND = object()


def _dims(v: Any) -> Sequence[int]:
    return DIMS if v is UNBOUND else ([v] if v in DIMS else [])


def _axes(ctx: GuardContext, v: Any) -> Sequence[str]:
    return ctx.axes if v is UNBOUND else ([v] if v in ctx.axes else [])


def _eq(v: Any, x: Any) -> bool:
    return v is UNBOUND or v == x


def _rel_mesh_axis(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for ax in _axes(ctx, a[0]):
        if _eq(a[1], ctx.sizes[ax]):
            yield [ax, ctx.sizes[ax]]


def _rel_dim_range(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for d in _dims(a[0]):
        yield [d]


def _all_states(ctx: GuardContext) -> list[State]:
    return [R, ("D", -1), ("P", -1), *(S(d) for d in DIMS)]


def _rel_placed(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    x = a[0]
    for ax in _axes(ctx, a[1]):
        st = ctx.placement(x, ax)
        if st is None:
            continue
        if a[2] is UNBOUND or a[2] == st or (a[2] == S_UNBOUND and st[0] == "S"):
            yield [x, ax, st]
        elif isinstance(x, Var) and not ctx.pl.get(x, ax) and not ctx.fixed_placements:
            # "R unless a guard says otherwise": the guard gives the variable its placement
            ctx.placed[(x.name, ax)] = a[2]
            yield [x, ax, a[2]]


S_UNBOUND = ("S", "unbound")  # ``(S d)`` with ``d`` unbound, under ``fixed_placements``


def _shards_not(st: State, d: int) -> bool:
    return not (st[0] == "S" and st[1] == d)


def _rel_shards_not(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    states = _all_states(ctx) if a[0] is UNBOUND else [a[0]]
    for st in states:
        for d in _dims(a[1]):
            if _shards_not(st, d):
                yield [st, d]


def _rel_axes(k: int) -> Rel:
    def rel(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
        if len(ctx.axes) != k:
            return
        for ax in _axes(ctx, a[0]):
            others = [o for o in ctx.axes if o != ax]
            if all(_eq(v, o) for v, o in zip(a[1:], others, strict=True)):
                yield [ax, *others]

    return rel


def _splittable(ctx: GuardContext, x: Term, d: int, ax: str) -> bool:
    if ctx.placement(x, ax) != R:
        return False
    n = ctx.sizes[ax]
    try:
        sh = ctx.shape(x)
    except NoValue:
        return False
    return n > 1 and d < len(sh) and sh[d] % n == 0 and sh[d] >= n


def _can_split(ctx: GuardContext, x: Term, d: int, ax: str) -> bool:
    if not _splittable(ctx, x, d, ax):
        return False
    for other in ctx.axes:
        if other != ax:
            st = ctx.placement(x, other)
            if st is None or not _shards_not(st, d):
                return False
    return True


def _rel_splittable(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for ax in _axes(ctx, a[2]):
        for d in _dims(a[1]):
            if _splittable(ctx, a[0], d, ax):
                yield [a[0], d, ax]


def _rel_can_split(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for ax in _axes(ctx, a[2]):
        for d in _dims(a[1]):
            if _can_split(ctx, a[0], d, ax):
                yield [a[0], d, ax]


def _is_none(t: Any) -> bool:
    return isinstance(t, App) and t.head == "NoneT"


def _rel_can_split_opt(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for ax in _axes(ctx, a[2]):
        for d in _dims(a[1]):
            if _is_none(a[0]) or _can_split(ctx, a[0], d, ax):
                yield [a[0], d, ax]


def _rel_list_can_split(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    items = list_elements(a[0])
    if not items:
        return
    for ax in _axes(ctx, a[2]):
        for d in _dims(a[1]):
            if all(_can_split(ctx, x, d, ax) for x in items):
                yield [a[0], d, ax]


def derived_facts(ctx: GuardContext, relation: str, e: Term) -> list[tuple[Term, ...]]:
    """Facts ``(relation e ...)`` that analysis declarations give."""
    return ctx.facts.derived(relation, e)


def _bcast_operand(ctx: GuardContext, e: Term, x: Term) -> bool:
    return any(fact[1] == x for fact in derived_facts(ctx, "bcast-operand", e))


def _bc(ctx: GuardContext, x: Term, e: Term) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if not _bcast_operand(ctx, e, x):
        return None
    try:
        return ctx.shape(x), ctx.shape(e)
    except NoValue:
        return None


def _rel_bc_dim(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    shapes = _bc(ctx, a[0], a[1])
    if shapes is None:
        return
    sx, se = shapes
    for d in _dims(a[2]):
        if d >= len(se):
            continue
        dx = d - (len(se) - len(sx))
        if dx >= 0 and sx[dx] == se[d] and _eq(a[3], dx):
            yield [a[0], a[1], d, dx]


def _rel_bc_bcast(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    shapes = _bc(ctx, a[0], a[1])
    if shapes is None:
        return
    sx, se = shapes
    for d in _dims(a[2]):
        if d >= len(se):
            continue
        dx = d - (len(se) - len(sx))
        if dx < 0 or sx[dx] == 1:
            yield [a[0], a[1], d]


def _mm_facts(ctx: GuardContext, e: Any) -> dict[str, list[tuple[int, ...]]]:
    """mm-row, mm-batch, mm-col and mm-k facts of a MatMul term, as analysis.egg derives them."""
    facts: dict[str, list[tuple[int, ...]]] = {"mm-row": [], "mm-batch": [], "mm-col": [], "mm-k": []}
    if not (isinstance(e, App) and e.head == "MatMul"):
        return facts
    try:
        sa, sb, se = ctx.shape(e.args[0]), ctx.shape(e.args[1]), ctx.shape(e)
    except NoValue:
        return facts
    r = len(se)
    if len(sa) >= 2 and len(sb) >= 2:
        facts["mm-col"].append((r - 1, len(sb) - 1))
        facts["mm-k"].append((len(sa) - 1, len(sb) - 2))
        facts["mm-row"].append((r - 2, len(sa) - 2))
    for d in DIMS:
        if d >= r - 2:
            break
        da, db = d - (r - len(sa)), d - (r - len(sb))
        if da < 0 or sa[da] != se[d]:
            continue
        if len(sb) >= 2 and (db < 0 or sb[db] == 1):
            facts["mm-row"].append((d, da))
        if db >= 0 and sb[db] == se[d]:
            facts["mm-batch"].append((d, da, db))
    return facts


def _rel_mm(name: str) -> Rel:
    def rel(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
        for fact in dict.fromkeys(_mm_facts(ctx, a[0])[name]):
            if all(_eq(v, f) for v, f in zip(a[1:], fact, strict=True)):
                yield [a[0], *fact]

    return rel


def _rel_perm_map(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    perm = a[0]
    for j, d in enumerate(perm):
        if _eq(a[1], d) and _eq(a[2], j):
            yield [perm, d, j]


def _rel_reshape_map(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for d, d2 in reshape_pairs(tuple(a[0]), tuple(a[1])):
        if _eq(a[2], d) and _eq(a[3], d2):
            yield [a[0], a[1], d, d2]


def _rel_reduce_map(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    if not tuple(a[0]):
        return  # the encoder states it for its (normalized, non-empty) axes only: empty axes never match
    for d, d2 in reduce_pairs(tuple(a[0]), int(a[1]), int(a[2])):
        if _eq(a[3], d) and _eq(a[4], d2):
            yield [*a[:3], d, d2]


def _rel_float_dtype(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    if a[0] in FLOAT_DTYPES:
        yield [a[0]]


def _rel_bcast_operand(ctx: GuardContext, a: list[Any]) -> Iterator[list[Any]]:
    for fact in derived_facts(ctx, "bcast-operand", a[0]):
        if _eq(a[1], fact[1]):
            yield [a[0], fact[1]]


#: relation name → (python mirror, argument positions it can enumerate when unbound)
BUILTIN_RELATIONS: dict[str, tuple[Rel, frozenset[int]]] = {
    "mesh-axis": (_rel_mesh_axis, frozenset({0, 1})),
    "dim-range": (_rel_dim_range, frozenset({0})),
    "placed": (_rel_placed, frozenset({1, 2})),
    "shards-not": (_rel_shards_not, frozenset({0, 1})),
    "axes-1": (_rel_axes(1), frozenset({0})),
    "axes-2": (_rel_axes(2), frozenset({0, 1})),
    "axes-3": (_rel_axes(3), frozenset({0, 1, 2})),
    "splittable-size": (_rel_splittable, frozenset({1, 2})),
    "can-split": (_rel_can_split, frozenset({1, 2})),
    "can-split-opt": (_rel_can_split_opt, frozenset({1, 2})),
    "list-can-split": (_rel_list_can_split, frozenset({1, 2})),
    "bcast-operand": (_rel_bcast_operand, frozenset({1})),
    "bc-dim": (_rel_bc_dim, frozenset({2, 3})),
    "bc-bcast": (_rel_bc_bcast, frozenset({2})),
    "mm-row": (_rel_mm("mm-row"), frozenset({1, 2})),
    "mm-batch": (_rel_mm("mm-batch"), frozenset({1, 2, 3})),
    "mm-col": (_rel_mm("mm-col"), frozenset({1, 2})),
    "mm-k": (_rel_mm("mm-k"), frozenset({1, 2})),
    "perm-map": (_rel_perm_map, frozenset({1, 2})),
    "reshape-map": (_rel_reshape_map, frozenset({2, 3})),
    "reduce-map": (_rel_reduce_map, frozenset({3, 4})),
    "float-dtype": (_rel_float_dtype, frozenset()),
}
