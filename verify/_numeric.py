"""Numeric back-up: both sides of a rule on random inputs at larger shapes, with numpy.

The cases come from the same enumeration as the bounded proof (every third instance of each operator), with
dims 1, 3, 6 and 8 and axis sizes 2-4,
and the same evaluator (:func:`unity_eq.verify._semantics.evaluate_case`) on float64 arrays; uninterpreted
functions are fixed smooth functions. A mismatch beyond ``1e-9`` relative error is a refutation.

Rules whose terms feed float arithmetic into a discrete op also get a float32 pass on the same cases
(:mod:`unity_eq.verify._float32`): stressed inputs, discrete outputs exactly equal, float ones within
rounding of their magnitudes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.rulefile.terms import Rule
from unity_eq.verify._bounded import (
    Case,
    Counterexample,
    Enumeration,
    concrete_rule,
    enumerate_cases,
    enumeration_key,
    placement_problem,
)
from unity_eq.verify._float32 import FLOAT32_RTOL, Float32Backend, MagnitudeBackend, is_discrete, needs_float32
from unity_eq.verify._gen import GenConfig
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._semantics import (
    EvalFailure,
    Placements,
    VarSpec,
    evaluate_case,
    infer_placements,
    lhs_placements,
)
from unity_eq.verify._tensor import NumpyBackend

__all__ = ["NUMERIC_CONFIG", "NumericResult", "check_numeric"]

NUMERIC_CONFIG = GenConfig(dims=(1, 3, 6, 8), max_rank=3, rank4_dims=(1, 3, 6), stride=3, sample=True)


@dataclass
class NumericResult:
    status: str  # passed | failed | skipped
    cases: int = 0
    max_error: float = 0.0
    counterexample: Counterexample | None = None
    seconds: float = 0.0
    float32: int = 0  # evaluations of the float32 pass (0: the rule feeds no float arithmetic to a discrete op)


def check_numeric(
    rule: Rule,
    facts: DerivedFacts,
    cases: int = 6,
    sizes: Sequence[int] = (2, 3, 4),
    seed: int = 0,
    tolerance: float = 1e-9,
    cache: dict[Any, Enumeration] | None = None,
    config: GenConfig = NUMERIC_CONFIG,
    largest_first: bool = True,
    limit: int | None = None,
) -> NumericResult:
    """Evaluate ``cases`` larger cases with random inputs; compare both sides and every piece. The cases
    are the largest of ``4 * cases`` signatures of ``config``'s enumeration; with ``largest_first`` False,
    the first ``cases`` signatures smallest first (the size sweep, which wants every size, not the largest),
    of the first ``limit`` cases the enumeration streams."""
    start = time.perf_counter()
    pool = 4 * cases if largest_first else cases
    key = enumeration_key(rule, facts, config, tuple(sizes), pool, limit) if cache is not None else None
    enum = cache.get(key) if cache is not None else None
    if enum is None:
        enum = enumerate_cases(rule, facts, config, sizes, budget=pool, placement_cases=False, limit=limit)
        if cache is not None:
            cache[key] = enum
    result = NumericResult("skipped")
    rng = np.random.default_rng(seed)
    checked: list[tuple[Case, Placements, dict[str, VarSpec]]] = []
    order = sorted(enum.cases, key=lambda c: -c.elements()) if largest_first else enum.cases
    for case in order:
        if result.cases >= cases:
            break
        describe = case.describe(rule.var_sorts)
        lhs, rhs, tensor_vars, specs = concrete_rule(rule, case)
        pl_lhs = lhs_placements(lhs, case.mesh.axes, case.placed, tensor_vars)
        if any(len(s) > 1 for s in pl_lhs.states.values()):
            continue
        pl = infer_placements(lhs, rhs, case.mesh.axes, case.placed, tensor_vars)
        problem = placement_problem(lhs, rhs, pl_lhs, pl, tensor_vars)
        if problem:
            result.status, result.counterexample = "failed", Counterexample(describe, "placement", problem)
            break
        try:
            equations, _values, _skip = evaluate_case(lhs, rhs, case.mesh, pl, specs, {}, NumpyBackend(rng))
        except EvalFailure as exc:
            result.status, result.counterexample = "failed", Counterexample(describe, exc.kind, exc.message)
            break
        if equations is None:
            continue
        checked.append((case, pl, specs))
        result.cases += 1
        result.status = "passed" if result.status != "failed" else "failed"
        if any(not np.allclose(np.asarray(e.left, float), np.asarray(e.right, float)) for e in equations if e.assume):
            continue  # these random inputs make the left-hand side itself inconsistent: not a case
        for eq in equations:
            if eq.assume:
                continue
            got = np.asarray(eq.left, dtype=float)
            want = np.asarray(eq.right, dtype=float)
            scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
            err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
            result.max_error = max(result.max_error, err)
            if not err <= tolerance:
                result.status = "failed"
                result.counterexample = Counterexample(
                    describe,
                    "value",
                    f"{eq.what} differs by {err:.3g} (relative) on random inputs",
                    check=f"{eq.what}: {eq.term}",
                    got=got.tolist(),
                    want=want.tolist(),
                )
                break
        if result.status == "failed":
            break
    if result.status != "failed" and needs_float32(rule):
        _float32_pass(rule, checked, seed, result)
    result.seconds = time.perf_counter() - start
    return result


#: stressed inputs per case of the float32 pass (each draws every input anew)
FLOAT32_TRIALS = 8


def _float32_pass(
    rule: Rule, checked: list[tuple[Case, Placements, dict[str, VarSpec]]], seed: int, result: NumericResult
) -> None:
    """Both sides of each case in float32 on stressed inputs, ``FLOAT32_TRIALS`` draws each (see
    :mod:`unity_eq.verify._float32`): a discrete output must be equal, a float one within
    ``FLOAT32_RTOL`` of its magnitude bound."""
    for n, (case, pl, specs) in enumerate(checked):
        lhs, rhs, _vars, _specs = concrete_rule(rule, case)
        for trial in range(FLOAT32_TRIALS):
            draw = [seed, n, trial]
            try:
                got = evaluate_case(
                    lhs, rhs, case.mesh, pl, specs, {}, Float32Backend(np.random.default_rng(draw)), gradients=False
                )
                bound = evaluate_case(
                    lhs, rhs, case.mesh, pl, specs, {}, MagnitudeBackend(np.random.default_rng(draw)), gradients=False
                )
            except EvalFailure:
                return  # the float64 pass evaluated this case: nothing new to say
            equations, values, _skip = got
            if equations is None or bound[0] is None or values is None:
                break
            result.float32 += 1
            why = _float32_mismatch(equations, bound[0], lhs)
            if why is None:
                continue
            eq, message = why
            inputs = {k: np.asarray(v, dtype=float).tolist() for k, v in values.inputs.items()}
            result.status = "failed"
            result.counterexample = Counterexample(
                case.describe(rule.var_sorts) + "; float32",
                "value",
                f"in float32 on stressed inputs, {eq.what} differs ({message}): proven over the reals, the rule "
                "is wrong once float32 rounds",
                inputs,
                check=f"{eq.what}: {eq.term}",
                got=np.asarray(eq.left, dtype=float).tolist(),
                want=np.asarray(eq.right, dtype=float).tolist(),
            )
            return


#: float32's largest finite value: a magnitude above it overflowed in float32 (the bounds are float64)
_F32_MAX = float(np.finfo(np.float32).max)


def _one_sided_nan(pairs: list[Any], values: list[tuple[np.ndarray, np.ndarray]]) -> tuple[Any, str] | None:
    """See :func:`_float32_mismatch`: the claim with a NaN on one side only, or None."""
    magnitudes = [np.asarray(b, dtype=float) for _eq, bound in pairs for b in (bound.left, bound.right)]
    if any(np.any(np.isinf(left) | np.isinf(right)) for left, right in values) or not all(
        np.all(m <= _F32_MAX) for m in magnitudes
    ):
        return None  # an overflow (NaN compares false: a NaN magnitude counts too)
    sided = [np.isnan(left) != np.isnan(right) for left, right in values]
    if any(eq.assume and np.any(one) for (eq, _b), one in zip(pairs, sided, strict=True)):
        return None  # the left-hand side's own pieces disagree: a premise broken, not a case
    for (eq, _bound), one in zip(pairs, sided, strict=True):
        if not eq.assume and np.any(one):
            return eq, "NaN on one side only, from finite inputs that overflow nowhere"
    return None


def _float32_mismatch(equations: list[Any], bounds: list[Any], lhs: Any) -> tuple[Any, str] | None:
    """The first claim that float32 breaks (with why), or None: a trial whose inputs overflow, or whose
    left-hand side's own pieces do not fit within rounding (a premise), says nothing. A trial with a value
    that is not finite says nothing either, except for a NaN on one side only of a claim where nothing
    overflows (no infinity anywhere, every magnitude within float32's range) and every premise is NaN on
    both sides or neither: an op's domain left (a negative base to a rounded exponent), a mismatch."""
    pairs = list(zip(equations, bounds, strict=True))
    values = [(np.asarray(eq.left, dtype=float), np.asarray(eq.right, dtype=float)) for eq in equations]
    if not all(np.all(np.isfinite(left)) and np.all(np.isfinite(right)) for left, right in values):
        return _one_sided_nan(pairs, values)
    checks = []
    for eq, bound in pairs:
        got, want = np.asarray(eq.left, dtype=float), np.asarray(eq.right, dtype=float)
        discrete = is_discrete(eq.node) or (eq.what == "global value" and is_discrete(lhs))
        if discrete:
            bad = got != want
            why = "a discrete output: it must be equal"
        else:
            scale = np.asarray(bound.left, dtype=float) + np.asarray(bound.right, dtype=float)
            bad = np.abs(got - want) > FLOAT32_RTOL * scale
            why = f"by more than {FLOAT32_RTOL:g} of the magnitudes it is computed from"
        if eq.assume and np.any(bad):
            return None
        checks.append((eq, bad, why))
    for eq, bad, why in checks:
        if not eq.assume and np.any(bad):
            return eq, why
    return None
