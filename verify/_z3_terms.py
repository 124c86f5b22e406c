"""z3 terms built through z3's C API, memoized: the arithmetic the proof backend evaluates ops with.

A bounded proof evaluates a rule in thousands of cases whose symbols share names, so equal operands give
equal ASTs and each term is built once (see the memo below); :func:`same_polynomial` compares two sides as
sums of monomials.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import z3

CTX = z3.main_ctx()
CREF = CTX.ref()
_CONSTS: dict[Any, z3.ArithRef] = {}


def ast_of(x: Any) -> Any:
    if isinstance(x, z3.ExprRef):
        return x.as_ast()
    const = _CONSTS.get(x)
    if const is None:
        const = z3.RealVal(x)
        _CONSTS[x] = const
    return const.as_ast()


def z3_array(items: Sequence[Any]) -> Any:
    out = (z3.Ast * len(items))()
    for i, x in enumerate(items):
        out[i] = ast_of(x)
    return out


def as_real(ast: Any) -> z3.ArithRef:
    return z3.ArithRef(ast, CTX)


def _is_add(ast: Any) -> bool:
    return (
        z3.Z3_get_ast_kind(CREF, ast) == z3.Z3_APP_AST
        and z3.Z3_get_decl_kind(CREF, z3.Z3_get_app_decl(CREF, ast)) == z3.Z3_OP_ADD
    )


# Memo of built terms. A bounded proof evaluates a rule in thousands of cases whose symbols share names
# (``a[0]``…), so it builds the same terms again and again; z3 hash-conses them into the same AST anyway,
# and the memo only skips the Python wrappers and C calls (about 7 us a term, 0.4 us a hit). Keys are AST
# addresses: each entry keeps its operands alive, so an address in a key is never reused by another term.
MEMO: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_MEMO_LIMIT = 100_000  # entries, under 0.7 kB each (120 000 three-term sums: 80 MB); emptied when full


def memo_key(x: Any) -> Any:
    return x.ast.value if isinstance(x, z3.ExprRef) else (x,)


def remember(key: tuple[Any, ...], term: Any, operands: Any) -> Any:
    if len(MEMO) >= _MEMO_LIMIT:
        MEMO.clear()
    MEMO[key] = (term, operands)
    return term


def _memo_binary(kind: str, build: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def make(a: Any, b: Any) -> Any:
        key = (kind, memo_key(a), memo_key(b))
        hit = MEMO.get(key)
        return hit[0] if hit is not None else remember(key, build(a, b), (a, b))

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
    hit = MEMO.get(key)
    if hit is not None:
        return bool(hit[0])
    if a.is_int() != b.is_int():
        return False
    diff = as_real(z3.Z3_simplify_ex(CREF, _z3_sub(a, b).as_ast(), _SOM.params))
    ast = diff.as_ast()
    same = z3.Z3_get_ast_kind(CREF, ast) == z3.Z3_NUMERAL_AST and z3.Z3_get_numeral_string(CREF, ast) == "0"
    return bool(remember(key, same, (a, b)))


def z3_sum(items: Sequence[Any]) -> Any:
    """An n-ary sum with nested sums spliced in, so equal sums built in different groupings are one term."""
    key = ("sum", *map(memo_key, items))
    hit = MEMO.get(key)
    return hit[0] if hit is not None else remember(key, _z3_sum(items), tuple(items))


def _z3_sum(items: Sequence[Any]) -> Any:
    asts: list[Any] = []
    for x in items:
        a = ast_of(x)
        if _is_add(a):
            asts.extend(z3.Z3_get_app_arg(CREF, a, i) for i in range(z3.Z3_get_app_num_args(CREF, a)))
        else:
            asts.append(a)
    if len(asts) == 1:
        return as_real(asts[0])
    arr = (z3.Ast * len(asts))(*asts)
    return as_real(z3.Z3_mk_add(CREF, len(asts), arr))


def _z3_binary(kind: str, mk: Any) -> Callable[[Any, Any], Any]:
    return _memo_binary(kind, lambda a, b: as_real(mk(CREF, 2, z3_array((a, b)))))


_z3_sub = _z3_binary("sub", z3.Z3_mk_sub)
z3_div = _memo_binary("div", lambda a, b: as_real(z3.Z3_mk_div(CREF, ast_of(a), ast_of(b))))
_z3_neg = _memo_binary("neg", lambda a, _b: as_real(z3.Z3_mk_unary_minus(CREF, ast_of(a))))


def z3_ite(c: Any, a: Any, b: Any) -> Any:
    key = ("ite", memo_key(c), memo_key(a), memo_key(b))
    hit = MEMO.get(key)
    if hit is not None:
        return hit[0]
    return remember(key, as_real(z3.Z3_mk_ite(CREF, c.as_ast(), ast_of(a), ast_of(b))), (c, a, b))


def z3_cmp(kind: str, mk: Any) -> Callable[[Any, Any], Any]:
    return _memo_binary(kind, lambda a, b: z3.BoolRef(mk(CREF, ast_of(a), ast_of(b)), CTX))


Z3_OPS = {
    "add": np.frompyfunc(_z3_binary("add", z3.Z3_mk_add), 2, 1),
    "sub": np.frompyfunc(_z3_sub, 2, 1),
    "mul": np.frompyfunc(_z3_binary("mul", z3.Z3_mk_mul), 2, 1),
    "div": np.frompyfunc(z3_div, 2, 1),
    "neg": np.frompyfunc(lambda a: _z3_neg(a, None), 1, 1),
    "ite": np.frompyfunc(z3_ite, 3, 1),
}
