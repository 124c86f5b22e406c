"""The cases of a bounded proof: the meshes, instances and guard bindings a rule applies to, one per signature.

Steps 1-4 of :mod:`unity_eq.verify._bounded` (meshes, instances, guards, selection).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unity_eq.ir import Mesh
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var, walk
from unity_eq.verify._gen import GenConfig, RankFacts, generate_lhs, rank_facts
from unity_eq.verify._guards import (
    DerivedFacts,
    GuardContext,
    GuardError,
    solve_guards,
    unsupported_relations,
)
from unity_eq.verify._semantics import (
    PARALLEL,
    SYMBOLIC,
    Placements,
    State,
    VarSpec,
    instantiate,
    lhs_placements,
)
from unity_eq.verify._signatures import by_signature

GENERIC_AXES = ("x", "y", "z", "w")


@dataclass
class Case:
    """One concrete situation a rule applies to: a mesh and a value for every variable."""

    mesh: Mesh
    binding: dict[str, Any]
    placed: dict[tuple[str, str], State] = field(default_factory=dict)

    def describe(self, sorts: dict[str, str]) -> str:
        parts = [f"mesh {self.mesh}" if self.mesh.size > 1 or self.mesh.axes != ("x",) else "one device"]
        for name in sorted(self.binding):
            value = self.binding[name]
            sort = sorts.get(name)
            if sort == "T":
                parts.append(f"{name}: {'NoneT' if value is None else _shape_str(value)}")
            elif sort == "TList":
                parts.append(f"{name}: [{', '.join(_shape_str(v) for v in value)}]")
            elif value == SYMBOLIC:
                continue
            elif isinstance(value, tuple):
                parts.append(f"{name}={list(value)}")
            else:
                parts.append(f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}")
        return "; ".join(parts)

    def elements(self) -> int:
        total = 0
        for value in self.binding.values():
            if isinstance(value, VarSpec):
                total += math.prod(value.shape)
            elif isinstance(value, list):
                total += sum(math.prod(v.shape) for v in value if isinstance(v, VarSpec))
        return total * max(1, self.mesh.size)


def _shape_str(spec: VarSpec) -> str:
    return f"[{', '.join(map(str, spec.shape))}]" + (" (indices)" if spec.integer else "")


# ----------------------------------------------------------------------------------------------------------
# Enumeration


def rule_axes(rule: Rule) -> tuple[list[str], list[str]]:
    """(axis variables, axis names written as strings) of a rule."""
    sorts = rule.var_sorts
    attr_strings: set[str] = set()
    literals: dict[str, None] = {}
    for term in (rule.lhs, rule.rhs, *rule.guards):
        for t in walk(term):
            if not isinstance(t, App):
                continue
            spec = OPS.get(t.head)
            if spec is not None:
                for arg, a in zip(t.args, spec.args, strict=False):
                    if a.sort == "String" and isinstance(arg, Var):
                        attr_strings.add(arg.name)
            if (t.head in PARALLEL or t.head == "PList") and t.args and isinstance(t.args[-1], Lit):
                literals.setdefault(str(t.args[-1].value), None)
    axis_vars = [v for v, s in sorted(sorts.items()) if s == "String" and v not in attr_strings]
    return axis_vars, list(literals)


def rule_meshes(rule: Rule, sizes: Sequence[int]) -> list[Mesh]:
    axis_vars, literals = rule_axes(rule)
    k = len(axis_vars) + len(literals)
    if k == 0:
        return [Mesh(("x",), (1,))]
    names = list(literals) + [a for a in GENERIC_AXES if a not in literals][: len(axis_vars)]
    return [Mesh(tuple(names), combo) for combo in itertools.product(sizes, repeat=len(names))]


def _feasible(pl: Placements, specs: dict[str, Any], lists: dict[str, Any], mesh: Mesh) -> bool:
    """False when the left-hand side cannot exist: a variable it shards does not split evenly."""
    sizes = dict(zip(mesh.axes, mesh.sizes, strict=True))
    named = {**specs, **{f"{v}#{i}": s for v, items in lists.items() for i, s in enumerate(items)}}
    for name, spec in named.items():
        if spec is None:
            continue
        for axis in mesh.axes:
            for kind, dim in pl.get(Var(name), axis):
                if kind == "S" and (dim >= len(spec.shape) or spec.shape[dim] % sizes[axis]):
                    return False
    return True


def _identity(mesh: Mesh, tensors: tuple[Any, ...], solution: dict[str, Any], placed: dict[Any, State]) -> Any:
    """Two enumerated cases with equal identities are the same case (the same shapes, values and placements
    reached along two paths of the generator): checking one checks both. ``tensors`` is the identity of the
    instance's tensors (:func:`_tensor_identity`, computed once per instance); ``solution`` binds the other
    variables (a tensor's own value wins, as in the case's binding). Values are compared with their types
    (``1`` and ``1.0`` stay apart)."""
    names = {name for name, _value in tensors}
    return (
        mesh.axes,
        mesh.sizes,
        tensors,
        tuple(sorted((k, _hashable(v)) for k, v in solution.items() if k not in names)),
        tuple(sorted(placed.items())),
    )


def _tensor_identity(specs: dict[str, Any], lists: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, _hashable(v)) for k, v in {**specs, **lists}.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_hashable(v) for v in value))
    return (type(value).__name__, value)


def _structural_placements(
    rule: Rule, inst: dict[str, Any], axes: tuple[str, ...], elem_vars: list[str], cache: dict[Any, Placements]
) -> Placements:
    """The placements the left-hand side's structure implies for one instance (no defaults). They read the
    instantiated term, which depends on the attribute values, on which tensors are absent and on list
    lengths, never on shapes: instances that agree on those share one (read-only) result."""
    sorts = rule.var_sorts
    key = (
        axes,
        tuple(elem_vars),
        tuple(
            (k, v is None if sorts.get(k) == "T" else len(v or ()) if sorts.get(k) == "TList" else _hashable(v))
            for k, v in sorted(inst.items())
        ),
    )
    got = cache.get(key)
    if got is None:
        got = lhs_placements(instantiate(rule.lhs, inst, sorts), axes, {}, elem_vars, defaults=False)
        cache[key] = got
    return got


@dataclass
class Enumeration:
    cases: list[Case]
    enumerated: int
    classes: int
    error: str = ""


_KNOWN = {*OPS, *PARALLEL, "NoneT", "TNil", "TCons", "PList"}
_PRIMITIVE_TERMS = {"+", "-", "*", "/", "%", "min", "max", "vec-of", "vec-empty"}


def unsupported_constructors(rule: Rule) -> list[str]:
    """Constructors of the rule's terms that the verifier has no semantics for (declared by a rule file)."""
    out: dict[str, None] = {}
    for term in (rule.lhs, rule.rhs):
        for t in walk(term):
            if isinstance(t, App) and t.head not in _KNOWN and t.head not in _PRIMITIVE_TERMS:
                out.setdefault(t.head, None)
    return list(out)


def bounded_token(head: str) -> str:
    """Ops with the same argument layout and family share generators, shapes and guard behaviour."""
    spec = OPS.get(head)
    if spec is None:
        return head
    layout = tuple((a.sort, a.kind, a.default, a.optional) for a in spec.args)
    named = spec.name if spec.family.value in ("reshape", "pool") else ""
    return f"<{spec.family.value}:{named}:{hash((layout, spec.multi_output)) & 0xFFFFFFFF:x}>"


def _canonical(term: Term) -> Term:
    if isinstance(term, App):
        return App(bounded_token(term.head), tuple(_canonical(a) for a in term.args))
    return term


def enumeration_key(rule: Rule, facts: DerivedFacts, *extra: Any) -> Any:
    """Rules with equal keys have the same cases (e.g. add-split-a and mul-split-a)."""
    heads = {t.head for term in (rule.lhs, *rule.guards) for t in walk(term) if isinstance(t, App) and t.head in OPS}
    decls = tuple(sorted((bounded_token(h), facts.signature(h, bounded_token(h))) for h in heads))
    return (_canonical(rule.lhs), tuple(_canonical(g) for g in rule.guards), rule.sorts, decls, extra)


def enumerate_cases(
    rule: Rule,
    facts: DerivedFacts,
    cfg: GenConfig = GenConfig(),
    sizes: Sequence[int] = (1, 2, 3, 4),
    budget: int | None = None,
    placement_cases: bool = True,
    shared: dict[Any, Any] | None = None,
    prune: bool = True,
    limit: int | None = None,
) -> Enumeration:
    """The cases to check. ``budget=None`` (a proof): every distinct case, smallest first. A number (the
    numeric back-up's sample): one per signature, at most ``budget`` (see module docstring).
    ``placement_cases``: every value of a placement dim variable is a signature of its own (the proof needs
    them; the numeric back-up, which wants the largest cases, does not). ``shared``: instances of left-hand
    sides, reused by rules with the same left-hand side (the drafts of one generated rule). ``prune``: see
    :func:`iter_cases` (the cases are the same either way). ``limit``: see :func:`iter_cases`."""
    error = unsupported_reason(rule, facts)
    if error:
        return Enumeration([], 0, 0, error)
    every: dict[Any, Case] = {}
    count = [0]
    stream = iter_cases(rule, facts, cfg, sizes, count, shared, prune, limit)
    try:
        if budget is not None:
            chosen, signatures = by_signature((case for case, _ in stream), rule, budget, placement_cases)
            return Enumeration(chosen, count[0], signatures)
        for case, identity in stream:
            every.setdefault(identity, case)
    except GuardError as exc:
        return Enumeration([], count[0], 0, str(exc))
    chosen = sorted(every.values(), key=lambda c: (c.elements(), c.mesh.sizes))
    return Enumeration(chosen, count[0], len(chosen))


def unsupported_reason(rule: Rule, facts: DerivedFacts) -> str:
    """Why the rule's cases cannot be enumerated ("" when they can)."""
    unknown = unsupported_constructors(rule)
    if unknown:
        return f"constructor '{unknown[0]}' has no semantics in unity_eq.verify (only the shipped schema's do)"
    missing = unsupported_relations(rule.guards, facts)
    if missing:
        return f"guard relation '{missing[0]}' has no Python mirror in unity_eq.verify"
    return ""


def _lhs_instances(
    rule: Rule,
    sorts: dict[str, str],
    axes: tuple[str, ...],
    cfg: GenConfig,
    structural: bool,
    lhs_cache: dict[Any, Placements],
    facts: RankFacts | None,
) -> Iterator[tuple[Any, ...]]:
    """The left-hand side's instances on a mesh with these axes, with what every case of each shares."""
    tensor_vars = [v for v, s in sorts.items() if s == "T"]
    list_vars = [v for v, s in sorts.items() if s == "TList"]
    for inst in generate_lhs(rule.lhs, sorts, axes, cfg, facts):
        specs = {v: inst[v] for v in tensor_vars if v in inst}
        lists = {v: inst[v] for v in list_vars if v in inst}
        elem_vars = [*specs, *(f"{v}#{i}" for v in lists for i in range(len(lists[v])))]
        # without parallel ops in the left-hand side every variable is R: nothing to infer
        pl = _structural_placements(rule, inst, axes, elem_vars, lhs_cache) if structural else Placements(axes)
        attrs = {k: v for k, v in inst.items() if k not in specs and k not in lists}
        yield (specs, lists, pl, attrs, _tensor_identity(specs, lists))


class _Recorded:
    """Iterates ``source`` once, keeping its items; stored under ``key`` in ``store`` when it ran to the
    end (the next mesh with these axes reuses them)."""

    def __init__(self, source: Iterator[tuple[Any, ...]], store: dict[Any, Any], key: Any) -> None:
        self.source, self.store, self.key = source, store, key

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        items: list[tuple[Any, ...]] = []
        for item in self.source:
            items.append(item)
            yield item
        self.store[self.key] = items


def iter_cases(
    rule: Rule,
    facts: DerivedFacts,
    cfg: GenConfig,
    sizes: Sequence[int],
    count: list[int],
    shared: dict[Any, Any] | None = None,
    prune: bool = True,
    limit: int | None = None,
) -> Iterator[tuple[Case, Any]]:
    """Every case satisfying the guards, in the generator's order, with its identity (:func:`_identity`;
    a case may come more than once); ``count[0]`` counts them. Raises :class:`GuardError`. ``prune``: the
    generator drops left-hand sides on which a rank fact of the guards is false (:mod:`unity_eq.verify._rank_facts`);
    without it every instance reaches the guards (the same cases come, more slowly: tests compare the two).
    ``limit`` (never a proof: the size sweep, whose instances are a seeded shuffle): on each mesh, the cases
    of at most ``limit`` left-hand sides, and at most ``limit`` cases."""
    sorts = rule.var_sorts
    structural = any(isinstance(t, App) and (t.head in PARALLEL or t.head == "PList") for t in walk(rule.lhs))
    lhs_cache: dict[Any, Placements] = {}
    prepared = {} if shared is None else shared
    ranks = rank_facts(rule.guards, rule.lhs, sorts) if prune else None
    for mesh in rule_meshes(rule, sizes):
        # the instances depend on the rank facts that pruned them
        key = ("lhs instances", rule.lhs, tuple(sorted(sorts.items())), mesh.axes, cfg, ranks and ranks.key)
        source: Iterable[tuple[Any, ...]] | None = prepared.get(key)
        if source is None:  # made while the cases are checked: a refuted rule stops early
            instances = _lhs_instances(rule, sorts, mesh.axes, cfg, structural, lhs_cache, ranks)
            source = _Recorded(instances, prepared, key)
        memos = prepared.setdefault(("memos", key, id(facts), rule.guards), {})
        taken = 0
        for i, (specs, lists, pl, attrs, tensors) in enumerate(source):
            if limit is not None and (i >= limit or taken >= limit):
                break
            ctx = GuardContext(
                mesh.axes,
                dict(zip(mesh.axes, mesh.sizes, strict=True)),
                sorts,
                specs,
                lists,
                pl,
                facts,
                memo=memos.setdefault(i, {}),
            )
            if structural and not _feasible(pl, specs, lists, mesh):
                continue
            for solution in solve_guards(rule.guards, attrs, ctx):
                count[0] += 1
                taken += 1
                case = Case(mesh, {**solution, **specs, **lists}, dict(ctx.placed))
                yield case, _identity(mesh, tensors, solution, case.placed)
