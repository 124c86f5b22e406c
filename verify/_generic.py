"""Shape-generic proofs, TASO's way: tensors are values of an uninterpreted sort, operators uninterpreted
functions, and a small set of operator axioms (first-order, with E-matching patterns) says how they commute
with slicing. A rule proven here holds for every shape, every axis size and every value of its attributes.

The vocabulary (all uninterpreted): ``chunk(x, d, i, n)`` is piece ``i`` of ``n`` along dim ``d``;
``part(x, i, n)`` a piece of a pending sum; ``IsPartial(p, x, i, n)`` says the pieces ``p`` (as ``i`` ranges
over the axis) sum to ``x``; ``Div(x, d, n)`` says dim ``d`` of ``x`` splits into ``n``; ``shape``, ``vget``,
``vlen`` read shapes; one function per operator (elementwise ops are ``ew1/ew2/ew3`` of a function symbol, so
one axiom covers all of them); one predicate per guard relation (``BcDim``, ``MmRow``, ``ReshapeMap``…).

A rule is proven generically when, for every way its axis variables can coincide:

1. placements are consistent (one per term and axis), as in the bounded proof;
2. every Partition in the right-hand side slices an R (or D) value along a dim that provably splits, and no
   other axis shards that dim (nor the dim of a Combine);
3. every operator in the right-hand side maps pieces consistent with its operands' placements to pieces
   consistent with its own (``op(chunk(a, da, i, n), b) = chunk(op(a, b), d, i, n)``, or ``IsPartial`` for a
   pending sum): z3 proves it from the axioms and the guards' facts;
4. the two sides' global values are equal (z3, with algebraic axioms: MatMul associativity and
   distributivity, Add/Mul commutativity, Concat/Split identities);
5. every variable gets its gradient in the same placement from both sides (training: a Replicate is the
   gradient all-reduce; :func:`unity_eq.verify._semantics.gradient_problem`).

The encoding is checked so that no proof is vacuous: axis guards (``=``/``!=`` of axes) are decided by the
assignment being proven, never passed to z3; every other guard must become a z3 formula, or the rule is
*unsupported* here; and the premises (the guards' facts, and with the axioms) must be shown satisfiable, by
z3 or by a bounded case that satisfies the guards, or the proof is *vacuous* and does not count.

Parallel ops need no axioms: Partition, Combine, Reduce and Replicate are typed by placements (a Combine of
an S(d) value is its gathered value, and so on); the axioms cover regular operators only. Each axiom is an
identity that the bounded prover checks on the shipped rules that use it. Anything not covered leaves the
rule to the bounded proof.
"""

from __future__ import annotations

import functools
import itertools
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from unity_eq.ops.registry import FAMILIES, OPS
from unity_eq.ops.spec import Family
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var, walk
from unity_eq.verify._bounded import rule_axes, unsupported_constructors
from unity_eq.verify._guards import DerivedFacts, unsupported_relations
from unity_eq.verify._semantics import (
    LISTS,
    PARALLEL,
    Placements,
    gradient_problem,
    propagate,
    state_str,
    tensor_nodes,
)

__all__ = ["GenericResult", "prove_generic"]


@dataclass
class GenericResult:
    """``status``: ``proven``; ``unsupported`` (a guard, constructor or placement the encoding cannot state
    faithfully: no generic proof is attempted); ``unproven`` (z3 did not prove a goal from the axioms); or
    ``vacuous`` (the premises, guards and axioms together, are not shown satisfiable: a proof from them would
    prove anything, so it does not count). ``assignments``: the ways the axis variables can coincide that were
    proven, each from premises z3 showed satisfiable."""

    proven: bool
    reason: str = ""
    goals: int = 0
    seconds: float = 0.0
    status: str = "unproven"
    assignments: int = 0
    premises: str = ""  # how the premises were shown satisfiable: "z3" or "bounded case"


def _compare(head: str, lv: Any, rv: Any, fact: Term) -> Any:
    """The z3 formula of a comparison guard, computed for ``head`` alone (building all five made ``!=`` of a
    string crash on ``<``); a comparison z3 cannot state (ordering strings) leaves the rule unsupported."""
    try:
        if head == "!=":
            return lv != rv
        return {"<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}[head](lv, rv)
    except (TypeError, z3.Z3Exception) as exc:
        raise _Unsupported(f"guard {fact}: {exc}") from None


class _Unsupported(Exception):
    """The encoding cannot state this faithfully: the generic proof is not attempted."""


class _Unproven(Exception):
    """z3 does not prove a goal from the axioms."""


class _Vacuous(Exception):
    """The premises are not shown satisfiable: a proof from them would not count."""


class _Infeasible(Exception):
    """An axis guard is false for this assignment of axis variables to axes: the case cannot occur."""


# ----------------------------------------------------------------------------------------------------------
# Vocabulary


class _Vocab:
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


_VOCAB: _Vocab | None = None


def _vocab() -> _Vocab:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = _Vocab()
    return _VOCAB


# ----------------------------------------------------------------------------------------------------------
# Translating a rule


_ELEMENTWISE = (Family.UNARY, Family.BROADCAST)


class _Rule:
    """A rule's terms and guards over the vocabulary, for one assignment of axis variables to axes."""

    def __init__(self, rule: Rule, axis_class: dict[str, str], facts_db: DerivedFacts) -> None:
        self.rule = rule
        self.z = _vocab()
        self.sorts = rule.var_sorts
        self.axis_class = axis_class
        self.facts: list[Any] = []
        self.bound: dict[str, Any] = {}
        self.placed: dict[tuple[str, str], tuple[str, Any]] = {}
        self.dims: dict[str, Any] = {}
        self.axes = tuple(dict.fromkeys(axis_class.values()))
        self.n = {ax: z3.Int(f"n@{ax}") for ax in self.axes}
        self.i = {ax: z3.Int(f"i@{ax}") for ax in self.axes}
        self.groups: set[str] = {"core", "lists"}
        for ax in self.axes:
            self.facts += [self.n[ax] >= 1, self.i[ax] >= 0, self.i[ax] < self.n[ax]]
        self.facts_db = facts_db

    # --- values
    def var(self, name: str) -> Any:
        if name in self.bound:
            return self.bound[name]
        sort = self.sorts.get(name)
        value = (
            z3.Const(name, self.z.sort_of(sort))
            if sort in ("T", "TList", "IVec", "String")
            else (z3.Real(name) if sort == "f64" else z3.Int(name))
        )
        self.bound[name] = value
        return value

    def value(self, term: Term) -> Any:
        """The global value of a term (parallel ops are the identity)."""
        z = self.z
        if isinstance(term, Var):
            if term.name in self.axis_class:
                raise _Unsupported(f"axis variable {term.name} used as a value (only axis guards may name it)")
            return self.var(term.name)
        if isinstance(term, Lit):
            if term.sort == "i64":
                return z3.IntVal(int(term.value))
            if term.sort == "f64":
                return z3.RealVal(float(term.value))
            return z.const("String", term.value)
        head, args = term.head, term.args
        if head in PARALLEL:
            return self.value(args[0])
        if head == "PList":
            return self.value(args[0])
        if head == "NoneT":
            return z.none
        if head == "TNil":
            return z.nil
        if head == "TCons":
            return z.cons(self.value(args[0]), self.value(args[1]))
        if head in ("+", "-", "*"):
            left, right = self.value(args[0]), self.value(args[1])
            return left + right if head == "+" else left - right if head == "-" else left * right
        if head == "vec-of" and all(isinstance(a, Lit) for a in args):
            vec = tuple(int(a.value) for a in args)
            self.facts += z.vec_facts(vec)
            return z.const("IVec", vec)
        if head == "vec-of" and len(args) == 1:
            # one axis from a variable (reduce-mean-split-reduced). Longer ones stay unsupported: the generated
            # Split rules' (vec-of n1 n1) would reach z3, which proves 5 of 54 and times out on the rest (~2 s each)
            items = [self.value(a) for a in args]
            self.facts += z.vec_of_facts(items)
            return z.vec_of(*items)
        if head == "vec-empty":
            self.facts += z.vec_facts(())
            return z.const("IVec", ())
        if head == "shape":
            return z.shape(self.value(args[0]))
        if head == "vec-length":
            return z.vlen(self.value(args[0]))
        if head == "vec-get":
            return z.vget(self.value(args[0]), self.value(args[1]))
        if head == "%":
            return self.value(args[0]) % self.value(args[1])
        if head in OPS:
            return self.apply(head, [self.value(a) for a in args])
        raise _Unsupported(f"no generic semantics for {head}")

    def apply(self, head: str, args: list[Any]) -> Any:
        z = self.z
        spec = OPS[head]
        if spec.family in _ELEMENTWISE:
            tensors = [args[i] for i in spec.tensor_args]
            attrs = [args[i] for i in range(len(spec.args)) if i not in spec.tensor_args]
            attr_sorts = [spec.args[i].sort for i in range(len(spec.args)) if i not in spec.tensor_args]
            fn = z.fn(head, attr_sorts)
            f = fn(*attrs) if attr_sorts else fn
            self.groups.add("ew")
            self.groups.add("linear")
            return z.ew[len(tensors)](f, *tensors)
        self.groups.add(head)
        return z.op(head)(*args)

    # --- guards
    def guard(self, fact: Term) -> None:
        """Add the guard as z3 facts, faithfully, or raise: ``_Unsupported`` when it cannot be stated,
        ``_Infeasible`` when an axis guard is false for this assignment of axis variables."""
        before = len(self.facts)
        self._guard(fact)
        for added in self.facts[before:]:
            if not (isinstance(added, z3.ExprRef) and z3.is_bool(added)):
                raise _Unsupported(f"guard {fact} does not encode as a z3 formula (got {added!r})")

    def is_axis(self, term: Term) -> bool:
        return (isinstance(term, Var) and term.name in self.axis_class) or (
            isinstance(term, Lit) and f"lit:{term.value}" in self.axis_class
        )

    def _axis_guard(self, fact: App) -> None:
        """``=``/``!=`` between axes: decided by the assignment (axis variables name the same axis iff they
        are in one class), never by the names' spelling."""
        if fact.head not in ("=", "!="):
            raise _Unsupported(f"guard {fact} compares axes with {fact.head}")
        left, right = fact.args
        if not (self.is_axis(left) and self.is_axis(right)):
            raise _Unsupported(f"guard {fact} compares an axis with something that is not an axis of the rule")
        same = self.axis(left) == self.axis(right)
        if same != (fact.head == "="):
            raise _Infeasible(str(fact))

    def _guard(self, fact: Term) -> None:
        z = self.z
        if not isinstance(fact, App):
            raise _Unsupported(f"guard {fact}")
        head, args = fact.head, fact.args
        if head in ("=", "!=", "<", ">", "<=", ">=") and any(self.is_axis(a) for a in args):
            self._axis_guard(fact)
            return
        if head == "=":
            left, right = args
            for target, other in ((left, right), (right, left)):
                if (
                    isinstance(target, Var)
                    and target.name not in self.bound
                    and self.sorts.get(target.name) != "String"
                ):
                    self.bound[target.name] = self.value(other)
                    return
            self.facts.append(self.value(left) == self.value(right))
            return
        if head in ("<", ">", "<=", ">=", "!="):
            if head != "!=" and any(isinstance(a, Var) and self.sorts.get(a.name) == "String" for a in args):
                raise _Unsupported(f"guard {fact} orders strings")
            lv, rv = self.value(args[0]), self.value(args[1])
            self.facts.append(_compare(head, lv, rv, fact))
            return
        if head == "vec-contains":
            self.facts.append(z.rel["vec-contains"](self.value(args[0]), self.value(args[1])))
            return
        if head == "vec-not-contains":
            self.facts.append(z3.Not(z.rel["vec-contains"](self.value(args[0]), self.value(args[1]))))
            return
        if head == "mesh-axis":
            ax = self.axis(args[0])
            self.facts.append(self.value(args[1]) == self.n[ax])
            return
        if head == "dim-range":
            d = self.value(args[0])
            self.facts += [d >= 0, d < 8]
            return
        if head == "float-dtype":
            # the proof is over the reals, which is the float semantics: the guard only narrows the rule to
            # it (integer tensors are checked apart, verify/_types.py), so it adds no fact
            return
        if head in ("can-split", "can-split-opt", "splittable-size"):
            x, d, ax = self.value(args[0]), self.value(args[1]), self.axis(args[2])
            split = z3.And(z.div(x, d, self.n[ax]), d >= 0, d < z.vlen(z.shape(x)), self.n[ax] >= 2)
            self.facts.append(z3.Or(x == z.none, split) if head == "can-split-opt" else split)
            if head != "can-split-opt" and isinstance(args[0], Var):
                self.placed[(args[0].name, ax)] = ("R", None)
            return
        if head == "list-can-split":
            l_, d, ax = self.value(args[0]), self.value(args[1]), self.axis(args[2])
            self.facts += [z.list_div(l_, d, self.n[ax]), d >= 0, self.n[ax] >= 2]
            return
        if head == "placed":
            if not isinstance(args[0], Var):
                raise _Unsupported(f"placed on a term: {fact}")
            st = args[2]
            if isinstance(st, App) and st.head in ("R", "D", "P") and not st.args:
                self.placed[(args[0].name, self.axis(args[1]))] = (st.head, None)
                return
            if isinstance(st, App) and st.head == "S" and len(st.args) == 1:
                self.placed[(args[0].name, self.axis(args[1]))] = ("S", self.dim_key(st.args[0]))
                return
            raise _Unsupported(f"guard {fact}")
        if head in z.rel and head not in ("vec-contains",):
            self.facts.append(z.rel[head](*[self.value(a) for a in args]))
            return
        if head in self.facts_db.relations:
            # a relation declared by analysis rules (bcast-operand, merge-operand…): it holds, and the
            # axioms say nothing more about it, so it is an uninterpreted predicate of its arguments
            values = [self.value(a) for a in args]
            sorts = [v.sort() for v in values]
            rel = z3.Function(f"rel.{head}.{'.'.join(str(s_) for s_ in sorts)}", *sorts, z3.BoolSort())
            self.facts.append(rel(*values))
            return
        raise _Unsupported(f"no axiom for guard relation '{head}'")

    def axis(self, term: Term) -> str:
        if isinstance(term, Var) and term.name in self.axis_class:
            return self.axis_class[term.name]
        if isinstance(term, Lit) and f"lit:{term.value}" in self.axis_class:
            return self.axis_class[f"lit:{term.value}"]
        raise _Unsupported(f"axis {term} is not an axis of the rule's parallel ops")

    # --- placements with symbolic dims
    def dim_key(self, term: Term) -> str:
        expr = z3.simplify(self.value(term))
        key = str(expr)
        self.dims[key] = expr
        return key


def _axis_classes(rule: Rule, axis_vars: list[str], literals: list[str]) -> list[dict[str, str]]:
    """Every way the axis variables can name axes (equal or distinct) that the guards allow."""
    distinct = set()
    for g in rule.guards:
        if isinstance(g, App) and g.head == "!=" and all(isinstance(a, Var) and a.name in axis_vars for a in g.args):
            distinct.add(frozenset(a.name for a in g.args))
    names = [*axis_vars, *(f"lit:{v}" for v in literals)]
    out = []
    for labels in itertools.product(range(len(names)), repeat=len(names)):
        if any(labels[j] > max(labels[:j], default=-1) + 1 for j in range(len(labels))):
            continue  # canonical set partitions only
        assignment = {name: f"ax{labels[j]}" for j, name in enumerate(names)}
        lits = [assignment[f"lit:{v}"] for v in literals]
        if len(set(lits)) != len(lits):
            continue
        if any(assignment[a] == assignment[b] for a, b in (tuple(p) for p in distinct)):
            continue
        out.append(assignment)
    return out


def prove_generic(
    rule: Rule, facts: DerivedFacts, timeout_ms: int = 1000, witnessed: bool = False, integer: bool = False
) -> GenericResult:
    """Try a shape-generic proof (see the module docstring). Never raises for unsupported rules.

    Premises must be satisfiable, or the proof is vacuous: for every assignment of axis variables the
    guards' facts alone must be satisfiable (quantifier-free: z3 decides it quickly), and the guards' facts
    together with the axioms too. ``witnessed`` says a bounded case satisfies the guards: the axioms hold for
    real tensors (each is an identity of the tensor semantics), so that case is a model of the premises and
    z3 need not find one (with quantified axioms it rarely can within the time limit). ``integer``: prove it
    for integer tensors: the axioms that hold on the reals only (group names ending in ``.reals``: the mean of
    equal groups' means is the mean) are left out; elementwise ops are uninterpreted functions here, so
    integer division is covered."""
    start = time.perf_counter()
    result = GenericResult(False)
    if unsupported_relations(rule.guards, facts) or unsupported_constructors(rule):
        result.status, result.reason = "unsupported", "unsupported: a guard relation or constructor has no axiom"
        result.seconds = time.perf_counter() - start
        return result
    axis_vars, literals = rule_axes(rule)
    try:
        for assignment in _axis_classes(rule, axis_vars, literals):
            try:
                _prove_one(rule, assignment, facts, timeout_ms, result, witnessed, integer)
            except _Infeasible:
                continue  # an axis guard excludes this way of naming axes: no such case
            result.assignments += 1
        if result.assignments == 0:
            raise _Vacuous("no assignment of the axis variables satisfies the axis guards")
        result.proven, result.status = True, "proven"
        result.premises = "bounded case" if witnessed else "z3"
    except _Unsupported as exc:
        result.status, result.reason = "unsupported", f"unsupported: {exc}"
    except _Unproven as exc:
        result.status, result.reason = "unproven", str(exc)
    except _Vacuous as exc:
        result.status, result.reason = "vacuous", f"vacuous: {exc}"
    result.seconds = time.perf_counter() - start
    return result


def _prove_one(
    rule: Rule,
    assignment: dict[str, str],
    facts_db: DerivedFacts,
    timeout_ms: int,
    result: GenericResult,
    witnessed: bool,
    integer: bool = False,
) -> None:
    r = _Rule(rule, assignment, facts_db)
    z = r.z
    for g in rule.guards:
        r.guard(g)
    axes = r.axes or ("ax0",)
    if not r.axes:
        r.axes = axes
        r.n["ax0"], r.i["ax0"] = z3.Int("n@ax0"), z3.Int("i@ax0")
    sorts = r.sorts

    def is_tensor(t: Term) -> bool:
        return isinstance(t, Var) and sorts.get(t.name) == "T"

    def dim_of(t: Term) -> str:
        return r.dim_key(t)

    def axis_of(t: Term) -> str:
        return r.axis(t)

    lhs, rhs = rule.lhs, rule.rhs
    pl = Placements(axes)
    for (var, ax), (kind, key) in r.placed.items():
        pl.add(Var(var), ax, (kind, key if kind == "S" else -1))
    propagate(pl, [lhs], dim_of, axis_of, is_tensor)
    tensor_vars = [v for v, s in sorts.items() if s == "T"]
    for v in tensor_vars:
        for ax in axes:
            if not pl.get(Var(v), ax):
                pl.add(Var(v), ax, ("R", -1))
    propagate(pl, [lhs], dim_of, axis_of, is_tensor)
    lhs_nodes = tensor_nodes(lhs, is_tensor)
    if any(len(pl.get(t, ax)) > 1 for t in lhs_nodes for ax in axes):
        raise _Unsupported("the left-hand side has conflicting placements")
    roots = _root_pairs(lhs, rhs)
    for _ in range(3):
        for left, right in roots:
            for ax in axes:
                for st in list(pl.get(left, ax)):
                    pl.add(right, ax, st)
                for st in list(pl.get(right, ax)):
                    pl.add(left, ax, st)
        propagate(pl, [lhs, rhs], dim_of, axis_of, is_tensor)
    rhs_nodes = tensor_nodes(rhs, is_tensor)
    check_nodes = [*rhs_nodes, *(Var(v) for v in tensor_vars), *(left for left, _ in roots)]
    for t in check_nodes:
        for ax in axes:
            got = pl.get(t, ax)
            if len(got) != 1:
                states = " and ".join(state_str(s) for s in sorted(got, key=str)) or "no state"
                raise _Unsupported(f"{t} has {states} on axis {ax}")

    # training: every variable gets its gradient in one placement from both sides (Replicate = all-reduce)
    problem = gradient_problem(lhs, rhs, pl, dim_of, axis_of, is_tensor)
    if problem:
        raise _Unsupported(problem)

    def state(t: Term, ax: str) -> tuple[str, Any]:
        got = pl.get(t, ax)
        if not got:  # a subterm with no derived placement: no generic proof (the bounded one decides)
            raise _Unsupported(f"{t} has no placement on axis {ax}")
        kind, key = next(iter(got))
        return kind, (r.dims[key] if kind == "S" else None)

    # facts the left-hand side implies: its slices split, its sharded variables split
    for t in walk(lhs):
        if isinstance(t, App) and t.head == "Partition":
            r.facts.append(z.div(r.value(t.args[0]), r.value(t.args[1]), r.n[r.axis(t.args[2])]))
        elif isinstance(t, App) and t.head == "PList":
            r.facts.append(z.list_div(r.value(t.args[0]), r.value(t.args[1]), r.n[r.axis(t.args[2])]))
    for v in tensor_vars:
        for ax in axes:
            kind, dim = state(Var(v), ax)
            if kind == "S":
                r.facts.append(z.div(r.var(v), dim, r.n[ax]))

    def expected(t: Term, value: Any) -> Any:
        out = value
        for ax in axes:
            kind, dim = state(t, ax)
            if kind == "S":
                out = z.chunk(out, dim, r.i[ax], r.n[ax])
        return out

    def piece(t: Term) -> Any:
        """The device's piece of an operand, from its placement (pieces of a P value are a free part)."""
        if isinstance(t, Var) and sorts.get(t.name) != "T":
            return r.value(t)
        if isinstance(t, Lit) or (isinstance(t, App) and t.head in ("vec-of", "vec-empty")):
            return r.value(t)
        if isinstance(t, App) and t.head == "PList":
            ax = r.axis(t.args[2])
            return z.chunkl(piece(t.args[0]), r.value(t.args[1]), r.i[ax], r.n[ax])
        if isinstance(t, App) and t.head in ("TCons", "TNil"):
            return r.value(t) if t.head == "TNil" else z.cons(piece(t.args[0]), piece(t.args[1]))
        if isinstance(t, Var) and sorts.get(t.name) == "TList":
            return r.value(t)
        if isinstance(t, App) and t.head == "NoneT":
            return z.none
        out = expected(t, r.value(t))
        for ax in axes:
            if state(t, ax)[0] == "P":
                out = z.part(out, r.i[ax], r.n[ax])
        return out

    goals: list[tuple[str, Any]] = []
    for t in dict.fromkeys(walk(rhs)):
        if not isinstance(t, App):
            continue
        if t.head == "Partition":
            x, ax = t.args[0], r.axis(t.args[2])
            dim = r.value(t.args[1])
            if state(x, ax)[0] not in ("R", "D"):
                raise _Unsupported(f"{t} slices a value that is not replicated")
            xv = r.value(x)
            goals.append((f"{t} splits evenly", z3.Or(xv == z.none, z.div(xv, dim, r.n[ax]))))
            for other in axes:
                if other != ax and state(x, other)[0] == "S":
                    goals.append((f"{t}: no other axis shards dim", state(x, other)[1] != dim))
        elif t.head == "Combine":
            x, ax = t.args[0], r.axis(t.args[2])
            dim = r.value(t.args[1])
            for other in axes:
                if other != ax and state(x, other)[0] == "S":
                    goals.append((f"{t}: no other axis shards dim", state(x, other)[1] != dim))
        elif t.head in OPS:
            goals.append(_op_goal(r, t, state, piece, expected, axes))
    for left, _right in roots:
        if isinstance(left, App) and left.head in OPS:
            goals.append(_op_goal(r, left, state, piece, expected, axes))
    goals.append(("global values", r.value(lhs) == r.value(rhs)))
    for what, goal in [*goals, *(("a premise", f) for f in r.facts)]:
        if not (isinstance(goal, z3.ExprRef) and z3.is_bool(goal)):
            raise _Unsupported(f"{what} does not encode as a z3 formula (got {goal!r})")
    ground = z3.Solver()
    ground.set("timeout", timeout_ms)
    ground.add(*r.facts)
    _check_premises(ground, assignment, "the guards")
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    groups = r.groups | {"algebra"}
    groups |= {g + ".reals" for g in groups} if not integer else set()
    for group in sorted(groups):
        for axiom in z.axioms.get(group, []):
            solver.add(axiom)
    solver.add(*r.facts)
    if not witnessed:
        _check_premises(solver, assignment, "the guards and axioms")
    for what, goal in goals:
        if z3.is_true(z3.simplify(goal)):
            result.goals += 1
            continue
        solver.push()
        solver.add(z3.Not(goal))
        answer = solver.check()
        solver.pop()
        if answer != z3.unsat:
            raise _Unproven(f"the axioms do not prove {what}")
        result.goals += 1


def _check_premises(solver: z3.Solver, assignment: dict[str, str], what: str) -> None:
    """A proof counts only from premises that z3 shows satisfiable: from contradictory premises every goal
    would follow. ``unknown`` does not count either."""
    answer = solver.check()
    if answer == z3.sat:
        return
    axes = ", ".join(f"{k}={v}" for k, v in sorted(assignment.items())) or "no axes"
    if answer == z3.unsat:
        raise _Vacuous(f"{what} contradict each other ({axes}): a proof from them proves anything")
    raise _Vacuous(f"z3 cannot show {what} satisfiable ({axes}: {solver.reason_unknown()})")


def _root_pairs(lhs: Term, rhs: Term) -> list[tuple[Term, Term]]:
    """The (left, right) pairs that are one e-class: the two roots, or every root of a multi-pattern rule
    (both sides explicit lists); none for a rewrite of tensor lists (PList), whose elements pair implicitly."""
    if not (isinstance(lhs, App) and lhs.head in LISTS):
        return [(lhs, rhs)]
    left, right = _explicit_list(lhs), _explicit_list(rhs)
    if left is not None and right is not None and len(left) == len(right):
        return list(zip(left, right, strict=True))
    return []


def _explicit_list(term: Term) -> list[Term] | None:
    items: list[Term] = []
    while isinstance(term, App) and term.head == "TCons":
        items.append(term.args[0])
        term = term.args[1]
    return items if isinstance(term, App) and term.head == "TNil" else None


def _op_goal(r: _Rule, t: App, state: Any, piece: Any, expected: Any, axes: Sequence[str]) -> tuple[str, Any]:
    z = r.z
    partial = [ax for ax in axes if state(t, ax)[0] == "P"]
    sharded = [ax for ax in axes if state(t, ax)[0] == "S"]
    if len(partial) + len(sharded) > 1 and partial:
        raise _Unsupported(f"{t} is a pending sum sharded on another axis")
    args = [piece(a) for a in t.args]
    if t.head in ("Reshape", "Expand"):
        if len(sharded) > 1:
            raise _Unsupported(f"{t} is sharded on two axes")
        out = r.value(t)
        if sharded:
            ax = sharded[0]
            args[1] = z.lshape(out, state(t, ax)[1], r.n[ax])
        else:
            args[1] = z.shape(out)
    got = r.apply(t.head, args)
    if partial:
        ax = partial[0]
        return f"{t} holds partial sums", z.is_partial(got, expected(t, r.value(t)), r.i[ax], r.n[ax])
    return f"{t} holds its pieces", got == expected(t, r.value(t))
