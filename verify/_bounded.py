"""Bounded proofs: every small case a rule applies to, evaluated symbolically, and z3 asked for a
counterexample.

1. **Meshes.** One axis per axis variable of the rule (and per axis name it spells out), sizes 1-4 each;
   two axis variables may name the same axis unless a guard says otherwise. A rule with no parallel op is
   checked on one device.
2. **Instances.** The left-hand side's variables get every instance of :mod:`unity_eq.verify._gen`.
3. **Guards.** Each instance is filtered, and the guard variables bound, by :mod:`unity_eq.verify._guards`.
4. **Selection.** Cases with the same *signature* are alike for the rule: same axis sizes, same values of
   every non-tensor variable (dims, axes, attributes), same rank of every tensor, and the same pattern of
   which dims are 1 and which divide each axis size. The smallest case of every signature is checked, up to
   ``budget`` signatures; past the budget, every *primary* class (axis sizes, guard bindings, ranks) is
   still checked once.
5. **Check.** :func:`unity_eq.verify._semantics.evaluate_case` yields equations over z3 terms; syntactically
   equal sides (z3 hash-conses terms), sides whose difference is 0 as a sum of monomials
   (:func:`unity_eq.verify._tensor.same_polynomial`) and sides equal after ``z3.simplify`` pass at once, the
   rest go to a solver as one disjunction of disequalities: ``unsat`` proves the case, ``sat`` is a
   counterexample, ``unknown`` (timeout) leaves the case unknown.

Every case is checked; what its cases share a rule computes once: placement inference and the gradient
check per pattern of concrete terms, axis names, ``placed`` guards and size-1 axes (:func:`_structure`),
z3 symbols and terms per operand ASTs (:mod:`unity_eq.verify._tensor`'s memo).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import z3

from unity_eq.ir import Mesh
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.domain import component_value, domain_components
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var, walk
from unity_eq.verify._gen import GenConfig, generate_lhs, required_ranks
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
    EvalFailure,
    Placements,
    State,
    VarSpec,
    evaluate_case,
    gradient_problem,
    infer_placements,
    instantiate,
    lhs_placements,
    list_elements,
    state_str,
    tensor_nodes,
)
from unity_eq.verify._tensor import Z3Backend, same_polynomial

__all__ = [
    "BoundedResult",
    "Case",
    "Counterexample",
    "enumerate_cases",
    "prove_bounded",
    "rule_axes",
    "unsupported_constructors",
]

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


@dataclass
class Counterexample:
    """Why a rule fails in one case. ``kind`` is ``value`` (z3 found inputs), ``shape`` or ``placement``."""

    case: str
    kind: str
    message: str
    inputs: dict[str, Any] = field(default_factory=dict)
    lhs: Any = None
    rhs: Any = None
    check: str = ""
    got: Any = None
    want: Any = None
    functions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {}, "")}


@dataclass
class BoundedResult:
    """``partial``: every case checked holds but a budget stopped the check before the last one (not a
    proof)."""

    status: str  # proven | refuted | unknown | partial
    enumerated: int = 0
    classes: int = 0
    checked: int = 0
    counterexample: Counterexample | None = None
    reason: str = ""
    seconds: float = 0.0
    # the domain the checked cases covered (unity_eq.rulefile.certificate.domain_components): one row per
    # combination of ranks, dtype classes, vector lengths and finite attribute values, and the mesh sizes
    rows: set[tuple[Any, ...]] = field(default_factory=set)
    mesh_sizes: set[tuple[int, ...]] = field(default_factory=set)


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


def _placement_vars(rule: Rule) -> set[str]:
    """Variables naming a dim of a placement (the dim of a Partition, Combine or PList, or of ``(S d)``):
    each of their values changes placements, so each is a class checked at least once."""
    out: set[str] = set()
    for term in (rule.lhs, rule.rhs, *rule.guards):
        for t in walk(term):
            if isinstance(t, App) and t.head in ("Partition", "Combine", "PList", "S"):
                dim = t.args[0] if t.head == "S" else t.args[1] if len(t.args) > 1 else None
                if isinstance(dim, Var):
                    out.add(dim.name)
    return out


def _signature(case: Case, sorts: dict[str, str], guard_vars: set[str]) -> tuple[Any, Any]:
    sizes = case.mesh.sizes
    primary: list[Any] = [sizes]
    secondary: list[Any] = []
    for name in sorted(case.binding):
        value = case.binding[name]
        sort = sorts.get(name)
        if sort in ("T", "TList"):
            specs = value if sort == "TList" else [value]
            secondary.append((name, tuple(None if s is None else len(s.shape) for s in specs)))
            for s in specs:
                if s is not None:
                    secondary.append(tuple((n == 1, tuple(n % k == 0 for k in sizes)) for n in s.shape))
        elif value == SYMBOLIC:
            continue
        elif sort == "IVec" and name in guard_vars:
            continue  # shapes read by guards: covered by the tensor patterns
        else:
            (primary if name in guard_vars or sort == "String" else secondary).append((name, value))
    return tuple(primary), (tuple(primary), tuple(secondary))


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
) -> Enumeration:
    """The cases to check. ``budget=None`` (a proof): every distinct case, smallest first. A number (the
    numeric back-up's sample): one per signature, at most ``budget`` (see module docstring).
    ``placement_cases``: every value of a placement dim variable is a signature of its own (the proof needs
    them; the numeric back-up, which wants the largest cases, does not). ``shared``: instances of left-hand
    sides, reused by rules with the same left-hand side (the drafts of one generated rule)."""
    error = _unsupported(rule, facts)
    if error:
        return Enumeration([], 0, 0, error)
    sorts = rule.var_sorts
    lhs_vars = {t.name for t in walk(rule.lhs) if isinstance(t, Var)}
    guard_vars = {v for v in sorts if v not in lhs_vars} | (_placement_vars(rule) if placement_cases else set())
    best: dict[Any, tuple[int, Case]] = {}
    primaries: dict[Any, list[Any]] = {}
    every: dict[Any, Case] = {}
    count = [0]
    try:
        for case, identity in _iter_cases(rule, facts, cfg, sizes, count, shared):
            if budget is None:
                every.setdefault(identity, case)
                continue
            primary, sig = _signature(case, sorts, guard_vars)
            size = case.elements()
            if sig not in best or size < best[sig][0]:
                if sig not in best:
                    primaries.setdefault(primary, []).append(sig)
                best[sig] = (size, case)
    except GuardError as exc:
        return Enumeration([], count[0], 0, str(exc))
    chosen: list[Case] = []
    if budget is None:
        chosen = list(every.values())
        chosen.sort(key=lambda c: (c.elements(), c.mesh.sizes))
        return Enumeration(chosen, count[0], len(chosen))
    if len(best) <= budget:
        chosen = [best[s][1] for s in best]
    else:
        queues = [list(sigs) for sigs in primaries.values()]
        while len(chosen) < budget and any(queues):
            for q in queues:
                if q and len(chosen) < max(budget, len(queues)):
                    chosen.append(best[q.pop(0)][1])
    chosen.sort(key=lambda c: (c.elements(), c.mesh.sizes))
    return Enumeration(chosen, count[0], len(best))


def _unsupported(rule: Rule, facts: DerivedFacts) -> str:
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
) -> Iterator[tuple[Any, ...]]:
    """The left-hand side's instances on a mesh with these axes, with what every case of each shares."""
    tensor_vars = [v for v, s in sorts.items() if s == "T"]
    list_vars = [v for v, s in sorts.items() if s == "TList"]
    for inst in generate_lhs(rule.lhs, sorts, axes, cfg, required_ranks(rule.guards)):
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


def _iter_cases(
    rule: Rule,
    facts: DerivedFacts,
    cfg: GenConfig,
    sizes: Sequence[int],
    count: list[int],
    shared: dict[Any, Any] | None = None,
) -> Iterator[tuple[Case, Any]]:
    """Every case satisfying the guards, in the generator's order, with its identity (:func:`_identity`;
    a case may come more than once); ``count[0]`` counts them. Raises :class:`GuardError`."""
    sorts = rule.var_sorts
    structural = any(isinstance(t, App) and (t.head in PARALLEL or t.head == "PList") for t in walk(rule.lhs))
    lhs_cache: dict[Any, Placements] = {}
    prepared = {} if shared is None else shared
    for mesh in rule_meshes(rule, sizes):
        ranks = tuple(sorted(required_ranks(rule.guards).items()))  # the instances depend on them
        key = ("lhs instances", rule.lhs, tuple(sorted(sorts.items())), mesh.axes, cfg, ranks)
        source: Iterable[tuple[Any, ...]] | None = prepared.get(key)
        if source is None:  # made while the cases are checked: a refuted rule stops early
            source = _Recorded(_lhs_instances(rule, sorts, mesh.axes, cfg, structural, lhs_cache), prepared, key)
        memos = prepared.setdefault(("memos", key, id(facts), rule.guards), {})
        for i, (specs, lists, pl, attrs, tensors) in enumerate(source):
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
                case = Case(mesh, {**solution, **specs, **lists}, dict(ctx.placed))
                yield case, _identity(mesh, tensors, solution, case.placed)


# ----------------------------------------------------------------------------------------------------------
# Checking one case


@dataclass
class CaseOutcome:
    status: str  # proven | refuted | unknown | skipped
    counterexample: Counterexample | None = None
    reason: str = ""


def concrete_rule(rule: Rule, case: Case) -> tuple[Term, Term, list[str], dict[str, VarSpec]]:
    sorts = rule.var_sorts
    lhs = instantiate(rule.lhs, case.binding, sorts)
    rhs = instantiate(rule.rhs, case.binding, sorts)
    specs: dict[str, VarSpec] = {}
    for name, sort in sorts.items():
        value = case.binding.get(name)
        if sort == "T" and isinstance(value, VarSpec):
            specs[name] = value
        elif sort == "TList" and value is not None:
            for i, spec in enumerate(value):
                specs[f"{name}#{i}"] = spec
    return lhs, rhs, list(specs), specs


def placement_problem(lhs: Term, rhs: Term, pl_lhs: Placements, pl: Placements, tensor_vars: list[str]) -> str | None:
    """A reason the rule breaks "one placement per e-class", or None."""
    rhs_nodes = tensor_nodes(rhs)
    items = list_elements(lhs)
    roots = items if items is not None else [lhs]
    must_have = [*rhs_nodes, *roots, *(Var(v) for v in tensor_vars)]
    for node in dict.fromkeys([*must_have, *tensor_nodes(lhs)]):
        if isinstance(node, App) and node.head == "NoneT":
            continue
        for axis in pl.axes:
            got = pl.get(node, axis)
            if len(got) > 1:
                where = "variable" if isinstance(node, Var) else "term"
                states = " and ".join(state_str(s) for s in sorted(got))
                return f"{where} {node} would be {states} on axis {axis}: one e-class with two placements"
            if not got and node in must_have:
                return (
                    f"term {node} has no placement on axis {axis}: no parallel op fixes it and its operands "
                    "are not all R there"
                )
    return None


@dataclass
class _Structure:
    """What a case's concrete terms imply before any shape is known: its placements, or why it is skipped
    (``skip``) or refuted (``problem``)."""

    pl: Placements | None
    skip: str = ""
    problem: str = ""
    gradients: dict[tuple[int, ...], str | None] = field(default_factory=dict)


StructureCache = dict[Any, _Structure]


def _structure(lhs: Term, rhs: Term, case: Case, tensor_vars: list[str], cache: StructureCache | None) -> _Structure:
    """Placement inference reads the concrete terms, the mesh's axis names and the ``placed`` guards, never
    the shapes or axis sizes: the thousands of cases of a rule that differ only in those share one result
    (``cache``, kept by :func:`prove_bounded`)."""
    axes = case.mesh.axes
    key = (lhs, rhs, axes, tuple(sorted(case.placed.items())), tuple(tensor_vars))
    got = cache.get(key) if cache is not None else None
    if got is not None:
        return got
    pl_lhs = lhs_placements(lhs, axes, case.placed, tensor_vars)
    if any(len(s) > 1 for s in pl_lhs.states.values()):
        got = _Structure(None, skip="the left-hand side has conflicting placements")
    else:
        pl = infer_placements(lhs, rhs, axes, case.placed, tensor_vars)
        got = _Structure(pl, problem=placement_problem(lhs, rhs, pl_lhs, pl, tensor_vars) or "")
    if cache is not None:
        cache[key] = got
    return got


def _gradient_problem(lhs: Term, rhs: Term, structure: _Structure, mesh: Mesh) -> str | None:
    """:func:`gradient_problem`, which reads the mesh only for which axes have size 1, cached per pattern."""
    assert structure.pl is not None
    trivial = tuple(i for i, n in enumerate(mesh.sizes) if n == 1)
    if trivial not in structure.gradients:
        structure.gradients[trivial] = gradient_problem(lhs, rhs, structure.pl, mesh=mesh)
    return structure.gradients[trivial]


def check_case(
    rule: Rule,
    case: Case,
    timeout_ms: int = 2000,
    structures: StructureCache | None = None,
    dtypes: dict[str, str] | None = None,
) -> CaseOutcome:
    """Prove or refute a rule in one case (see the module docstring). ``structures`` shares placement
    inference between the cases of one rule. ``dtypes``: the tensor variables' dtypes when some are integers
    (integer semantics for the ops on them); None: real tensors."""
    describe = case.describe(rule.var_sorts)
    if dtypes:
        describe += "; dtypes " + ", ".join(f"{k}: {v}" for k, v in sorted(dtypes.items()))
    lhs, rhs, tensor_vars, specs = concrete_rule(rule, case)
    structure = _structure(lhs, rhs, case, tensor_vars, structures)
    if structure.skip:
        return CaseOutcome("skipped", reason=structure.skip)
    if structure.problem:
        return CaseOutcome("refuted", Counterexample(describe, "placement", structure.problem))
    pl = structure.pl
    assert pl is not None
    bk = Z3Backend()
    attrs: dict[str, Any] = {}
    try:
        equations, values, skip = evaluate_case(
            lhs, rhs, case.mesh, pl, specs, attrs, bk, gradients=False, dtypes=dtypes
        )
    except EvalFailure as exc:
        return CaseOutcome("refuted", Counterexample(describe, exc.kind, exc.message))
    if equations is None or values is None:
        return CaseOutcome("skipped", reason=skip or "")
    outcome = _solve(equations, values, describe, timeout_ms)
    # training (Replicate = gradient all-reduce): checked after the values, whose counterexample says more
    problem = _gradient_problem(lhs, rhs, structure, case.mesh) if outcome.status != "refuted" else None
    return CaseOutcome("refuted", Counterexample(describe, "placement", problem)) if problem else outcome


def solve_equations(equations: list[Any], values: Any, describe: str, timeout_ms: int) -> CaseOutcome:
    """Prove the claims among ``equations`` (the ``assume`` ones are premises) as a case of a rule is proven:
    shortcuts first, then z3 (verify/_analysis.py checks a derived placement with it)."""
    return _solve(equations, values, describe, timeout_ms)


def _is_expr(x: Any) -> bool:
    return isinstance(x, z3.ExprRef)


def _solve(equations: list[Any], values: Any, describe: str, timeout_ms: int) -> CaseOutcome:
    hard: list[tuple[Any, int, Any, Any]] = []
    premises: list[Any] = []
    for eq in equations:
        if eq.assume:
            for a, b in zip(eq.left.reshape(-1), eq.right.reshape(-1), strict=True):
                if not (_is_expr(a) and _is_expr(b) and a.ast.value == b.ast.value):
                    premises.append(_to_z3(a) == _to_z3(b))
            continue
        left, right = eq.left.reshape(-1), eq.right.reshape(-1)
        for i in range(left.size):
            a, b = left[i], right[i]
            if a is b:
                continue
            both = _is_expr(a) and _is_expr(b)
            # z3 hash-conses terms: equal terms are one AST, so comparing pointers is exact
            if (both and a.ast.value == b.ast.value) or (not both and not _is_expr(a) and not _is_expr(b) and a == b):
                continue
            hard.append((eq, i, a, b))
    remaining = []
    for eq, i, a, b in hard:
        if same_polynomial(a, b):
            continue
        cond = _to_z3(a) == _to_z3(b)
        if z3.is_true(z3.simplify(cond)):
            continue
        remaining.append((eq, i, a, b, cond))
    if not remaining:
        return CaseOutcome("proven")
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*values.assumptions, *premises)
    solver.add(z3.Or([z3.Not(c) for *_rest, c in remaining]))
    result = solver.check()
    if result == z3.unsat:
        return CaseOutcome("proven")
    if result == z3.unknown:
        return CaseOutcome("unknown", reason=f"z3: {solver.reason_unknown()} ({describe})")
    model = solver.model()
    for eq, _i, _a, _b, cond in remaining:
        if z3.is_false(model.eval(cond, model_completion=True)):
            return CaseOutcome("refuted", _counterexample(model, eq, values, describe))
    eq = remaining[0][0]  # pragma: no cover - the model falsifies one of them
    return CaseOutcome("refuted", _counterexample(model, eq, values, describe))


def _to_z3(x: Any) -> Any:
    if _is_expr(x):
        return x
    return z3.RealVal(float(x)) if isinstance(x, float) else z3.RealVal(int(x))


def _number(model: z3.ModelRef, x: Any) -> Any:
    if x is None:
        return None
    v = model.eval(_to_z3(x), model_completion=True) if _is_expr(x) or not isinstance(x, int | float) else x
    if isinstance(v, int | float):
        return v
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        f = Fraction(v.numerator_as_long(), v.denominator_as_long())
        return int(f) if f.denominator == 1 else float(f)
    if z3.is_algebraic_value(v):
        return float(v.approx(10).as_fraction())
    if z3.is_true(v):
        return 1
    if z3.is_false(v):
        return 0
    return str(v)


def _array(model: z3.ModelRef, arr: Any) -> Any:
    if arr is None:
        return None
    if isinstance(arr, list):
        return [_array(model, a) for a in arr]
    a = np.asarray(arr, dtype=object)
    flat = [_number(model, x) for x in a.reshape(-1)]
    return np.array(flat, dtype=object).reshape(a.shape).tolist()


def _counterexample(model: z3.ModelRef, eq: Any, values: Any, describe: str) -> Counterexample:
    inputs: dict[str, Any] = {}
    for name, value in values.inputs.items():
        inputs[name] = _array(model, value)
        pieces = values.pieces_of_inputs.get(name)
        if pieces is not None and any(".part" in str(x) for x in np.asarray(pieces[0], dtype=object).reshape(-1)[:1]):
            inputs[f"{name} (pieces)"] = [_array(model, p) for p in pieces]
    functions = {}
    for decl in model.decls():
        if decl.arity() > 0:
            functions[decl.name()] = _short(str(model[decl]))
    for decl in model.decls():
        if decl.arity() == 0 and "[" not in decl.name() and decl.name() not in inputs:
            inputs[decl.name()] = _number(model, decl())
    what = eq.what + (f": {eq.term}" if eq.term else "")
    return Counterexample(
        describe,
        "value",
        f"{eq.what} differs" + (f" for {eq.term}" if eq.term else ""),
        inputs,
        _array(model, values.lhs_global),
        _array(model, values.rhs_global),
        what,
        _array(model, eq.left),
        _array(model, eq.right),
        functions,
    )


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----------------------------------------------------------------------------------------------------------
# A rule


def prove_bounded(
    rule: Rule,
    facts: DerivedFacts,
    cfg: GenConfig = GenConfig(),
    sizes: Sequence[int] = (1, 2, 3, 4),
    budget: int | None = None,
    timeout_ms: int = 2000,
    cache: dict[Any, Any] | None = None,
    lazy: bool = False,
    instances: dict[Any, Any] | None = None,
    dtypes: dict[str, str] | None = None,
) -> BoundedResult:
    """Check every case of the ranges (``budget``: at most that many, and the result is then ``partial``
    when cases were left); stop at the first counterexample. ``cache`` shares enumerations between rules
    with the same structure.

    ``lazy`` (no budget): check each case as the generator makes it instead of enumerating them all and
    checking the smallest first. The verdict is the same (refuted when some case refutes, else unknown when
    some case is, else proven), but a refuted rule stops at its first counterexample without building the
    other cases; the counterexample is then not necessarily the smallest. ``instances`` shares the
    left-hand side's instances with rules of the same left-hand side (the drafts of a generated rule).
    ``dtypes``: check with these dtypes of the tensor variables (integer semantics where they are
    integers; verify/_types.py's ``integer_assignments``)."""
    start = time.perf_counter()
    if lazy and budget is None:
        return _prove_lazy(rule, facts, cfg, sizes, timeout_ms, instances, start, dtypes)
    key = enumeration_key(rule, facts, cfg, tuple(sizes)) if cache is not None else None
    enum = cache.get(key) if cache is not None else None
    if enum is None:
        enum = enumerate_cases(rule, facts, cfg, sizes, None, shared=instances)
        if cache is not None:
            cache[key] = enum
    result = BoundedResult("proven", enum.enumerated, enum.classes)
    if enum.error:
        result.status, result.reason = "unknown", enum.error
        result.seconds = time.perf_counter() - start
        return result
    cases = enum.cases if budget is None else enum.cases[:budget]
    _check_cases(rule, cases, timeout_ms, result, dtypes)
    if result.status == "proven" and len(cases) < len(enum.cases) and not result.reason:
        result.status = "partial"
        result.reason = (
            f"partial: the budget stopped the check after {len(cases)} of {len(enum.cases)} cases "
            "(run without `--budget` for a proof)"
        )
    _no_case(result, enum.enumerated)
    result.seconds = time.perf_counter() - start
    return result


def _prove_lazy(
    rule: Rule,
    facts: DerivedFacts,
    cfg: GenConfig,
    sizes: Sequence[int],
    timeout_ms: int,
    instances: dict[Any, Any] | None,
    start: float,
    dtypes: dict[str, str] | None = None,
) -> BoundedResult:
    result = BoundedResult("proven")
    error = _unsupported(rule, facts)
    if error:
        result.status, result.reason = "unknown", error
        result.seconds = time.perf_counter() - start
        return result
    count = [0]
    seen: set[Any] = set()

    def fresh() -> Iterator[Case]:
        for case, identity in _iter_cases(rule, facts, cfg, sizes, count, instances):
            if identity not in seen:
                seen.add(identity)
                yield case

    try:
        _check_cases(rule, fresh(), timeout_ms, result, dtypes)
    except GuardError as exc:
        result.status, result.reason = "unknown", str(exc)
    result.enumerated, result.classes = count[0], len(seen)
    if result.status != "unknown":
        _no_case(result, count[0])
    result.seconds = time.perf_counter() - start
    return result


def _check_cases(
    rule: Rule, cases: Iterable[Case], timeout_ms: int, result: BoundedResult, dtypes: dict[str, str] | None = None
) -> None:
    """Check ``cases`` in order into ``result`` (status ``proven`` on entry): stop at a counterexample (a
    little later after a shape one, to find input values that show it too); a z3 timeout makes a rule with
    no counterexample ``unknown``."""
    unknown = ""
    search = 0  # after a shape refutation, look a little further for input values that show it too
    structures: StructureCache = {}
    components = domain_components(rule)
    for case in cases:
        if result.status == "refuted":
            search -= 1
            if search < 0:
                break
        outcome = check_case(rule, case, timeout_ms, structures, dtypes)
        if outcome.status == "skipped":
            continue
        result.checked += 1
        result.rows.add(tuple(component_value(kind, case.binding.get(var)) for var, kind in components))
        result.mesh_sizes.add(case.mesh.sizes)
        if outcome.status == "refuted" and outcome.counterexample is not None:
            if result.status != "refuted":
                result.status, result.counterexample = "refuted", outcome.counterexample
                if outcome.counterexample.kind != "shape":
                    break
                search = 24
            elif outcome.counterexample.kind == "value":
                first = result.counterexample
                assert first is not None
                outcome.counterexample.message += f" (it also fails at {first.case}: {first.message})"
                result.counterexample = outcome.counterexample
                break
        if outcome.status == "unknown" and not unknown:
            unknown = outcome.reason
    if result.status == "proven" and unknown:
        result.status, result.reason = "unknown", unknown


def _no_case(result: BoundedResult, enumerated: int) -> None:
    """A proof that checked no case proves nothing: ``unknown``, saying why."""
    if result.status == "proven" and result.checked == 0:
        result.status = "unknown"
        result.reason = (
            "no case satisfies the guards at dims 1-4 and axis sizes 1-4"
            if enumerated == 0
            else "every case was skipped: the left-hand side never has pieces that fit its placement "
            "(variables are R unless the left-hand side or a `placed` guard says otherwise)"
        )
