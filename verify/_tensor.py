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

Ops on integer tensors are evaluated by the integer backends (:class:`Z3IntegerBackend`,
:class:`NumpyIntegerBackend`): the same, except that division truncates toward zero (``Div``, the mean of
``ReduceMean``), as onnxruntime's integer kernels do.

The numeric backend replaces each uninterpreted function by a fixed smooth function derived from its name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import z3

from unity_eq.ops.family import OpFamily, ShapeError  # one class: a plug-in family's shape errors are the verifier's
from unity_eq.ops.registry import OPS, family_for
from unity_eq.ops.tensors import obj

__all__ = [
    "NEGATIVE_AXES",
    "NumpyBackend",
    "NumpyIntegerBackend",
    "ShapeError",
    "Z3Backend",
    "Z3IntegerBackend",
    "evaluate",
    "infer_shape",
    "onnx_axes",
]

Shape = tuple[int, ...]


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


def _z3_trunc_div(a: Any, b: Any) -> Any:
    """ONNX's integer division: the quotient truncated toward zero (``-7 / 2`` is ``-3``), on integer-valued
    reals (the verifier's integer tensors are reals constrained to be integers)."""
    q = _z3_div(a, b)
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


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """The output shape of ``op`` applied to ``args`` (tensor arguments given as shapes, ``None`` for
    ``NoneT``, lists of shapes for ``TList``; other arguments as values). Raises ShapeError, also when a
    required input is absent: a rule that feeds an absent optional input (Gemm's C, a Clip bound) to an op
    that needs one (Add, Max) is wrong there, not a crash of the verifier."""
    spec = OPS.get(op)
    if spec is not None:
        for arg, value in zip(spec.args, args, strict=False):
            if arg.sort == "T" and not arg.optional and value is None:
                raise ShapeError(f"{op}: its required input {arg.name} is absent (NoneT)")
    return tuple(_family(op).infer_shape(op, onnx_axes(op, args, args)))


#: ops whose axis attribute (an int, or a vector of them) counts from the end when negative, as ONNX says:
#: (the argument's position, the position of the tensor whose rank it counts from). The families' semantics
#: take normalized axes (the encoder normalizes them); a rule may spell one negative, so the verifier
#: normalizes here, in the one place every evaluation and shape inference passes through (issue 21: a guard
#: `(!= d -1)` read -1 as "no dim", and the rule split the softmax axis itself).
NEGATIVE_AXES: dict[str, tuple[int, int]] = {
    "Softmax": (1, 0),
    "LogSoftmax": (1, 0),
    "LayerNormalization": (3, 0),
    "Concat": (1, 0),
    "Split": (2, 0),
    "Gather": (2, 0),
    "ReduceSum": (1, 0),
    "ReduceMean": (1, 0),
    "ReduceMax": (1, 0),
    "ReduceMin": (1, 0),
    "Slice": (3, 0),
}


def onnx_axes(op: str, args: Sequence[Any], shapes: Sequence[Any]) -> list[Any]:
    """``args`` with ``op``'s negative axes counted from the end of its tensor's rank (``shapes``: the
    arguments' shapes); an axis outside ``[-rank, rank)`` is a ShapeError (ONNX rejects it)."""
    where = NEGATIVE_AXES.get(op)
    out = list(args)
    if where is None or where[0] >= len(args):
        return out
    at, of = where
    shape = shapes[of]
    if isinstance(shape, list):  # Concat: the rank of its operands
        shape = shape[0] if shape else None
    if shape is None or isinstance(shape, str) or args[at] is None:
        return out
    rank = len(shape)

    def norm(a: Any) -> int:
        a = int(a)
        if not -rank <= a < rank:
            raise ShapeError(f"{op}: axis {a} out of range for rank {rank}")
        return a + rank if a < 0 else a

    value = args[at]
    out[at] = tuple(norm(a) for a in value) if isinstance(value, tuple | list) else norm(value)
    return out


def _family(op: str) -> OpFamily:
    """The op's family, which holds its semantics (unity_eq/ops/)."""
    family = family_for(op)
    if family is None:
        raise KeyError(f"{op}: no op family in unity_eq/ops/registry.py")
    return family


# ----------------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(op: str, args: Sequence[Any], bk: Backend) -> Any:
    """Apply ``op`` to argument values (see module docstring); raise ShapeError when they do not fit."""
    shapes = [_shape_arg(a) for a in args]
    out_shape = infer_shape(op, shapes)
    value = _family(op).evaluate(op, onnx_axes(op, args, shapes), bk)
    value = obj(value) if isinstance(bk, Z3Backend) else np.asarray(value)
    assert value.shape == out_shape, f"{op}: evaluated {value.shape}, inferred {out_shape}"
    return value


def _shape_arg(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return a.shape
    if isinstance(a, list):
        return [x.shape for x in a]
    return a
