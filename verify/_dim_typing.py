"""Dim equalities an operator's typing implies between its operands and its output (a level-2 draft guards
only the equalities of the concrete case these do not imply)."""

from __future__ import annotations

from typing import Any

from unity_eq.rulefile.terms import App, Term
from unity_eq.verify._enumerate import PARALLEL_OPS, Evaluator, list_items


class DimClasses:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        self.parent[self.find(a)] = self.find(b)


def dim_typing(term: Term, ev: Evaluator, uf: DimClasses) -> None:
    """Dim equalities that the op of ``term`` implies between its operands and its output."""
    if not isinstance(term, App):
        return
    info = ev.info(term)
    if info is None:
        return
    head, args = term.head, term.args
    out = info.shape

    def same(a: Term, ka: int, b: Term, kb: int) -> None:
        uf.union((a, ka), (b, kb))

    def shape(t: Term) -> tuple[int, ...]:
        got = ev.info(t)
        return got.shape if got is not None else ()

    if head in PARALLEL_OPS or head == "Relu":
        for k in range(len(out)):
            same(term, k, args[0], k)
    elif head == "Add":
        for operand in args:
            s = shape(operand)
            for k in range(len(s)):
                if s[k] != 1:
                    same(term, len(out) - len(s) + k, operand, k)
    elif head == "MatMul":
        a, b = args
        sa, sb = shape(a), shape(b)
        same(a, len(sa) - 1, b, len(sb) - 2)
        same(term, len(out) - 2, a, len(sa) - 2)
        same(term, len(out) - 1, b, len(sb) - 1)
    elif head == "Gemm":
        a, b = args[0], args[1]
        same(a, 1, b, 0)
        same(term, 0, a, 0)
        same(term, 1, b, 1)
    elif head == "Concat":
        axis = int(args[1].value)
        for item in list_items(args[0]):
            for k in range(len(out)):
                if k != axis:
                    same(term, k, item, k)
    elif head == "Split":
        axis = int(args[2].value)
        for k in range(len(out)):
            if k != axis:
                same(term, k, args[0], k)
    elif head == "Transpose":
        perm = tuple(args[1].value)
        for j, k in enumerate(perm):
            same(term, j, args[0], k)
