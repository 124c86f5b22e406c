"""Semantics of the tensor language: shape inference and evaluation of every typed constructor.

Values are numpy arrays: ``dtype=object`` arrays of z3 expressions for proofs (:class:`Z3Backend`), float64
arrays for the numeric back-up (:class:`NumpyBackend`); an absent optional input (``NoneT``) is ``None`` and
a ``TList`` a Python list. One implementation serves both backends: structural numpy operations (reshape,
transpose, concatenate, matmul, broadcasting) work on object arrays as they do on floats, and the few
operations that differ (uninterpreted functions, if-then-else, sums and maxima) go through the backend.

Exact and uninterpreted operations (the proof holds for every interpretation of an uninterpreted function):

* exact in z3: Neg, Identity, Add, Sub, Mul, Div, Max, Min, comparisons (1/0), Where, Clip, PRelu, MatMul,
  Gemm, Conv, pooling maxima and averages, sums and means, Concat/Split/Slice/Gather/Expand/Reshape/
  Transpose (pure data movement), and the normalizations' arithmetic;
* uninterpreted: every other unary op (Relu, Exp, Erf, Tanh, Sigmoid, Gelu…; float attributes are extra
  arguments, string/int attributes part of the name), Pow, And, Or, Xor, and the primitives ``exp``,
  ``log``, ``sqrt`` and ``pow`` inside Softmax, LogSoftmax, LayerNormalization, BatchNormalization and LRN.

The numeric backend replaces each uninterpreted function by a fixed smooth function derived from its name.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import z3

from unity_eq.ops.family import ShapeError  # one class: a plug-in family's shape errors are the verifier's
from unity_eq.ops.registry import OPS, family_for
from unity_eq.ops.spec import Family
from unity_eq.ops.tensors import bcast, check_axis, need, obj, out_dtype, reduce_elements

__all__ = ["NumpyBackend", "ShapeError", "Z3Backend", "evaluate", "infer_shape"]

Shape = tuple[int, ...]

EXACT_UNARY = {"Neg", "Identity"}
EXACT_BINARY = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "PRelu",
}


# ----------------------------------------------------------------------------------------------------------
# Backends


_CTX = z3.main_ctx()
_CREF = _CTX.ref()
_CONSTS: dict[Any, z3.ArithRef] = {}


def _ast(x: Any) -> Any:
    if isinstance(x, z3.ExprRef):
        return x.as_ast()
    const = _CONSTS.get(x)
    if const is None:
        const = z3.RealVal(x)
        _CONSTS[x] = const
    return const.as_ast()


def _arr(items: Sequence[Any]) -> Any:
    out = (z3.Ast * len(items))()
    for i, x in enumerate(items):
        out[i] = _ast(x)
    return out


def _real(ast: Any) -> z3.ArithRef:
    return z3.ArithRef(ast, _CTX)


def _is_add(ast: Any) -> bool:
    return (
        z3.Z3_get_ast_kind(_CREF, ast) == z3.Z3_APP_AST
        and z3.Z3_get_decl_kind(_CREF, z3.Z3_get_app_decl(_CREF, ast)) == z3.Z3_OP_ADD
    )


# Memo of built terms. A bounded proof evaluates a rule in thousands of cases whose symbols share names
# (``a[0]``…), so it builds the same terms again and again; z3 hash-conses them into the same AST anyway,
# and the memo only skips the Python wrappers and C calls (about 7 us a term, 0.4 us a hit). Keys are AST
# addresses: each entry keeps its operands alive, so an address in a key is never reused by another term.
_MEMO: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_MEMO_LIMIT = 100_000  # entries, under 0.7 kB each (120 000 three-term sums: 80 MB); emptied when full


def _key(x: Any) -> Any:
    return x.ast.value if isinstance(x, z3.ExprRef) else (x,)


def _remember(key: tuple[Any, ...], term: Any, operands: Any) -> Any:
    if len(_MEMO) >= _MEMO_LIMIT:
        _MEMO.clear()
    _MEMO[key] = (term, operands)
    return term


def _memo_binary(kind: str, build: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def make(a: Any, b: Any) -> Any:
        key = (kind, _key(a), _key(b))
        hit = _MEMO.get(key)
        return hit[0] if hit is not None else _remember(key, build(a, b), (a, b))

    return make


_SOM = z3.ParamsRef()
_SOM.set("som", True)


def same_polynomial(a: Any, b: Any) -> bool:
    """True when ``a - b`` normalizes to 0 as a sum of monomials (z3's ``som`` simplification), as the
    pieces of a partial value do under a linear op: ``(x0 + x1) * y`` and ``x0 * y + x1 * y``. Sound (an
    equivalence-preserving rewrite reached 0) and far cheaper than a solver; False says nothing. The cases
    of a rule compare the same pairs of terms again and again, so answers are memoized."""
    if not (isinstance(a, z3.ArithRef) and isinstance(b, z3.ArithRef)):
        return False
    key = ("som", a.ast.value, b.ast.value)
    hit = _MEMO.get(key)
    if hit is not None:
        return bool(hit[0])
    if a.is_int() != b.is_int():
        return False
    diff = _real(z3.Z3_simplify_ex(_CREF, _z3_sub(a, b).as_ast(), _SOM.params))
    ast = diff.as_ast()
    same = z3.Z3_get_ast_kind(_CREF, ast) == z3.Z3_NUMERAL_AST and z3.Z3_get_numeral_string(_CREF, ast) == "0"
    return bool(_remember(key, same, (a, b)))


def z3_sum(items: Sequence[Any]) -> Any:
    """An n-ary sum with nested sums spliced in, so equal sums built in different groupings are one term."""
    key = ("sum", *map(_key, items))
    hit = _MEMO.get(key)
    return hit[0] if hit is not None else _remember(key, _z3_sum(items), tuple(items))


def _z3_sum(items: Sequence[Any]) -> Any:
    asts: list[Any] = []
    for x in items:
        a = _ast(x)
        if _is_add(a):
            asts.extend(z3.Z3_get_app_arg(_CREF, a, i) for i in range(z3.Z3_get_app_num_args(_CREF, a)))
        else:
            asts.append(a)
    if len(asts) == 1:
        return _real(asts[0])
    arr = (z3.Ast * len(asts))(*asts)
    return _real(z3.Z3_mk_add(_CREF, len(asts), arr))


def _z3_binary(kind: str, mk: Any) -> Callable[[Any, Any], Any]:
    return _memo_binary(kind, lambda a, b: _real(mk(_CREF, 2, _arr((a, b)))))


_z3_sub = _z3_binary("sub", z3.Z3_mk_sub)
_z3_div = _memo_binary("div", lambda a, b: _real(z3.Z3_mk_div(_CREF, _ast(a), _ast(b))))
_z3_neg = _memo_binary("neg", lambda a, _b: _real(z3.Z3_mk_unary_minus(_CREF, _ast(a))))


def _z3_ite(c: Any, a: Any, b: Any) -> Any:
    key = ("ite", _key(c), _key(a), _key(b))
    hit = _MEMO.get(key)
    if hit is not None:
        return hit[0]
    return _remember(key, _real(z3.Z3_mk_ite(_CREF, c.as_ast(), _ast(a), _ast(b))), (c, a, b))


def _z3_cmp(kind: str, mk: Any) -> Callable[[Any, Any], Any]:
    return _memo_binary(kind, lambda a, b: z3.BoolRef(mk(_CREF, _ast(a), _ast(b)), _CTX))


_Z3_OPS = {
    "add": np.frompyfunc(_z3_binary("add", z3.Z3_mk_add), 2, 1),
    "sub": np.frompyfunc(_z3_sub, 2, 1),
    "mul": np.frompyfunc(_z3_binary("mul", z3.Z3_mk_mul), 2, 1),
    "div": np.frompyfunc(_z3_div, 2, 1),
    "neg": np.frompyfunc(lambda a: _z3_neg(a, None), 1, 1),
    "ite": np.frompyfunc(_z3_ite, 3, 1),
}


_SYMS: dict[tuple[str, bool], z3.ArithRef] = {}
_SYMBOL_ARRAYS: dict[tuple[str, Shape, bool], np.ndarray] = {}


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
                key = ("app", decl.value, *map(_key, a))
                hit = _MEMO.get(key)
                if hit is not None:
                    return hit[0]
                return _remember(key, _real(z3.Z3_mk_app(_CREF, decl, n, _arr(a))), (fn, a))

            uf = np.frompyfunc(make, n, 1)
            self._ufuncs[key] = uf
        return obj(uf(*args))

    def add(self, a: Any, b: Any) -> Any:
        return _Z3_OPS["add"](a, b)

    def sub(self, a: Any, b: Any) -> Any:
        return _Z3_OPS["sub"](a, b)

    def mul(self, a: Any, b: Any) -> Any:
        return _Z3_OPS["mul"](a, b)

    def div(self, a: Any, b: Any) -> Any:
        return _Z3_OPS["div"](a, b)

    def neg(self, a: Any) -> Any:
        return _Z3_OPS["neg"](a)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return obj(_Z3_OPS["ite"](cond, a, b))

    def total(self, items: Sequence[Any]) -> Any:
        return z3_sum(items) if items else self.zero

    def largest(self, items: Sequence[Any]) -> Any:
        out = items[0]
        for item in items[1:]:
            out = _z3_ite(z3.BoolRef(z3.Z3_mk_gt(_CREF, _ast(item), _ast(out)), _CTX), item, out)
        return out

    def smallest(self, items: Sequence[Any]) -> Any:
        out = items[0]
        for item in items[1:]:
            out = _z3_ite(z3.BoolRef(z3.Z3_mk_lt(_CREF, _ast(item), _ast(out)), _CTX), item, out)
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


Backend = Z3Backend | NumpyBackend

_Z3_CMP = {
    "<": np.frompyfunc(_z3_cmp("<", z3.Z3_mk_lt), 2, 1),
    ">": np.frompyfunc(_z3_cmp(">", z3.Z3_mk_gt), 2, 1),
    "<=": np.frompyfunc(_z3_cmp("<=", z3.Z3_mk_le), 2, 1),
    ">=": np.frompyfunc(_z3_cmp(">=", z3.Z3_mk_ge), 2, 1),
    "==": np.frompyfunc(_z3_cmp("==", z3.Z3_mk_eq), 2, 1),
}
_NP_CMP = {
    "<": np.less,
    ">": np.greater,
    "<=": np.less_equal,
    ">=": np.greater_equal,
    "==": np.equal,
}


# ----------------------------------------------------------------------------------------------------------
# Shape inference


def _matmul_shape(a: Shape, b: Shape) -> Shape:
    if not a or not b:
        raise ShapeError("MatMul of a scalar")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul contracts {a2[-1]} with {b2[-2]}")
    batch = bcast(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _window_out(size: int, k: int, head: int, tail: int, stride: int, dil: int, ceil: bool) -> int:
    """Output size along one spatial dim with ``head``/``tail`` padding. With ``ceil`` a last window that
    would start in the right padding (at or past ``size + head`` in padded coordinates) is dropped, as ONNX
    and onnxruntime do: with asymmetric pads that point is not ``size + (head + tail) / 2``."""
    pad = head + tail
    span = dil * (k - 1) + 1
    if size + pad < span:
        raise ShapeError("window larger than the padded input")
    n = (size + pad - span) / stride
    out = (math.ceil(n) if ceil else math.floor(n)) + 1
    if ceil and (out - 1) * stride >= size + head:
        out -= 1  # the last window would start in the right padding
    return out


def _window_attrs(
    spatial: Shape,
    kernel: Sequence[int],
    pads: Sequence[int],
    strides: Sequence[int],
    dils: Sequence[int],
    auto_pad: str,
) -> tuple[list[int], list[int], list[int], list[int]]:
    k = len(spatial)
    kernel = list(kernel)
    strides = list(strides) or [1] * k
    dils = list(dils) or [1] * k
    if len(kernel) != k or len(strides) != k or len(dils) != k:
        raise ShapeError("window attributes do not match the spatial rank")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, kk, s, d in zip(spatial, kernel, strides, dils, strict=True):
            total = max(0, (math.ceil(size / s) - 1) * s + (kk - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        pads = begins + ends
    elif auto_pad == "VALID":
        pads = [0] * (2 * k)
    else:
        pads = list(pads) or [0] * (2 * k)
    if len(pads) != 2 * k or any(p < 0 for p in pads) or any(s < 1 for s in strides) or any(d < 1 for d in dils):
        raise ShapeError("invalid pads, strides or dilations")
    if any(kk < 1 for kk in kernel):
        raise ShapeError("invalid kernel shape")
    return kernel, pads, strides, dils


def _pool_out(
    spatial: Shape, kernel: list[int], pads: list[int], strides: list[int], dils: list[int], ceil: bool
) -> Shape:
    k = len(spatial)
    return tuple(_window_out(spatial[i], kernel[i], pads[i], pads[i + k], strides[i], dils[i], ceil) for i in range(k))


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """The output shape of ``op`` applied to ``args`` (tensor arguments given as shapes, ``None`` for
    ``NoneT``, lists of shapes for ``TList``; other arguments as values). Raises ShapeError."""
    family = family_for(op)
    if family is not None:
        return tuple(family.infer_shape(op, args))
    spec = OPS[op]
    fam = spec.family
    if fam is Family.UNARY:
        return need(args[0])
    if fam is Family.BROADCAST:
        return bcast(*[need(a) if i == 0 else a for i, a in enumerate(args[: len(spec.tensor_args)]) if a is not None])
    if fam is Family.MATMUL:
        return _matmul_shape(need(args[0]), need(args[1]))
    if fam is Family.GEMM:
        a, b, c, _al, _be, ta, tb = args
        a, b = need(a), need(b)
        if len(a) != 2 or len(b) != 2 or ta not in (0, 1) or tb not in (0, 1):
            raise ShapeError("Gemm needs 2-D A and B and transA/transB in {0, 1}")
        m, k = (a[1], a[0]) if ta else a
        k2, n = (b[1], b[0]) if tb else b
        if k != k2:
            raise ShapeError(f"Gemm contracts {k} with {k2}")
        if c is not None and bcast(c, (m, n)) != (m, n):
            raise ShapeError(f"Gemm: C {list(c)} does not broadcast to {[m, n]}")
        return (m, n)
    if fam is Family.SOFTMAX:
        x = need(args[0])
        check_axis(args[1], len(x))
        return x
    if fam is Family.LAYERNORM:
        x, scale, bias, axis = need(args[0]), need(args[1]), args[2], args[3]
        check_axis(axis, len(x))
        for p in (scale, bias):
            if p is not None and bcast(p, x[axis:]) != x[axis:]:
                raise ShapeError("LayerNormalization: Scale/B do not broadcast to the normalized shape")
        return x
    if fam is Family.CONV:
        x, w, b, auto_pad, dils, group, kernel, pads, strides = args
        x, w = need(x), need(w)
        if len(x) < 3 or len(w) != len(x) or group < 1:
            raise ShapeError("Conv needs X [N, C, ...] and W [M, C/group, ...] of the same rank")
        n, c, m = x[0], x[1], w[0]
        if c % group or m % group or w[1] != c // group:
            raise ShapeError(f"Conv: {c} channels, group {group}, W {list(w)}")
        if kernel and tuple(kernel) != tuple(w[2:]):
            raise ShapeError("Conv: kernel_shape differs from W")
        if b is not None and tuple(b) != (m,):
            raise ShapeError(f"Conv: B {list(b)} is not [{m}]")
        kern, pads_, strides_, dils_ = _window_attrs(x[2:], w[2:], pads, strides, dils, auto_pad)
        return (n, m, *_pool_out(x[2:], kern, pads_, strides_, dils_, False))
    if op == "MaxPool":
        x, auto_pad, ceil_mode, dils, kernel, pads, _so, strides = args
        return _pool_shape(need(x), auto_pad, ceil_mode, dils, kernel, pads, strides)
    if op == "AveragePool":
        x, auto_pad, ceil_mode, _cip, dils, kernel, pads, strides = args
        return _pool_shape(need(x), auto_pad, ceil_mode, dils, kernel, pads, strides)
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        x = need(args[0])
        if len(x) < 3:
            raise ShapeError(f"{op} needs rank >= 3")
        return (*x[:2], *([1] * (len(x) - 2)))
    if fam is Family.LRN:
        x = need(args[0])
        if len(x) < 3 or args[4] < 1:
            raise ShapeError("LRN needs rank >= 3 and size >= 1")
        return x
    if fam is Family.BATCHNORM:
        x = need(args[0])
        if len(x) < 2 or args[7] != 0:
            raise ShapeError("BatchNormalization (inference) needs rank >= 2 and training_mode 0")
        for p in args[1:5]:
            if need(p) != (x[1],):
                raise ShapeError(f"BatchNormalization: parameter {list(p)} is not [{x[1]}]")
        return x
    raise ShapeError(f"no semantics for {op}")  # pragma: no cover - every family is handled


def _pool_shape(x: Shape, auto_pad: str, ceil_mode: int, dils: Any, kernel: Any, pads: Any, strides: Any) -> Shape:
    if len(x) < 3 or not kernel:
        raise ShapeError("pooling needs rank >= 3 and a kernel shape")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and any(d != 1 for d in dils):
        # onnxruntime pads for the undilated kernel here (AveragePool's output then differs from the ONNX
        # spec's ceil(size / stride), MaxPool may refuse): not modeled, the encoder leaves it opaque
        raise ShapeError(f"pooling with auto_pad {auto_pad} and dilations {list(dils)} is not modeled")
    kern, pads_, strides_, dils_ = _window_attrs(x[2:], kernel, pads, strides, dils, auto_pad)
    if any(p >= k for p, k in zip(pads_, kern + kern, strict=True)):
        raise ShapeError("pooling pads must be smaller than the kernel")
    return (x[0], x[1], *_pool_out(x[2:], kern, pads_, strides_, dils_, bool(ceil_mode)))


# ----------------------------------------------------------------------------------------------------------
# Evaluation


def _fn_name(op: str, args: Sequence[Any], start: int) -> tuple[str, list[Any]]:
    """Name of the uninterpreted function for an op with attributes: string and int attributes are part of
    the name, float attributes are extra arguments."""
    tags, extra = [], []
    for value in args[start:]:
        if isinstance(value, str | int) and not isinstance(value, bool):
            tags.append(str(value))
        else:
            extra.append(value)
    return (f"{op}[{','.join(tags)}]" if tags else op), extra


def evaluate(op: str, args: Sequence[Any], bk: Backend) -> Any:
    """Apply ``op`` to argument values (see module docstring); raise ShapeError when they do not fit."""
    shapes = [_shape_arg(a) for a in args]
    out_shape = infer_shape(op, shapes)
    family = family_for(op)
    value = family.evaluate(op, list(args), bk) if family else _EVAL[OPS[op].family](op, list(args), bk)
    value = obj(value) if isinstance(bk, Z3Backend) else np.asarray(value)
    assert value.shape == out_shape, f"{op}: evaluated {value.shape}, inferred {out_shape}"
    return value


def _shape_arg(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return a.shape
    if isinstance(a, list):
        return [x.shape for x in a]
    return a


def _unary(op: str, args: list[Any], bk: Backend) -> Any:
    x = args[0]
    if op == "Neg":
        return bk.neg(x)
    if op == "Identity":
        return x.copy()
    name, extra = _fn_name(op, args, 1)
    return bk.apply(name, x, *extra)


def _broadcast(op: str, args: list[Any], bk: Backend) -> Any:
    if op == "Where":
        c, x, y = np.broadcast_arrays(*args)
        return bk.where(bk.nonzero(c), x, y)
    if op == "Clip":
        x, lo, hi = args
        arrays = [a for a in (x, lo, hi) if a is not None]
        shape = np.broadcast_shapes(*[a.shape for a in arrays])
        out = np.broadcast_to(x, shape)
        if lo is not None:
            lo_b = np.broadcast_to(lo, shape)
            out = bk.where(bk.compare("<", out, lo_b), lo_b, out)
        if hi is not None:
            hi_b = np.broadcast_to(hi, shape)
            out = bk.where(bk.compare(">", out, hi_b), hi_b, out)
        return out
    a, b = np.broadcast_arrays(args[0], args[1])
    if op == "Add":
        return bk.add(a, b)
    if op == "Sub":
        return bk.sub(a, b)
    if op == "Mul":
        return bk.mul(a, b)
    if op == "Div":
        return bk.div(a, b)
    if op == "Max":
        return bk.where(bk.compare(">", b, a), b, a)
    if op == "Min":
        return bk.where(bk.compare("<", b, a), b, a)
    if op == "PRelu":
        return bk.where(bk.compare("<", a, bk.zero), bk.mul(a, b), a)
    if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        sym = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}[op]
        return bk.truth(bk.compare(sym, a, b))
    return bk.apply(op, a, b)  # Pow, And, Or, Xor


def _matmul(op: str, args: list[Any], bk: Backend) -> Any:
    a, b = args
    if isinstance(bk, Z3Backend):
        return _z3_matmul(bk, a, b)
    return np.matmul(a, b)


def _z3_matmul(bk: Z3Backend, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy matmul semantics with n-ary sums (canonical for z3)."""
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    ab = np.broadcast_to(a2, (*batch, *a2.shape[-2:]))
    bb = np.broadcast_to(b2, (*batch, *b2.shape[-2:]))
    m, n = a2.shape[-2], b2.shape[-1]
    out = np.empty((*batch, m, n), dtype=object)
    for idx in np.ndindex(*batch) if batch else [()]:
        for i in range(m):
            for j in range(n):
                out[(*idx, i, j)] = bk.total(list(bk.mul(ab[(*idx, i)], bb[(*idx, slice(None), j)])))
    if a.ndim == 1:
        out = out.reshape((*out.shape[:-2], out.shape[-1]))
    if b.ndim == 1:
        out = out.reshape(out.shape[:-1])
    return out


def _gemm(op: str, args: list[Any], bk: Backend) -> Any:
    a, b, c, alpha, beta, ta, tb = args
    a = a.T if ta else a
    b = b.T if tb else b
    y = bk.mul(_matmul("MatMul", [a, b], bk), alpha)
    if c is not None:
        y = bk.add(y, bk.mul(np.broadcast_to(c, y.shape), beta))
    return y


def _softmax(op: str, args: list[Any], bk: Backend) -> Any:
    x, axis = args
    e = bk.apply("exp", x)
    s = reduce_elements(bk, e, [axis], True, bk.total)
    if op == "Softmax":
        return bk.div(e, s)
    return bk.sub(x, bk.apply("log", s))


def _layernorm(op: str, args: list[Any], bk: Backend) -> Any:
    x, scale, bias, axis, eps, _stash = args
    axes = list(range(axis, x.ndim))
    count = math.prod(x.shape[axis:])
    mean = bk.div(reduce_elements(bk, x, axes, True, bk.total), count)
    centered = bk.sub(x, mean)
    var = bk.div(reduce_elements(bk, bk.mul(centered, centered), axes, True, bk.total), count)
    y = bk.mul(bk.div(centered, bk.apply("sqrt", bk.add(var, eps))), scale)
    return bk.add(y, bias) if bias is not None else y


def _window_positions(
    spatial: Shape, out: Shape, kern: list[int], pads: list[int], strides: list[int], dils: list[int]
) -> list[tuple[tuple[int, ...], list[tuple[tuple[int, ...], tuple[int, ...]]]]]:
    """For every output position: the (input position, kernel offset) pairs inside the input."""
    k = len(spatial)
    result = []
    for o in itertools.product(*[range(n) for n in out]):
        taps = []
        for off in itertools.product(*[range(n) for n in kern]):
            pos = tuple(o[i] * strides[i] - pads[i] + off[i] * dils[i] for i in range(k))
            if all(0 <= pos[i] < spatial[i] for i in range(k)):
                taps.append((pos, off))
        result.append((o, taps))
    return result


def _conv(op: str, args: list[Any], bk: Backend) -> Any:
    x, w, b, auto_pad, dils, group, _kernel, pads, strides = args
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    kern, pads_, strides_, dils_ = _window_attrs(x.shape[2:], w.shape[2:], pads, strides, dils, auto_pad)
    out_sp = _pool_out(x.shape[2:], kern, pads_, strides_, dils_, False)
    out = np.empty((n, m, *out_sp), dtype=out_dtype(bk))
    positions = _window_positions(x.shape[2:], out_sp, kern, pads_, strides_, dils_)
    for bi in range(n):
        for mi in range(m):
            g = mi // mg
            for o, taps in positions:
                terms = [bk.mul(x[(bi, g * cg + ci, *pos)], w[(mi, ci, *off)]) for ci in range(cg) for pos, off in taps]
                if b is not None:
                    terms.append(b[mi])
                out[(bi, mi, *o)] = bk.total(terms) if terms else bk.zero
    return out


def _pool(op: str, args: list[Any], bk: Backend) -> Any:
    x = args[0]
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        axes = list(range(2, x.ndim))
        if op == "GlobalMaxPool":
            return reduce_elements(bk, x, axes, True, bk.largest)
        return bk.div(reduce_elements(bk, x, axes, True, bk.total), math.prod(x.shape[2:]))
    if op == "MaxPool":
        _x, auto_pad, ceil_mode, dils, kernel, pads, _so, strides = args
        cip = 0
    else:
        _x, auto_pad, ceil_mode, cip, dils, kernel, pads, strides = args
    kern, pads_, strides_, dils_ = _window_attrs(x.shape[2:], kernel, pads, strides, dils, auto_pad)
    out_sp = _pool_out(x.shape[2:], kern, pads_, strides_, dils_, bool(ceil_mode))
    out = np.empty((*x.shape[:2], *out_sp), dtype=out_dtype(bk))
    positions = _window_positions(x.shape[2:], out_sp, kern, pads_, strides_, dils_)
    k = len(kern)
    for lead in np.ndindex(*x.shape[:2]):
        for o, taps in positions:
            vals = [x[(*lead, *pos)] for pos, _off in taps]
            if not vals:
                raise ShapeError("a pooling window lies entirely in the padding")
            if op == "MaxPool":
                out[(*lead, *o)] = bk.largest(vals)
            else:
                if cip:  # count the padded positions too (but not past the padded input)
                    count = 1
                    for i in range(k):
                        lo = o[i] * strides_[i] - pads_[i]
                        hi = min(lo + (kern[i] - 1) * dils_[i], x.shape[2 + i] + pads_[i + k] - 1)
                        count *= len(range(lo, hi + 1, dils_[i]))
                else:
                    count = len(vals)
                out[(*lead, *o)] = bk.div(bk.total(vals), count)
    return out


def _lrn(op: str, args: list[Any], bk: Backend) -> Any:
    x, alpha, beta, bias, size = args
    c = x.shape[1]
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    sq = bk.mul(x, x)
    out = np.empty(x.shape, dtype=out_dtype(bk))
    for idx in np.ndindex(*x.shape):
        ci = idx[1]
        terms = [sq[(idx[0], j, *idx[2:])] for j in range(max(0, ci - lo), min(c - 1, ci + hi) + 1)]
        out[idx] = bk.total(terms)
    base = bk.add(bk.mul(out, bk.div(alpha, size)), bias)
    return bk.div(x, bk.apply("pow", base, np.broadcast_to(np.array(beta, dtype=object), base.shape)))


def _batchnorm(op: str, args: list[Any], bk: Backend) -> Any:
    x, scale, bias, mean, var, eps, _mom, _train = args
    shape = (x.shape[1], *([1] * (x.ndim - 2)))
    s, b, m, v = (p.reshape(shape) for p in (scale, bias, mean, var))
    return bk.add(bk.mul(bk.div(bk.sub(x, m), bk.apply("sqrt", bk.add(v, eps))), s), b)


_EVAL: dict[Family, Callable[[str, list[Any], Any], Any]] = {
    Family.UNARY: _unary,
    Family.BROADCAST: _broadcast,
    Family.MATMUL: _matmul,
    Family.GEMM: _gemm,
    Family.SOFTMAX: _softmax,
    Family.LAYERNORM: _layernorm,
    Family.CONV: _conv,
    Family.POOL: _pool,
    Family.LRN: _lrn,
    Family.BATCHNORM: _batchnorm,
}
