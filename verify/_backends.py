"""The backends the tensor semantics (:mod:`unity_eq.verify._tensor`) evaluates with: z3 expressions for
proofs, float64 arrays for the numeric back-up, and their integer variants (division truncates)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import z3

from unity_eq.ops.tensors import obj
from unity_eq.verify._z3_terms import (
    CREF,
    CTX,
    MEMO,
    Z3_OPS,
    as_real,
    ast_of,
    memo_key,
    remember,
    z3_array,
    z3_cmp,
    z3_div,
    z3_ite,
    z3_sum,
)

Shape = tuple[int, ...]


_SYMS: dict[tuple[str, bool], z3.ArithRef] = {}
_SYMBOL_ARRAYS: dict[tuple[str, Shape, bool], np.ndarray] = {}


def is_z3_expr(x: Any) -> bool:
    return isinstance(x, z3.ExprRef)


class Z3Backend:
    """Builds z3 expressions; symbols and functions are cached so equal inputs are equal ASTs.

    Terms are built through z3's C API (3-10 times faster than the Python operators); every value is a
    Real except Gather's indices, which are Ints and only ever compared.
    """

    name = "z3"
    symbolic = True  # arrays hold z3 terms: a family's semantics builds n-ary sums and if-then-else terms

    def __init__(self) -> None:
        self._fns: dict[tuple[str, int], z3.FuncDeclRef] = {}
        self._ufuncs: dict[tuple[str, int], Any] = {}
        self.zero = z3.RealVal(0)
        #: a non-zero symbol's reciprocal (``nonzero-values``): dividing by it multiplies, so quotients stay
        #: polynomials that ``same_polynomial`` normalizes (a division inside a softmax defeats z3 otherwise)
        self.reciprocals: dict[int, Any] = {}

    def reciprocal(self, sym: Any) -> Any:
        """A symbol ``1/sym`` for the non-zero ``sym``: the caller assumes ``sym * reciprocal == 1``."""
        inv = self.symbol(f"1/{sym}")
        self.reciprocals[sym.ast.value] = inv
        return inv

    def symbol(self, name: str, integer: bool = False) -> z3.ArithRef:
        # z3 makes one constant per (name, sort) in a context, so one cache serves every backend and case
        sym = _SYMS.get((name, integer))
        if sym is None:
            sym = z3.Int(name) if integer else z3.Real(name)
            _SYMS[(name, integer)] = sym
        return sym

    def symbols(self, prefix: str, shape: Shape, integer: bool = False) -> np.ndarray:
        """A fresh array of the symbols ``prefix[i]`` (flat index ``i``); a bounded proof asks for the same
        arrays in thousands of cases, so they are built once and copied."""
        key = (prefix, tuple(shape), integer)
        built = _SYMBOL_ARRAYS.get(key)
        if built is None:
            built = np.empty(shape, dtype=object)
            flat = built.reshape(-1)
            for i in range(flat.size):
                flat[i] = self.symbol(f"{prefix}[{i}]", integer)
            _SYMBOL_ARRAYS[key] = built
        return built.copy()

    def scalar(self, name: str) -> z3.ArithRef:
        return self.symbol(name)

    def function(self, name: str, arity: int) -> z3.FuncDeclRef:
        key = (name, arity)
        fn = self._fns.get(key)
        if fn is None:
            fn = z3.Function(name, *([z3.RealSort()] * (arity + 1)))
            self._fns[key] = fn
        return fn

    def apply(self, name: str, *args: Any) -> Any:
        key = (name, len(args))
        uf = self._ufuncs.get(key)
        if uf is None:
            fn = self.function(name, len(args))
            decl, n = fn.ast, len(args)

            def make(*a: Any) -> Any:
                key = ("app", decl.value, *map(memo_key, a))
                hit = MEMO.get(key)
                if hit is not None:
                    return hit[0]
                return remember(key, as_real(z3.Z3_mk_app(CREF, decl, n, z3_array(a))), (fn, a))

            uf = np.frompyfunc(make, n, 1)
            self._ufuncs[key] = uf
        return obj(uf(*args))

    def add(self, a: Any, b: Any) -> Any:
        return Z3_OPS["add"](a, b)

    def sub(self, a: Any, b: Any) -> Any:
        return Z3_OPS["sub"](a, b)

    def mul(self, a: Any, b: Any) -> Any:
        return Z3_OPS["mul"](a, b)

    def div(self, a: Any, b: Any) -> Any:
        if not self.reciprocals:
            return Z3_OPS["div"](a, b)
        inverse = np.frompyfunc(lambda y: self.reciprocals.get(y.ast.value) if is_z3_expr(y) else None, 1, 1)(b)
        if any(x is None for x in np.asarray(inverse).reshape(-1)):
            return Z3_OPS["div"](a, b)
        return Z3_OPS["mul"](a, inverse)

    def neg(self, a: Any) -> Any:
        return Z3_OPS["neg"](a)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return obj(Z3_OPS["ite"](cond, a, b))

    def total(self, items: Sequence[Any]) -> Any:
        return z3_sum(items) if items else self.zero

    def largest(self, items: Sequence[Any]) -> Any:
        out = items[0]
        for item in items[1:]:
            out = z3_ite(z3.BoolRef(z3.Z3_mk_gt(CREF, ast_of(item), ast_of(out)), CTX), item, out)
        return out

    def smallest(self, items: Sequence[Any]) -> Any:
        out = items[0]
        for item in items[1:]:
            out = z3_ite(z3.BoolRef(z3.Z3_mk_lt(CREF, ast_of(item), ast_of(out)), CTX), item, out)
        return out

    def truth(self, cond: Any) -> Any:
        return self.where(cond, z3.RealVal(1), self.zero)

    def nonzero(self, x: Any) -> Any:
        return obj(np.frompyfunc(lambda v: v != 0, 1, 1)(x))

    def compare(self, op: str, a: Any, b: Any) -> Any:
        """Elementwise comparison (numpy's object comparisons would call bool() on z3 terms)."""
        return obj(_Z3_CMP[op](a, b))

    def sum_pieces(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        out = np.empty(pieces[0].shape, dtype=object)
        flats = [p.reshape(-1) for p in pieces]
        of = out.reshape(-1)
        for i in range(of.size):
            of[i] = z3_sum([f[i] for f in flats])
        return out


class NumpyBackend:
    """Float64 arrays; uninterpreted functions become fixed smooth functions derived from their names."""

    name = "numpy"
    symbolic = False

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = rng or np.random.default_rng(0)
        self.zero = 0.0
        self._scalars: dict[str, float] = {}

    def symbols(self, prefix: str, shape: Shape, integer: bool = False, high: int = 0) -> np.ndarray:
        if integer:
            return np.asarray(self.rng.integers(-high, high, size=shape) if high else np.zeros(shape, dtype=np.int64))
        return np.asarray(self.rng.standard_normal(shape))

    def scalar(self, name: str) -> float:
        if name not in self._scalars:
            self._scalars[name] = float(self.rng.uniform(0.25, 1.5))
        return self._scalars[name]

    def apply(self, name: str, *args: Any) -> Any:
        digest = hashlib.sha256(f"{name}/{len(args)}".encode()).digest()
        c = [(b / 255.0) * 1.5 + 0.25 for b in digest[: len(args) + 3]]
        lin = c[-3] + sum(ci * np.asarray(a, dtype=float) for ci, a in zip(c, args, strict=False))
        return np.tanh(lin) + c[-2] * np.asarray(args[0], dtype=float) * c[-1]

    def add(self, a: Any, b: Any) -> Any:
        return np.add(a, b)

    def sub(self, a: Any, b: Any) -> Any:
        return np.subtract(a, b)

    def mul(self, a: Any, b: Any) -> Any:
        return np.multiply(a, b)

    def div(self, a: Any, b: Any) -> Any:
        return np.divide(a, b)

    def neg(self, a: Any) -> Any:
        return np.negative(a)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return np.where(cond, a, b)

    def total(self, items: Sequence[Any]) -> Any:
        return sum(items[1:], items[0]) if items else 0.0

    def largest(self, items: Sequence[Any]) -> Any:
        return max(items)

    def smallest(self, items: Sequence[Any]) -> Any:
        return min(items)

    def truth(self, cond: Any) -> Any:
        return np.asarray(cond, dtype=float)

    def nonzero(self, x: Any) -> Any:
        return np.asarray(x) != 0

    def compare(self, op: str, a: Any, b: Any) -> Any:
        return _NP_CMP[op](a, b)

    def sum_pieces(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        out = np.asarray(pieces[0], dtype=float)
        for p in pieces[1:]:
            out = np.asarray(out + p)
        return out


def _z3_trunc_div(a: Any, b: Any) -> Any:
    """ONNX's integer division: the quotient truncated toward zero (``-7 / 2`` is ``-3``), on integer-valued
    reals (the verifier's integer tensors are reals constrained to be integers)."""
    q = z3_div(a, b)
    floor = z3.ToReal(z3.ToInt(q))
    ceil = -z3.ToReal(z3.ToInt(-q))
    return z3.If(q >= 0, floor, ceil)


_Z3_TRUNC_DIV = np.frompyfunc(_z3_trunc_div, 2, 1)


class Z3IntegerBackend(Z3Backend):
    """The z3 backend for ops on integer tensors: division truncates (``Div``, ``ReduceMean``'s mean); sums,
    products, maxima and comparisons are the reals' restricted to integers."""

    integer = True

    def div(self, a: Any, b: Any) -> Any:
        return _Z3_TRUNC_DIV(a, b)


class NumpyIntegerBackend(NumpyBackend):
    """The numpy backend for ops on integer tensors: division truncates, as onnxruntime's does."""

    integer = True

    def div(self, a: Any, b: Any) -> Any:
        return np.trunc(np.divide(a, b))


Backend = Z3Backend | NumpyBackend

_Z3_CMP = {
    "<": np.frompyfunc(z3_cmp("<", z3.Z3_mk_lt), 2, 1),
    ">": np.frompyfunc(z3_cmp(">", z3.Z3_mk_gt), 2, 1),
    "<=": np.frompyfunc(z3_cmp("<=", z3.Z3_mk_le), 2, 1),
    ">=": np.frompyfunc(z3_cmp(">=", z3.Z3_mk_ge), 2, 1),
    "==": np.frompyfunc(z3_cmp("==", z3.Z3_mk_eq), 2, 1),
}
_NP_CMP = {
    "<": np.less,
    ">": np.greater,
    "<=": np.less_equal,
    ">=": np.greater_equal,
    "==": np.equal,
}
