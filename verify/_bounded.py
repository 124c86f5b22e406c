"""Bounded proofs: every small case a rule applies to, evaluated symbolically, and z3 asked for a
counterexample.

1. **Meshes.** One axis per axis variable of the rule (and per axis name it spells out), sizes 1-4 each;
   two axis variables may name the same axis unless a guard says otherwise. A rule with no parallel op is
   checked on one device.
2. **Instances.** The left-hand side's variables get every instance of :mod:`unity_eq.verify._gen`.
3. **Guards.** Each instance is filtered, and the guard variables bound, by :mod:`unity_eq.verify._guards`.
4. **Selection.** Cases with the same *signature* are alike for the rule: same axis sizes, same values of
   every non-tensor variable (dims, axes, attributes), same rank of every tensor, and the same pattern of
   which dims are 1 and which divide each axis size. A proof checks every case; a ``budget`` (``--budget``,
   a generic proof's cross-check) checks the smallest case of each signature, at most ``budget`` of them
   (:mod:`unity_eq.verify._signatures`); past the budget, every *primary* class (axis sizes, guard
   bindings, String attributes) is still checked once.
5. **Check.** :func:`unity_eq.verify._semantics.evaluate_case` yields equations over z3 terms; syntactically
   equal sides (z3 hash-conses terms), sides whose difference is 0 as a sum of monomials
   (:func:`unity_eq.verify._tensor.same_polynomial`) and sides equal after ``z3.simplify`` pass at once, the
   rest go to a solver as one disjunction of disequalities: ``unsat`` proves the case, ``sat`` is a
   counterexample, ``unknown`` (timeout) leaves the case unknown.

Every case is checked; what its cases share a rule computes once: placement inference and the gradient
check per pattern of concrete terms, axis names, ``placed`` guards and size-1 axes (``_bounded_check._structure``),
z3 symbols and terms per operand ASTs (:mod:`unity_eq.verify._tensor`'s memo).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unity_eq.rulefile.domain import component_value, domain_components
from unity_eq.rulefile.terms import Rule
from unity_eq.verify._bounded_cases import (
    Case,
    Enumeration,
    bounded_token,
    enumerate_cases,
    enumeration_key,
    iter_cases,
    rule_axes,
    rule_meshes,
    unsupported_constructors,
    unsupported_reason,
)
from unity_eq.verify._bounded_check import (
    Counterexample,
    StructureCache,
    check_case,
    concrete_rule,
    placement_problem,
    solve_equations,
)
from unity_eq.verify._gen import GenConfig
from unity_eq.verify._guards import (
    DerivedFacts,
    GuardError,
)
from unity_eq.verify._signatures import by_signature

# The enumeration lives in _bounded_cases and the check of one case in _bounded_check; the prover's other
# modules import both from here.
__all__ = [
    "BoundedResult",
    "Case",
    "Counterexample",
    "Enumeration",
    "bounded_token",
    "concrete_rule",
    "enumerate_cases",
    "enumeration_key",
    "placement_problem",
    "prove_bounded",
    "rule_axes",
    "rule_meshes",
    "solve_equations",
    "unsupported_constructors",
]


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
    """Check every case of the ranges (``budget``: the smallest case of at most that many signatures, every
    primary class once, and the result is then ``partial`` when cases were left); stop at the first
    counterexample. ``cache`` shares enumerations (and samples) between rules with the same structure.

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
    cases = enum.cases if budget is None else _sample(rule, enum, budget, cache, key)
    _check_cases(rule, cases, timeout_ms, result, dtypes)
    if result.status == "proven" and len(cases) < len(enum.cases) and not result.reason:
        result.status = "partial"
        result.reason = (
            f"partial: the budget checked {len(cases)} of {len(enum.cases)} cases, the smallest of each signature "
            "(run without `--budget` for a proof)"
        )
    _no_case(result, enum.enumerated)
    result.seconds = time.perf_counter() - start
    return result


def _sample(rule: Rule, enum: Enumeration, budget: int, cache: dict[Any, Any] | None, key: Any) -> list[Case]:
    """The smallest case of each signature, at most ``budget`` of them; kept beside the enumeration, since the
    early integer search and the cross-check of one rule (up to nine checks) take the same sample."""
    if cache is None:
        return by_signature(enum.cases, rule, budget)[0]
    sample_key = ("sample", key, budget, rule.lhs, rule.rhs)  # placement variables of the rhs count too
    if sample_key not in cache:
        cache[sample_key] = by_signature(enum.cases, rule, budget)[0]
    return list(cache[sample_key])


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
    error = unsupported_reason(rule, facts)
    if error:
        result.status, result.reason = "unknown", error
        result.seconds = time.perf_counter() - start
        return result
    count = [0]
    seen: set[Any] = set()

    def fresh() -> Iterator[Case]:
        for case, identity in iter_cases(rule, facts, cfg, sizes, count, instances):
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
