"""The shape-generic proof's vocabulary: uninterpreted sorts, functions and operator axioms, built once per process.

What each symbol means is stated in :mod:`unity_eq.verify._generic`.
"""

import functools
from collections.abc import Sequence
from typing import Any

import z3

from unity_eq.ops.registry import FAMILIES, OPS

# ----------------------------------------------------------------------------------------------------------
# Vocabulary


class Vocab:
    """Sorts, functions and axioms (built once per process)."""

    def __init__(self) -> None:
        self.T = z3.DeclareSort("Tensor")
        self.V = z3.DeclareSort("IVec")
        self.Fn = z3.DeclareSort("Fn")
        self.L = z3.DeclareSort("TList")
        self.Str = z3.DeclareSort("Str")
        T, V, L, Int, B = self.T, self.V, self.L, z3.IntSort(), z3.BoolSort()
        F = z3.Function
        self.chunk = F("chunk", T, Int, Int, Int, T)
        self.part = F("part", T, Int, Int, T)
        self.is_partial = F("IsPartial", T, T, Int, Int, B)
        self.div = F("Div", T, Int, Int, B)
        self.shape = F("shape", T, V)
        self.vget = F("vget", V, Int, Int)
        self.vlen = F("vlen", V, Int)
        self.lshape = F("lshape", T, Int, Int, V)
        self.none = z3.Const("none", T)
        self.nil = z3.Const("nil", L)
        self.cons = F("cons", T, L, L)
        self.chunkl = F("chunkl", L, Int, Int, Int, L)
        self.list_div = F("ListDiv", L, Int, Int, B)
        self.ew = {k: F(f"ew{k}", self.Fn, *([T] * k), T) for k in (1, 2, 3)}
        self.rel = {
            "bc-dim": F("BcDim", T, T, Int, Int, B),
            "bc-bcast": F("BcB", T, T, Int, B),
            "mm-row": F("MmRow", T, Int, Int, B),
            "mm-batch": F("MmBatch", T, Int, Int, Int, B),
            "mm-col": F("MmCol", T, Int, Int, B),
            "mm-k": F("MmK", T, Int, Int, B),
            "perm-map": F("PermMap", V, Int, Int, B),
            "reshape-map": F("ReshapeMap", V, V, Int, Int, B),
            "reduce-map": F("ReduceMap", V, Int, Int, Int, Int, B),
            "vec-contains": F("VContains", V, Int, B),
            # stated by the encoder for constants whose elements are all finite and non-zero (a divisor)
            "nonzero-values": F("NonZeroValues", T, B),
        }
        self._ops: dict[str, z3.FuncDeclRef] = {}
        self._fns: dict[str, z3.FuncDeclRef] = {}
        self._consts: dict[tuple[str, Any], Any] = {}
        self._vec_fns: dict[int, z3.FuncDeclRef] = {}
        self.axioms: dict[str, list[Any]] = {}
        self._build_axioms()

    # --- operator symbols
    def sort_of(self, sort: str) -> Any:
        return {
            "T": self.T,
            "TList": self.L,
            "IVec": self.V,
            "i64": z3.IntSort(),
            "f64": z3.RealSort(),
            "String": self.Str,
        }[sort]

    def op(self, name: str) -> z3.FuncDeclRef:
        fn = self._ops.get(name)
        if fn is None:
            spec = OPS[name]
            sorts = [self.sort_of(s) for s in spec.egg_sorts()]
            fn = z3.Function(f"op.{name}", *sorts, self.T)
            self._ops[name] = fn
        return fn

    def fn(self, name: str, attr_sorts: Sequence[str]) -> z3.FuncDeclRef | Any:
        key = name
        got = self._fns.get(key)
        if got is None:
            if attr_sorts:
                got = z3.Function(f"fn.{name}", *[self.sort_of(s) for s in attr_sorts], self.Fn)
            else:
                got = z3.Const(f"fn.{name}", self.Fn)
            self._fns[key] = got
        return got

    def const(self, sort: str, value: Any) -> Any:
        key = (sort, value)
        got = self._consts.get(key)
        if got is None:
            got = z3.Const(f"vec{list(value)}", self.V) if sort == "IVec" else z3.Const(f"str:{value}", self.Str)
            self._consts[key] = got
        return got

    def vec_facts(self, value: tuple[int, ...]) -> list[Any]:
        v = self.const("IVec", value)
        return [self.vlen(v) == len(value), *(self.vget(v, k) == x for k, x in enumerate(value))]

    def vec_of(self, *items: Any) -> Any:
        """``(vec-of i ...)`` of symbolic integers: one function per length (a literal vector is a constant)."""
        fn = self._vec_fns.get(len(items))
        if fn is None:
            fn = z3.Function(f"vec-of{len(items)}", *([z3.IntSort()] * len(items)), self.V)
            self._vec_fns[len(items)] = fn
        return fn(*items)

    def vec_of_facts(self, items: Sequence[Any]) -> list[Any]:
        """Its length and elements: what the guards and axioms may read of it."""
        v = self.vec_of(*items)
        return [self.vlen(v) == len(items), *(self.vget(v, k) == x for k, x in enumerate(items))]

    # --- axioms
    def add(self, group: str, axiom: Any) -> None:
        """Add an axiom to ``group`` (an op's name, or ``ew``/``lists``…: the prover picks groups by a rule's
        heads)."""
        self.axioms.setdefault(group, []).append(axiom)

    def _build_axioms(self) -> None:
        """Every axiom group, family by family, in a fixed order (the prover picks groups by a rule's ops)."""
        for build in (
            self._axioms_core,
            self._axioms_algebra,
        ):
            build()
        for family in FAMILIES:
            if family.axioms is not None:
                family.axioms(self)

    @functools.cached_property
    def _symbol_table(self) -> dict[str, Any]:
        """The bound variables the axioms quantify over, by name (z3 identifies a constant by name and sort)."""
        T = self.T
        table: dict[str, Any] = {"T": T, "idx": z3.Const("idx", T), "f": z3.Const("f", self.Fn)}
        table.update((v, z3.Const(v, T)) for v in "xyabcwpq")
        table.update(
            (v, z3.Int(v)) for v in ("d", "d2", "da", "db", "dc", "i", "n", "k", "axis", "ta", "tb", "g", "kd")
        )
        table.update((v, z3.Real(v)) for v in ("al", "be", "eps", "mom"))
        table.update((v, z3.Const(v, self.V)) for v in ("s", "s2", "axes", "dil", "ks", "pads", "st"))
        table.update(ap=z3.Const("ap", self.Str), lst=z3.Const("l", self.L))
        table.update(ch=self.chunk, ew=self.ew, rel=self.rel, FA=z3.ForAll, P=_multi_pattern)
        return table

    def symbols(self, names: str) -> tuple[Any, ...]:
        """``names`` (space-separated) from the symbol table, for unpacking."""
        return tuple(self._symbol_table[name] for name in names.split())

    def _axioms_core(self) -> None:
        """Chunks of absent inputs, pieces of pending sums."""
        x, d, i, n, ch, FA = self.symbols("x d i n ch FA")
        self.add("core", FA([d, i, n], ch(self.none, d, i, n) == self.none, patterns=[ch(self.none, d, i, n)]))
        self.add("core", FA([x, i, n], self.is_partial(self.part(x, i, n), x, i, n), patterns=[self.part(x, i, n)]))

    def _axioms_algebra(self) -> None:
        """Algebra on global values (TASO's kind of axioms)."""
        a, b, c, axis, f, s, ew, FA = self.symbols("a b c axis f s ew FA")
        mm, cc, sp = self.op("MatMul"), self.op("Concat"), self.op("Split")

        def rank2(t: Any) -> Any:
            return self.vlen(self.shape(t)) >= 2

        self.add(
            "algebra",
            FA(
                [a, b, c],
                z3.Implies(z3.And(rank2(a), rank2(b), rank2(c)), mm(mm(a, b), c) == mm(a, mm(b, c))),
                patterns=[mm(mm(a, b), c), mm(a, mm(b, c))],
            ),
        )
        add, mul = self.fn("Add", ()), self.fn("Mul", ())
        self.add(
            "algebra",
            FA(
                [a, b, c],
                z3.Implies(self.shape(b) == self.shape(c), mm(a, ew[2](add, b, c)) == ew[2](add, mm(a, b), mm(a, c))),
                patterns=[mm(a, ew[2](add, b, c))],
            ),
        )
        self.add(
            "algebra",
            FA(
                [a, b, c],
                z3.Implies(self.shape(a) == self.shape(b), mm(ew[2](add, a, b), c) == ew[2](add, mm(a, c), mm(b, c))),
                patterns=[mm(ew[2](add, a, b), c)],
            ),
        )
        for fo in (add, mul):
            self.add("algebra", FA([a, b], ew[2](fo, a, b) == ew[2](fo, b, a), patterns=[ew[2](fo, a, b)]))
        two = self.cons(a, self.cons(b, self.nil))
        for index, part in ((0, a), (1, b)):  # Split(Concat(a, b)) gives back a and b
            self.add(
                "algebra",
                FA(
                    [a, b, axis, s],
                    z3.Implies(
                        z3.And(self.vlen(s) == 2, self.vget(s, 0) == self.vget(self.shape(a), axis)),
                        sp(cc(two, axis), s, axis, index) == part,
                    ),
                    patterns=[sp(cc(two, axis), s, axis, index)],
                ),
            )
        self.add(
            "algebra",
            FA(
                [f, a, b, axis],
                ew[1](f, cc(two, axis)) == cc(self.cons(ew[1](f, a), self.cons(ew[1](f, b), self.nil)), axis),
                patterns=[ew[1](f, cc(two, axis))],
            ),
        )


def _multi_pattern(*terms: Any) -> Any:
    """One trigger of several terms (z3 wants a MultiPattern), or the term itself."""
    return z3.MultiPattern(*terms) if len(terms) > 1 else terms[0]


_VOCAB: Vocab | None = None


def vocab() -> Vocab:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = Vocab()
    return _VOCAB
