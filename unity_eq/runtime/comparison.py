"""Comparing a plan's outputs with the original model's (:func:`compare_outputs`): float outputs within a
tolerance scaled by their dtype's precision (:func:`tolerance_for`), integer and boolean ones exactly; what
``check`` reports (:class:`CheckResult`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from unity_eq.dtypes import is_float, relative_precision


@dataclass
class OutputComparison:
    name: str
    passed: bool
    max_abs_error: float
    relative_error: float
    index: tuple[int, ...]
    expected: float
    got: float
    inputs: str = ""  # which inputs gave this (the worst) error
    # "float64" when judged against the original model run in float64 (runtime/reference64.py) because the
    # float32 reference disagreed; float32_error is then the plan's relative error against the float32 reference
    reference: str = ""
    float32_error: float | None = None
    # measured when the float64 model ran (whatever its verdict): the plan's and onnxruntime's float32 result's
    # relative errors against it
    float64_error: float | None = None
    onnxruntime_error: float | None = None
    tolerance: float | None = None  # the tolerance this output was judged by (its dtype's: see tolerance_for)
    no_float64: str = ""  # why a mismatching float32 output had no float64 second opinion

    def describe_float64(self) -> str:
        """What the float64 second opinion measured on this output (empty when it was not asked): the plan's
        error and onnxruntime's float32 error against the float64 model, both measured, and the verdict."""
        if self.no_float64:
            return f"; {self.name!r}: no float64 second opinion ({self.no_float64})"
        if self.float64_error is None:
            return ""
        plan_vs_ort = self.float32_error if self.reference == "float64" else self.relative_error
        ort = f"{self.onnxruntime_error:.2e}" if self.onnxruntime_error is not None else "not measured"
        verdict = "within" if self.reference == "float64" else "beyond"
        return (
            f"; {self.name!r} against the original model run in float64: plan off by {self.float64_error:.2e}, "
            f"onnxruntime's float32 result off by {ort} (plan vs onnxruntime {plan_vs_ort:.2e}); the plan is "
            f"{verdict} tolerance of the float64 result"
        )


@dataclass
class CheckResult:
    """The worst error of every output of the original model over every set of inputs tried."""

    outputs: list[OutputComparison]
    tolerance: float
    draws: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst(self) -> OutputComparison:
        return max(self.outputs, key=lambda o: (not o.passed, o.relative_error))

    def describe(self) -> str:
        w = self.worst
        verdict = "match" if self.passed else "MISMATCH"
        tried = f" over {len(self.draws)} input sets" if len(self.draws) > 1 else ""
        where = f" ({w.inputs})" if w.inputs else ""
        allowed = w.tolerance if w.tolerance is not None else self.tolerance
        exact = "; integers and booleans exactly" if isinstance(w.expected, int) else ""
        text = (
            f"{verdict}: {len(self.outputs)} output(s){tried}; worst {w.name!r} relative error "
            f"{w.relative_error:.2e} (tolerance {allowed:.3g}{exact}){where}, max abs error "
            f"{w.max_abs_error:.3g} at {list(w.index)}: expected {_shown(w.expected)}, got {_shown(w.got)}"
        )
        for o in self.outputs:
            text += o.describe_float64()
        return text


def _shown(value: float) -> str:
    """A value in a message: an integer in full (two int64 that differ in the last digit must read apart)."""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def compare_outputs(
    expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], tolerance: float = 1e-4
) -> CheckResult:
    """Relative error of each output: max |a − b| / max |a|. Integers and booleans must match exactly, in
    their own dtype (see :func:`_compare_exact`); equal values (infinities included) and NaN against NaN count
    as equal."""
    results = []
    for name, ref in expected.items():
        ref = np.asarray(ref)
        out = np.asarray(got[name])
        if ref.shape != out.shape:
            results.append(OutputComparison(name, False, float("inf"), float("inf"), (), float("nan"), float("nan")))
            continue
        if ref.size == 0:
            results.append(OutputComparison(name, ref.dtype == out.dtype, 0.0, 0.0, (), 0.0, 0.0))
            continue
        if ref.dtype.kind in "iub":
            results.append(_compare_exact(name, ref, out))
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        same = (ref == out) | (np.isnan(ref) & np.isnan(out)) if ref.dtype.kind == "f" else ref == out
        diff = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
        index = np.unravel_index(int(np.argmax(diff)), ref.shape)
        max_abs = float(diff[index])
        finite = np.isfinite(ref) if ref.dtype.kind == "f" else np.ones(ref.shape, bool)
        scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
        relative = max_abs / max(scale, 1e-30)
        allowed = tolerance_for(ref.dtype, tolerance)
        passed = relative <= allowed
        results.append(
            OutputComparison(
                name,
                passed,
                max_abs,
                relative,
                tuple(int(i) for i in index),
                float(ref[index]),
                float(out[index]),
                tolerance=allowed,
            )
        )
    return CheckResult(results, tolerance)


#: A narrow float output is allowed this many units of its type's precision (relative to the output's largest
#: value): ten roundings' worth, as a plan's sum in another order, or its partial sums rounded to the type
#: before an all-reduce, may be that far from the original's.
PRECISION_UNITS = 10


def tolerance_for(dtype: np.dtype, tolerance: float) -> float:
    """The relative error an output of ``dtype`` may have: ``tolerance`` (`--tolerance`, meant for float32), or
    :data:`PRECISION_UNITS` times the type's machine epsilon when that is larger: 9.8e-3 for float16, 7.8e-2
    for bfloat16 (7 bits of mantissa), against 1e-4 for float32 and float64."""
    return max(tolerance, PRECISION_UNITS * relative_precision(dtype)) if is_float(dtype) else tolerance


def _compare_exact(name: str, ref: np.ndarray, out: np.ndarray) -> OutputComparison:
    """An integer or boolean output: every element equal, compared in the integers themselves (an int64 above
    2**53 differs from its neighbour, which a float64 difference would call 0) and in the same dtype (a plan
    that returns floats where the model returns integers is wrong even when the values agree)."""
    differ = ref != out if ref.dtype == out.dtype else np.ones(ref.shape, bool)
    if not differ.any():
        return OutputComparison(name, True, 0.0, 0.0, (), 0.0, 0.0)
    index = tuple(int(i) for i in np.argwhere(differ)[0])
    expected, got = ref[index].item(), out[index].item()
    error = abs(int(expected) - int(got)) if isinstance(got, int | bool) else abs(float(expected) - float(got))
    scale = max(int(np.max(np.abs(ref.astype(np.float64)))), 1)
    return OutputComparison(name, False, float(max(error, 1)), float(max(error, 1)) / scale, index, expected, got)
