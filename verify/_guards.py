"""Guards evaluated in Python on concrete shapes: one predicate per relation of rules/analysis.egg.

A rule's ``:when`` facts are a conjunctive query, as in egglog: the evaluator tries them in order, defers a
fact until the variables it needs are bound, and enumerates the solutions of relations that bind variables
(``(can-split a d ax)`` binds ``d`` and ``ax``). Each relation below mirrors the egglog rules that derive it;
``reshape-map`` and ``reduce-map`` reuse the encoder's own functions. ``bcast-operand`` and any other
relation that rule files declare with ``(rule ((= e (Op ...))) ((rel e x ...)))`` are derived by matching
those declarations.

A relation with no mirror here and no such declaration makes the rule *unknown* (the verifier cannot tell
when it holds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unity_eq.egraph import MAX_RANK
from unity_eq.ops.dtypes import FLOAT_DTYPES
from unity_eq.ops.reduce import reduce_pairs
from unity_eq.ops.registry import OPS
from unity_eq.ops.reshape import reshape_pairs
from unity_eq.rulefile.terms import AnalysisDecl, App, Lit, Term, Var
from unity_eq.verify._semantics import (
    LISTS,
    PARALLEL,
    Placements,
    R,
    S,
    State,
    VarSpec,
    instantiate,
    list_elements,
    parse_state,
)
from unity_eq.verify._tensor import ShapeError, infer_shape

__all__ = [
    "BUILTIN_RELATIONS",
    "DerivedFacts",
    "GuardContext",
    "GuardError",
    "guard_value",
    "solve_guards",
    "unsupported_relations",
]

DIMS = range(MAX_RANK)  # dim-range: the encoder states 0 .. (max rank - 1); MAX_RANK bounds it


class GuardError(Exception):
    """A guard cannot be evaluated (no Python mirror for a relation, or a fact never becomes evaluable)."""


class _NoValue(Exception):
    """A term's value is not available yet (an unbound variable) or undefined (vec-get out of range)."""


class DerivedFacts:
    """Facts that analysis declarations ``(rule ((= e (Op ...))) ((rel e x ...)))`` give, by matching."""

    def __init__(self, analyses: Sequence[AnalysisDecl]) -> None:
        self.by_head: dict[str, list[tuple[str, Term, tuple[Term, ...]]]] = {}
        self.relations: set[str] = set()
        self.memo: dict[tuple[str, Term], list[tuple[Term, ...]]] = {}
        for decl in analyses:
            for action in decl.actions:
                if isinstance(action, App):
                    self.relations.add(action.head)
            if len(decl.query) != 1:
                continue
            fact = decl.query[0]
            if (
                isinstance(fact, App)
                and fact.head == "="
                and isinstance(fact.args[0], Var)
                and isinstance(fact.args[1], App)
            ):
                self.by_head.setdefault(fact.args[1].head, []).append((fact.args[0].name, fact.args[1], decl.actions))

    def derived(self, relation: str, e: Term) -> list[tuple[Term, ...]]:
        key = (relation, e)
        got = self.memo.get(key)
        if got is not None:
            return got
        out: list[tuple[Term, ...]] = []
        if isinstance(e, App):
            for var, pattern, actions in self.by_head.get(e.head, []):
                subst: dict[str, Term] = {}
                if not _match(pattern, e, subst):
                    continue
                subst[var] = e
                for action in actions:
                    if (
                        isinstance(action, App)
                        and action.head == relation
                        and action.args
                        and action.args[0] == Var(var)
                    ):
                        try:
                            out.append(tuple(_subst(arg, subst) for arg in action.args))
                        except KeyError:
                            continue
        self.memo[key] = out
        return out

    def mentions(self, head: str, token: str) -> tuple[str, ...]:
        """Every declaration whose pattern mentions ``head`` anywhere (not only at its root), with the op
        renamed ``token``: what a proof that uses ``head`` may have depended on (proof reuse keys)."""
        out = []
        for entries in self.by_head.values():
            for var, pattern, actions in entries:
                if not any(isinstance(t, App) and t.head == head for t in _walk(pattern)):
                    continue
                text = f"{var}={pattern}=>{' '.join(map(str, actions))}"
                out.append(text.replace(f"({head} ", f"({token} ").replace(f"({head})", f"({token})"))
        return tuple(sorted(out))

    def signature(self, head: str, token: str) -> tuple[str, ...]:
        """The declarations about ``head``, with the op renamed ``token`` (for cache keys)."""
        out = []
        for var, pattern, actions in self.by_head.get(head, []):
            text = f"{var}={pattern}=>{' '.join(map(str, actions))}"
            out.append(text.replace(f"({head} ", f"({token} "))
        return tuple(sorted(out))


@dataclass
class GuardContext:
    """What guards see in one case: the mesh, the bound variables, the left-hand side's placements."""

    axes: tuple[str, ...]
    sizes: dict[str, int]
    sorts: dict[str, str]
    specs: dict[str, VarSpec | None]
    lists: dict[str, list[VarSpec]]
    pl: Placements
    facts: DerivedFacts = field(default_factory=lambda: DerivedFacts(()))
    placed: dict[tuple[str, str], State] = field(default_factory=dict)
    memo: dict[Any, Any] = field(default_factory=dict)  # shared by the cases of one instance
    #: ``placed`` holds every variable's placement (an analysis declaration's placement check enumerates
    #: them): a ``placed`` guard then only matches it (egglog's query), never gives a variable its placement,
    #: and ``(S d)`` with ``d`` unbound binds ``d`` to the sharded dim
    fixed_placements: bool = False

    # --- terms
    def tensor(self, term: Term, binding: dict[str, Any]) -> Term:
        """The concrete tensor term of a guard argument (variables substituted)."""
        sorts = self.sorts
        if isinstance(term, Var) and sorts.get(term.name) in ("T", "TList") and sorts.get(term.name) == "T":
            spec = self.specs.get(term.name)
            return Var(term.name) if spec is not None else App("NoneT")
        attr_vars = self.memo.get(("vars", term))
        if attr_vars is None:
            attr_vars = tuple(
                dict.fromkeys(
                    t.name for t in _walk(term) if isinstance(t, Var) and sorts.get(t.name) not in ("T", "TList")
                )
            )
            self.memo[("vars", term)] = attr_vars
        if any(v not in binding for v in attr_vars):
            raise _NoValue(str(term))
        key = ("tensor", term, tuple(binding[v] for v in attr_vars))
        got = self.memo.get(key)
        if got is None:
            merged = {**binding, **self.specs, **self.lists}
            got = instantiate(term, merged, sorts)
            self.memo[key] = got
        return got

    def shape(self, term: Term) -> tuple[int, ...]:
        key = ("shape", term)
        got = self.memo.get(key)
        if got is None:
            got = self._shape(term)
            self.memo[key] = got
        return got

    def _shape(self, term: Term) -> tuple[int, ...]:
        if isinstance(term, Var):
            spec = self.specs.get(term.name)
            if spec is None:
                if term.name.split("#")[0] in self.lists:
                    base, i = term.name.split("#")
                    return self.lists[base][int(i)].shape
                return ()
            return spec.shape
        if isinstance(term, App):
            if term.head == "NoneT":
                return ()
            if term.head in PARALLEL:
                return self.shape(term.args[0])
            if term.head in OPS:
                args: list[Any] = []
                op_spec = OPS[term.head]
                for k, arg in enumerate(term.args):
                    sort = op_spec.args[k].sort if k < len(op_spec.args) else "i64"
                    if sort == "T":
                        args.append(None if isinstance(arg, App) and arg.head == "NoneT" else self.shape(arg))
                    elif sort == "TList":
                        args.append([self.shape(x) for x in list_elements(arg) or []])
                    else:
                        args.append(arg.value if isinstance(arg, Lit) else None)
                try:
                    return infer_shape(term.head, args)
                except ShapeError:
                    raise _NoValue(str(term)) from None
        raise _NoValue(str(term))

    def placement(self, term: Term, axis: str) -> State | None:
        if isinstance(term, Var) and (term.name, axis) in self.placed:
            return self.placed[(term.name, axis)]
        got = self.pl.get(term, axis)
        if len(got) == 1:
            return next(iter(got))
        return None if got else R


def _walk(term: Term) -> Iterator[Term]:
    yield term
    if isinstance(term, App):
        for a in term.args:
            yield from _walk(a)


# ----------------------------------------------------------------------------------------------------------
# Values of guard terms


def _value(term: Term, binding: dict[str, Any], ctx: GuardContext) -> Any:
    if isinstance(term, Lit):
        return term.value
    if isinstance(term, Var):
        sort = ctx.sorts.get(term.name)
        if sort in ("T", "TList"):
            return ctx.tensor(term, binding)
        if term.name not in binding:
            raise _NoValue(term.name)
        return binding[term.name]
    head = term.head
    if head in ("R", "D", "P", "S"):
        if head == "S":
            return S(int(_value(term.args[0], binding, ctx)))
        return (head, -1)
    if head == "shape":
        return ctx.shape(ctx.tensor(term.args[0], binding))
    if head == "dtype":
        t = ctx.tensor(term.args[0], binding)
        spec = ctx.specs.get(t.name) if isinstance(t, Var) else None
        return "none" if isinstance(t, App) and t.head == "NoneT" else ("int64" if spec and spec.integer else "float32")
    if head == "vec-get":
        vec, i = _value(term.args[0], binding, ctx), _value(term.args[1], binding, ctx)
        if not 0 <= i < len(vec):
            raise _Undefined(f"vec-get {i} of {list(vec)}")
        return vec[i]
    if head == "vec-length":
        return len(_value(term.args[0], binding, ctx))
    if head == "vec-of":
        return tuple(_value(a, binding, ctx) for a in term.args)
    if head == "vec-empty":
        return ()
    if head == "vec-set":
        vec, i, x = (_value(a, binding, ctx) for a in term.args)
        if not 0 <= i < len(vec):
            raise _Undefined(f"vec-set {i} of {list(vec)}")
        return (*vec[:i], x, *vec[i + 1 :])
    if head in ("+", "-", "*", "/", "%", "min", "max"):
        x, y = (_value(a, binding, ctx) for a in term.args)
        if head in ("/", "%") and y == 0:
            raise _Undefined("division by zero")
        return {
            "+": lambda: x + y,
            "-": lambda: x - y,
            "*": lambda: x * y,
            "/": lambda: int(x / y),
            "%": lambda: x - y * int(x / y),
            "min": lambda: min(x, y),
            "max": lambda: max(x, y),
        }[head]()
    if head in OPS or head in PARALLEL or head in LISTS or head == "NoneT":
        return ctx.tensor(term, binding)
    raise GuardError(f"'{head}' has no value in a guard")


def guard_value(term: Term, binding: dict[str, Any], ctx: GuardContext) -> Any:
    """The value of a guard term (an axis, a placement ``(S d)``, a dim…) under ``binding``; GuardError when
    it has none."""
    try:
        return _value(term, binding, ctx)
    except (_NoValue, _Undefined) as exc:
        raise GuardError(f"{term} has no value here ({exc})") from None


class _Undefined(Exception):
    """The fact is false in egglog (it does not match): vec-get out of range, division by zero."""


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
        if a[2] is UNBOUND or a[2] == st or (a[2] == _S_UNBOUND and st[0] == "S"):
            yield [x, ax, st]
        elif isinstance(x, Var) and not ctx.pl.get(x, ax) and not ctx.fixed_placements:
            # "R unless a guard says otherwise": the guard gives the variable its placement
            ctx.placed[(x.name, ax)] = a[2]
            yield [x, ax, a[2]]


_S_UNBOUND = ("S", "unbound")  # ``(S d)`` with ``d`` unbound, under ``fixed_placements``


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
    except _NoValue:
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


def _derived(ctx: GuardContext, relation: str, e: Term) -> list[tuple[Term, ...]]:
    """Facts ``(relation e ...)`` that analysis declarations give."""
    return ctx.facts.derived(relation, e)


def _match(pattern: Term, term: Term, subst: dict[str, Term]) -> bool:
    if isinstance(pattern, Var):
        if pattern.name in subst:
            return subst[pattern.name] == term
        subst[pattern.name] = term
        return True
    if isinstance(pattern, Lit):
        return isinstance(term, Lit) and term.value == pattern.value
    return (
        isinstance(term, App)
        and term.head == pattern.head
        and len(term.args) == len(pattern.args)
        and all(_match(p, t, subst) for p, t in zip(pattern.args, term.args, strict=True))
    )


def _subst(term: Term, subst: dict[str, Term]) -> Term:
    if isinstance(term, Var):
        return subst[term.name]
    if isinstance(term, App):
        return App(term.head, tuple(_subst(a, subst) for a in term.args))
    return term


def _bcast_operand(ctx: GuardContext, e: Term, x: Term) -> bool:
    return any(fact[1] == x for fact in _derived(ctx, "bcast-operand", e))


def _bc(ctx: GuardContext, x: Term, e: Term) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if not _bcast_operand(ctx, e, x):
        return None
    try:
        return ctx.shape(x), ctx.shape(e)
    except _NoValue:
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
    except _NoValue:
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
    for fact in _derived(ctx, "bcast-operand", a[0]):
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

_COMPARE = {
    "<": lambda x, y: x < y,
    ">": lambda x, y: x > y,
    "<=": lambda x, y: x <= y,
    ">=": lambda x, y: x >= y,
    "!=": lambda x, y: x != y,
}


def unsupported_relations(guards: Sequence[Term], facts: DerivedFacts) -> list[str]:
    """Relations in ``guards`` that the verifier cannot evaluate."""
    out = []
    for guard in guards:
        if not isinstance(guard, App):
            continue
        head = guard.head
        if head in BUILTIN_RELATIONS or head in _COMPARE or head in ("=", "vec-contains", "vec-not-contains"):
            continue
        if head not in facts.relations:
            out.append(head)
    return out


def solve_guards(guards: Sequence[Term], binding: dict[str, Any], ctx: GuardContext) -> Iterator[dict[str, Any]]:
    """Every extension of ``binding`` under which all guards hold."""
    yield from _solve(list(guards), dict(binding), ctx, 0)


def _solve(pending: list[Term], binding: dict[str, Any], ctx: GuardContext, stalled: int) -> Iterator[dict[str, Any]]:
    if not pending:
        yield binding
        return
    if stalled > len(pending):
        raise GuardError(f"cannot evaluate guard {pending[0]}: a variable it needs is never bound")
    fact, rest = pending[0], pending[1:]
    try:
        solutions = list(_fact(fact, binding, ctx))
    except _NoValue:
        yield from _solve([*rest, fact], binding, ctx, stalled + 1)
        return
    except _Undefined:
        return
    for new in solutions:
        yield from _solve(rest, new, ctx, 0)


def _fact(fact: Term, binding: dict[str, Any], ctx: GuardContext) -> Iterator[dict[str, Any]]:
    if not isinstance(fact, App):
        raise GuardError(f"a guard must be a fact, got {fact}")
    head = fact.head
    if head == "=":
        left, right = fact.args
        for target, other in ((left, right), (right, left)):
            if (
                isinstance(target, Var)
                and target.name not in binding
                and ctx.sorts.get(target.name) not in ("T", "TList")
            ):
                value = _value(other, binding, ctx)
                yield {**binding, target.name: value}
                return
        if _value(left, binding, ctx) == _value(right, binding, ctx):
            yield binding
        return
    if head in _COMPARE:
        if _COMPARE[head](_value(fact.args[0], binding, ctx), _value(fact.args[1], binding, ctx)):
            yield binding
        return
    if head in ("vec-contains", "vec-not-contains"):
        vec, x = _value(fact.args[0], binding, ctx), _value(fact.args[1], binding, ctx)
        if (x in vec) == (head == "vec-contains"):
            yield binding
        return
    entry = BUILTIN_RELATIONS.get(head)
    if entry is None:
        yield from _derived_fact(fact, binding, ctx)
        return
    rel, enumerable = entry
    args: list[Any] = []
    unbound: dict[int, str] = {}
    shard_dim = ""  # ``(placed x ax (S d))`` with ``d`` unbound, matched against fixed placements
    for i, arg in enumerate(fact.args):
        if isinstance(arg, Var) and arg.name not in binding and ctx.sorts.get(arg.name) not in ("T", "TList"):
            if i not in enumerable:
                raise _NoValue(arg.name)
            unbound[i] = arg.name
            args.append(UNBOUND)
        elif (
            isinstance(arg, App)
            and arg.head == "S"
            and isinstance(arg.args[0], Var)
            and arg.args[0].name not in binding
        ):
            if head != "placed" or not ctx.fixed_placements:
                raise _NoValue(arg.args[0].name)
            shard_dim = arg.args[0].name
            args.append(_S_UNBOUND)
        else:
            value = _value(arg, binding, ctx)
            state = parse_state(arg) if isinstance(arg, App) else None
            args.append(state if state is not None else value)
    for solution in rel(ctx, args):
        new = dict(binding)
        ok = True
        for i, name in unbound.items():
            if name in new and new[name] != solution[i]:
                ok = False
            new[name] = solution[i]
        if shard_dim:
            new[shard_dim] = solution[2][1]
        if ok:
            yield new


def _derived_fact(fact: App, binding: dict[str, Any], ctx: GuardContext) -> Iterator[dict[str, Any]]:
    if not fact.args:
        raise GuardError(f"relation '{fact.head}' has no Python mirror in unity_eq.verify")
    e = _value(fact.args[0], binding, ctx)
    if not isinstance(e, (Var, App)):
        raise GuardError(f"relation '{fact.head}' has no Python mirror in unity_eq.verify")
    for derived in _derived(ctx, fact.head, e):
        new = dict(binding)
        ok = True
        for arg, value in zip(fact.args[1:], derived[1:], strict=False):
            if isinstance(arg, Var) and arg.name not in new and ctx.sorts.get(arg.name) not in ("T", "TList"):
                new[arg.name] = value.value if isinstance(value, Lit) else value
            elif _value(arg, new, ctx) != (value.value if isinstance(value, Lit) else value):
                ok = False
        if ok:
            yield new
