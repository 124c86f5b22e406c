"""The float32 pass of the numeric back-up: rules whose terms feed float arithmetic into a discrete op.

Values are proven over the reals, where ``a + c > b + c`` is ``a > b``; in float32 ``1e8 + 1`` is ``1e8`` and
the comparison flips (issue 21's adversary corpus). Rounding that only moves a float result a little (a sum
reassociated, a partial sum all-reduced in another order) is accepted: that is what every parallel plan does.
A discrete result is not a little off: a comparison, a Where's choice, a Floor or a Cast to an integer either
agrees or does not. So for every rule whose terms feed float arithmetic into a discrete op (:func:`needs_float32`),
both sides are evaluated in float32 on stressed inputs (values drawn from a small pool of large and small
magnitudes, so sums absorb small addends and equal values tie), and:

* an output of a discrete op (a comparison, ``Not``/``And``/``Or``/``Xor``, ``Floor``/``Ceil``/``Round``/``Sign``,
  ``IsNaN``, the step ``ThresholdedRelu``, ``Cast`` to an integer or bool) must be **exactly** equal on both
  sides;
* any other output may differ by ``FLOAT32_RTOL`` times the magnitude of the values it is computed from, per
  element (:class:`MagnitudeBackend`: the same evaluation on absolute values, sums of magnitudes, a Where
  taking the larger of its branches' magnitudes, never its condition's). A Where whose choice flips shows as
  the difference of its branches, which that bound does not cover.

A case whose float32 evaluation overflows (an infinity or a NaN on either side) is not a case: proofs assume
finite, NaN-free inputs (docs/verify.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Rule, Term, walk
from unity_eq.verify._semantics import PARALLEL
from unity_eq.verify._tensor import NumpyBackend

__all__ = ["FLOAT32_RTOL", "Float32Backend", "MagnitudeBackend", "is_discrete", "needs_float32"]

#: a float output's float32 difference allowed, relative to its magnitude bound (rounding of float32 is about
#: 6e-8 per operation; a sum of n terms is off by at most about n times that of the sum of their magnitudes)
FLOAT32_RTOL = 1e-4

#: ops whose output takes a few values, so float rounding of their operands flips it rather than moving it
DISCRETE = frozenset(
    {
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Xor",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "IsNaN",
        # a step (0 up to alpha, then its input): a rounding of its operand that crosses alpha moves the output
        # by the step's height, not by a last bit, as a comparison flips (issue 21's fourth adversary:
        # ``(a + c) − c`` under it was "proven"); so its output, too, must be equal
        "ThresholdedRelu",
    }
)
#: ONNX dtypes (TensorProto) a Cast to which is discrete: the integers and bool
_INTEGER_TO = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})
#: stressed magnitudes: large ones absorb small ones in a float32 sum (spacing 8 at 1e8), and a small pool
#: makes equal values (ties) common
_POOL = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 1e-3, 1e8, 3e7, 2.0**24], dtype=np.float32)


def _is_int_cast(term: App) -> bool:
    to = term.args[2] if len(term.args) > 2 else None
    return isinstance(to, Lit) and int(to.value) in _INTEGER_TO


def is_discrete(term: Term) -> bool:
    """Whether ``term`` (its parallel ops aside: they move values, they do not compute) is a discrete op's
    output."""
    while isinstance(term, App) and term.head in PARALLEL:
        term = term.args[0]
    if not isinstance(term, App):
        return False
    return term.head in DISCRETE or (term.head == "Cast" and _is_int_cast(term))


#: ops that round: arithmetic (sums, products, quotients, the normalizations' and unary functions'), and a
#: Reduce's sum of pieces. Data movement, Max/Min/Clip/Where, max pooling and the discrete ops themselves
#: return one of their inputs' values (or a value no rounding reaches).
_EXACT = frozenset(
    {
        "Neg",
        "Identity",
        "Abs",
        "Relu",
        "Max",
        "Min",
        "Clip",
        "Where",
        "MaxPool",
        "GlobalMaxPool",
        "ReduceMax",
        "ReduceMin",
        *DISCRETE,
        "Cast",
    }
)
_MOVES = frozenset({"reshape", "transpose", "concat", "split", "slice", "expand", "gather"})


def _rounds(head: str) -> bool:
    if head == "Reduce":
        return True
    spec = OPS.get(head)
    return spec is not None and head not in _EXACT and spec.family.value not in _MOVES and head != "SpaceToDepth"


def _computes(term: Term) -> bool:
    """Whether float rounding happens in ``term``."""
    return any(isinstance(t, App) and _rounds(t.head) for t in walk(term))


def _discrete_operands(term: App) -> list[Term]:
    """The operands of ``term`` whose rounding its discrete output reads (a Where's condition; a Cast's
    operand when its target is an integer, bool, or a variable)."""
    if term.head == "Where":
        return list(term.args[:1])
    if term.head == "Cast":
        to = term.args[2] if len(term.args) > 2 else None
        return [term.args[0]] if not isinstance(to, Lit) or _is_int_cast(term) else []
    if term.head in DISCRETE:
        return [term.args[i] for i in OPS[term.head].tensor_args if i < len(term.args)]
    if term.head == "Pow":  # a negative base has a power only at integer exponents: a rounded one is NaN
        return list(term.args[1:2])
    return []


def needs_float32(rule: Rule) -> bool:
    """Whether a term of either side feeds float arithmetic into a discrete op (a comparison, a Where's
    condition, Floor…, a Cast to an integer): only there does float32 rounding change more than a last bit.
    A Cast whose target is a variable counts as discrete (it may be one)."""
    for side in (rule.lhs, rule.rhs):
        for t in walk(side):
            if not isinstance(t, App):
                continue
            operands = _discrete_operands(t)
            if any(_computes(o) for o in operands):
                return True
    return False


def _f32(x: Any) -> Any:
    return np.asarray(x, dtype=np.float32)


def _stressed(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """Values from the pool, random signs; a quarter of them ordinary (standard normal)."""
    picks = _POOL[rng.integers(0, len(_POOL), size=shape)]
    signs = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0).astype(np.float32)
    normal = rng.standard_normal(shape).astype(np.float32)
    return np.asarray(np.where(rng.random(size=shape) < 0.25, normal, picks * signs), dtype=np.float32)


class Float32Backend(NumpyBackend):
    """Every arithmetic operation rounded to float32, on stressed inputs; the discrete unary ops (Floor,
    Round, Sign, ThresholdedRelu, Cast…) with their real meaning (uninterpreted functions elsewhere stay the numeric
    back-up's smooth functions)."""

    name = "float32"

    def symbols(self, prefix: str, shape: Any, integer: bool = False, high: int = 0) -> np.ndarray:
        if integer:
            return super().symbols(prefix, shape, integer, high)
        return _stressed(self.rng, shape)

    def scalar(self, name: str) -> float:
        return float(np.float32(super().scalar(name)))

    def apply(self, name: str, *args: Any) -> Any:
        base = name.split("[")[0]
        x = _f32(args[0])
        if base == "Floor":
            return np.floor(x)
        if base == "Ceil":
            return np.ceil(x)
        if base == "Round":
            return np.round(x)  # half to even, as ONNX's Round
        if base == "Sign":
            return np.sign(x)
        if base == "IsNaN":
            return _f32(np.isnan(x))
        if base == "ThresholdedRelu":  # its float attribute alpha is the extra argument
            alpha = np.float32(args[1]) if len(args) > 1 else np.float32(1.0)
            return _f32(np.where(x > alpha, x, 0))
        if base == "Not":
            return _f32(x == 0)
        if base in ("And", "Or", "Xor"):
            y = _f32(args[1]) != 0
            fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[base]
            return _f32(fn(x != 0, y))
        if base == "Pow":  # the smooth stand-in, undefined (NaN) where the real power is: a negative base
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                undefined = np.isnan(np.power(x, _f32(args[1])))
            return _f32(np.where(undefined, np.nan, super().apply(name, *args)))
        if base == "Cast":
            tags = name[len(base) + 1 : -1].split(",") if "[" in name else []
            to = int(tags[-1]) if tags else 1
            if to == 9:
                return _f32(x != 0)
            return np.trunc(x) if to in _INTEGER_TO else x
        return _f32(super().apply(name, *args))

    # an overflow is expected on stressed inputs (1e8 cubed): the trial is then skipped, quietly
    def add(self, a: Any, b: Any) -> Any:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.add(_f32(a), _f32(b))

    def sub(self, a: Any, b: Any) -> Any:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.subtract(_f32(a), _f32(b))

    def mul(self, a: Any, b: Any) -> Any:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.multiply(_f32(a), _f32(b))

    def div(self, a: Any, b: Any) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(_f32(a), _f32(b))

    def total(self, items: Sequence[Any]) -> Any:
        if not items:
            return np.float32(0.0)
        out = _f32(items[0])
        for item in items[1:]:
            out = out + _f32(item)
        return out

    def truth(self, cond: Any) -> Any:
        return _f32(cond)

    def sum_pieces(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        return np.asarray(self.total(list(pieces)))


class MagnitudeBackend(NumpyBackend):
    """The same evaluation on magnitudes: the absolute values of :class:`Float32Backend`'s inputs (drawn from
    the same seed), and for every result a bound of the magnitudes it is computed from, so that a float
    output's rounding is judged against what it sums, not against its own (possibly cancelled) value. A
    Where takes the larger magnitude of its branches, never its condition's: a flipped choice is a
    difference of branches, which this bound does not excuse."""

    name = "magnitude"

    def symbols(self, prefix: str, shape: Any, integer: bool = False, high: int = 0) -> np.ndarray:
        if integer:
            return super().symbols(prefix, shape, integer, high)
        return np.asarray(np.abs(_stressed(self.rng, shape).astype(float)))

    def scalar(self, name: str) -> float:
        return abs(float(np.float32(super().scalar(name))))

    def apply(self, name: str, *args: Any) -> Any:
        # a smooth function (tanh plus a linear term, NumpyBackend.apply) or a discrete one: at most about
        # 1 + 3 times its arguments' magnitudes
        return 1.0 + 3.0 * sum(np.abs(np.asarray(a, dtype=float)) for a in args)

    def add(self, a: Any, b: Any) -> Any:
        return np.abs(np.asarray(a, dtype=float)) + np.abs(np.asarray(b, dtype=float))

    sub = add

    def mul(self, a: Any, b: Any) -> Any:
        return np.abs(np.asarray(a, dtype=float)) * np.abs(np.asarray(b, dtype=float))

    def div(self, a: Any, b: Any) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.abs(np.asarray(a, dtype=float)) / np.abs(np.asarray(b, dtype=float))

    def neg(self, a: Any) -> Any:
        return np.abs(np.asarray(a, dtype=float))

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return np.maximum(np.abs(np.asarray(a, dtype=float)), np.abs(np.asarray(b, dtype=float)))

    def total(self, items: Sequence[Any]) -> Any:
        return sum((abs(float(x)) for x in items), 0.0)

    def largest(self, items: Sequence[Any]) -> Any:
        return max(abs(float(x)) for x in items)

    smallest = largest

    def truth(self, cond: Any) -> Any:
        return np.ones(np.shape(cond))

    def sum_pieces(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        return np.asarray(sum(np.abs(np.asarray(p, dtype=float)) for p in pieces))
