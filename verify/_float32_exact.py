"""Exact float32: z3's floating-point theory on a rule's elementwise skeleton, where rounding reaches a comparison.

The float32 pass (:mod:`unity_eq.verify._float32`) samples stressed inputs; it never drew the neighbouring
floats whose products round to one value, so ``Equal(a·c, b·c) = Equal(a, b)`` (c nonzero) passed it while
float32 refutes it (issue 21's sixth adversary). For a rule whose two sides are built only from elementwise
ops (arithmetic, Max/Min/Abs/Relu, comparisons, logic, Where) over its tensor variables, every output element
is the same scalar function of one element of each variable (broadcasting picks which element; a variable
read twice is read at the same index), and a tensor whose elements all equal a scalar gives that scalar
everywhere. So one IEEE float32 symbol per variable decides the rule exactly: z3 (``FPSort(8, 24)``, round to
nearest even, as onnxruntime computes) is asked for finite inputs on which the discrete outputs differ, with
no intermediate value overflowing and no NaN (the documented assumptions) and the ``nonzero-values`` guards
as premises. Commutative operands are put in one order first (``a + c`` and ``c + a`` are one term), since z3
decides little about float32 sums that differ only in that.

``sat`` refutes the rule with the inputs; ``unsat`` proves its discrete output in float32; a timeout leaves
the float32 pass's sampling as the only word, as before.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from unity_eq.rulefile.terms import App, Rule, Term, Var, walk
from unity_eq.verify._bounded_check import Counterexample
from unity_eq.verify._float32 import is_discrete, needs_float32
from unity_eq.verify._numeric import NumericResult
from unity_eq.verify._rule_report import RuleReport

__all__ = ["EXACT_TIMEOUT_MS", "ExactFloat32", "exact_float32", "refute_in_float32"]

#: z3's time for one rule (its counterexamples took 0.7-4 s here; an undecided rule keeps the sampled verdict)
EXACT_TIMEOUT_MS = 20_000

_COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Equal", "And", "Or", "Xor"})
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "Equal": z3.fpEQ,
    "Less": z3.fpLT,
    "Greater": z3.fpGT,
    "LessOrEqual": z3.fpLEQ,
    "GreaterOrEqual": z3.fpGEQ,
}
_ARITH = {"Add": z3.fpAdd, "Sub": z3.fpSub, "Mul": z3.fpMul, "Div": z3.fpDiv}
_UNARY_EXACT = frozenset({"Neg", "Abs", "Relu", "Identity"})
_LOGIC = frozenset({"Not", "And", "Or", "Xor"})
_HEADS = frozenset({*_COMPARE, *_ARITH, *_UNARY_EXACT, *_LOGIC, "Max", "Min", "Where"})


@dataclass
class ExactFloat32:
    status: str  # refuted | proven | unknown
    inputs: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


class _NotElementwise(Exception):
    pass


def applies(rule: Rule) -> bool:
    """Whether ``rule``'s sides are elementwise skeletons with a discrete output and its guards read no value
    but ``nonzero-values``."""
    if not (is_discrete(rule.lhs) and is_discrete(rule.rhs)):
        return False
    sorts = rule.var_sorts
    for side in (rule.lhs, rule.rhs):
        for t in walk(side):
            if isinstance(t, Var) and sorts.get(t.name) != "T":
                return False
            if isinstance(t, App) and t.head not in _HEADS:
                return False
            if not isinstance(t, App | Var):
                return False
    return all(not _dtype_restricted(g) for g in rule.guards)


def _dtype_restricted(guard: Term) -> bool:
    """A guard that reads a dtype other than through ``float-dtype`` (which admits float32)."""
    if isinstance(guard, App) and guard.head == "float-dtype":
        return False
    return any(isinstance(t, App) and t.head == "dtype" for t in walk(guard))


class _Skeleton:
    """Both sides as z3 float32 (or Bool) terms, each intermediate float recorded to be kept finite."""

    def __init__(self) -> None:
        self.sort = z3.Float32()
        self.rm = z3.RNE()
        self.vars: dict[str, Any] = {}
        self.intermediates: list[Any] = []

    def var(self, name: str) -> Any:
        if name not in self.vars:
            self.vars[name] = z3.FP(name, self.sort)
        return self.vars[name]

    def float_of(self, x: Any) -> Any:
        return z3.If(x, z3.FPVal(1.0, self.sort), z3.FPVal(0.0, self.sort)) if z3.is_bool(x) else x

    def bool_of(self, x: Any) -> Any:
        return x if z3.is_bool(x) else z3.Not(z3.fpIsZero(x))

    def term(self, t: Term) -> Any:
        if isinstance(t, Var):
            return self.var(t.name)
        if not isinstance(t, App) or t.head not in _HEADS:
            raise _NotElementwise(str(t))
        args = [self.term(a) for a in t.args]
        if t.head in _COMMUTATIVE and len(args) == 2:
            args.sort(key=lambda a: a.hash())
        out = self._apply(t.head, args)
        if not z3.is_bool(out):
            self.intermediates.append(out)
        return out

    def _apply(self, head: str, args: list[Any]) -> Any:
        if head in _ARITH:
            return _ARITH[head](self.rm, self.float_of(args[0]), self.float_of(args[1]))
        if head in _COMPARE:
            return _COMPARE[head](self.float_of(args[0]), self.float_of(args[1]))
        if head == "Neg":
            return z3.fpNeg(self.float_of(args[0]))
        if head == "Abs":
            return z3.fpAbs(self.float_of(args[0]))
        if head == "Relu":
            return z3.fpMax(self.float_of(args[0]), z3.FPVal(0.0, self.sort))
        if head == "Identity":
            return args[0]
        if head in ("Max", "Min"):
            return (z3.fpMax if head == "Max" else z3.fpMin)(self.float_of(args[0]), self.float_of(args[1]))
        if head == "Where":
            return z3.If(self.bool_of(args[0]), self.float_of(args[1]), self.float_of(args[2]))
        bools = [self.bool_of(a) for a in args]
        if head == "Not":
            return z3.Not(bools[0])
        if head == "And":
            return z3.And(bools[0], bools[1])
        if head == "Or":
            return z3.Or(bools[0], bools[1])
        return z3.Xor(bools[0], bools[1])


def exact_float32(rule: Rule, timeout_ms: int = EXACT_TIMEOUT_MS) -> ExactFloat32 | None:
    """The rule's discrete output decided in float32, or None where the rule is no elementwise skeleton."""
    if not applies(rule):
        return None
    start = time.perf_counter()
    sk = _Skeleton()
    try:
        lhs, rhs = sk.term(rule.lhs), sk.term(rule.rhs)
    except _NotElementwise:
        return None
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    for x in [*sk.vars.values(), *sk.intermediates]:
        solver.add(z3.Not(z3.fpIsNaN(x)), z3.Not(z3.fpIsInf(x)))
    for g in rule.guards:
        if isinstance(g, App) and g.head == "nonzero-values" and g.args and isinstance(g.args[0], Var):
            solver.add(z3.Not(z3.fpIsZero(sk.var(g.args[0].name))))
    solver.add(sk.float_of(lhs) != sk.float_of(rhs) if not z3.is_bool(lhs) else lhs != sk.bool_of(rhs))
    verdict = solver.check()
    seconds = time.perf_counter() - start
    if verdict == z3.sat:
        model = solver.model()
        inputs = {name: _value(model.eval(v, model_completion=True)) for name, v in sk.vars.items()}
        return ExactFloat32("refuted", inputs, seconds)
    return ExactFloat32("proven" if verdict == z3.unsat else "unknown", seconds=seconds)


def _value(fp: Any) -> float:
    """A z3 float32 value as a Python float (exact: float32 values are doubles)."""
    bits = z3.simplify(z3.fpToIEEEBV(fp)).as_long()
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def refute_in_float32(rule: Rule, report: RuleReport) -> None:
    """``report`` of a proven rule whose elementwise float arithmetic feeds a discrete output: refuted when
    z3 finds float32 inputs on which the outputs differ; a proof or a timeout leaves it as it is."""
    exact = exact_float32(rule) if needs_float32(rule) else None
    if exact is None or exact.status != "refuted":
        return
    inputs = ", ".join(f"{k} = {v!r}" for k, v in sorted(exact.inputs.items()))
    message = (
        f"in float32 (z3's floating-point theory, round to nearest even) the outputs differ at {inputs}, "
        "finite inputs with no value overflowing: proven over the reals, the rule is wrong once float32 rounds"
    )
    cex = Counterexample("every element equal to its scalar; float32", "value", message, dict(exact.inputs))
    report.status, report.kind, report.message, report.domain = "refuted", "numeric", message, None
    report.numeric = NumericResult("failed", 1, counterexample=cex, seconds=exact.seconds)
