"""A rule over the shape-generic vocabulary: its terms, guards and placements as z3 terms and facts.

One translation per assignment of axis variables to axes (:func:`axis_classes`); the proof that uses it is in
:mod:`unity_eq.verify._generic`.
"""

import itertools
import operator
from typing import Any

import z3

from unity_eq.ops.registry import OPS
from unity_eq.ops.spec import Family
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._semantics import (
    PARALLEL,
)
from unity_eq.verify._vocab import vocab


def compare_guard(head: str, lv: Any, rv: Any, fact: Term) -> Any:
    """The z3 formula of a comparison guard, computed for ``head`` alone (building all five made ``!=`` of a
    string crash on ``<``); a comparison z3 cannot state (ordering strings) leaves the rule unsupported."""
    try:
        if head == "!=":
            return lv != rv
        return {"<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}[head](lv, rv)
    except (TypeError, z3.Z3Exception) as exc:
        raise Unsupported(f"guard {fact}: {exc}") from None


class Unsupported(Exception):
    """The encoding cannot state this faithfully: the generic proof is not attempted."""


class Unproven(Exception):
    """z3 does not prove a goal from the axioms."""


class Vacuous(Exception):
    """The premises are not shown satisfiable: a proof from them would not count."""


class Infeasible(Exception):
    """An axis guard is false for this assignment of axis variables to axes: the case cannot occur."""


# ----------------------------------------------------------------------------------------------------------
# Translating a rule


_ELEMENTWISE = (Family.UNARY, Family.BROADCAST)


class GenericRule:
    """A rule's terms and guards over the vocabulary, for one assignment of axis variables to axes."""

    def __init__(self, rule: Rule, axis_class: dict[str, str], facts_db: DerivedFacts) -> None:
        self.rule = rule
        self.z = vocab()
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
                raise Unsupported(f"axis variable {term.name} used as a value (only axis guards may name it)")
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
        raise Unsupported(f"no generic semantics for {head}")

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
        """Add the guard as z3 facts, faithfully, or raise: ``Unsupported`` when it cannot be stated,
        ``Infeasible`` when an axis guard is false for this assignment of axis variables."""
        before = len(self.facts)
        self._guard(fact)
        for added in self.facts[before:]:
            if not (isinstance(added, z3.ExprRef) and z3.is_bool(added)):
                raise Unsupported(f"guard {fact} does not encode as a z3 formula (got {added!r})")

    def is_axis(self, term: Term) -> bool:
        return (isinstance(term, Var) and term.name in self.axis_class) or (
            isinstance(term, Lit) and f"lit:{term.value}" in self.axis_class
        )

    def _axis_guard(self, fact: App) -> None:
        """``=``/``!=`` between axes: decided by the assignment (axis variables name the same axis iff they
        are in one class), never by the names' spelling."""
        if fact.head not in ("=", "!="):
            raise Unsupported(f"guard {fact} compares axes with {fact.head}")
        left, right = fact.args
        if not (self.is_axis(left) and self.is_axis(right)):
            raise Unsupported(f"guard {fact} compares an axis with something that is not an axis of the rule")
        same = self.axis(left) == self.axis(right)
        if same != (fact.head == "="):
            raise Infeasible(str(fact))

    def _guard(self, fact: Term) -> None:
        z = self.z
        if not isinstance(fact, App):
            raise Unsupported(f"guard {fact}")
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
                raise Unsupported(f"guard {fact} orders strings")
            lv, rv = self.value(args[0]), self.value(args[1])
            self.facts.append(compare_guard(head, lv, rv, fact))
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
                raise Unsupported(f"placed on a term: {fact}")
            st = args[2]
            if isinstance(st, App) and st.head in ("R", "D", "P") and not st.args:
                self.placed[(args[0].name, self.axis(args[1]))] = (st.head, None)
                return
            if isinstance(st, App) and st.head == "S" and len(st.args) == 1:
                self.placed[(args[0].name, self.axis(args[1]))] = ("S", self.dim_key(st.args[0]))
                return
            raise Unsupported(f"guard {fact}")
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
        raise Unsupported(f"no axiom for guard relation '{head}'")

    def axis(self, term: Term) -> str:
        if isinstance(term, Var) and term.name in self.axis_class:
            return self.axis_class[term.name]
        if isinstance(term, Lit) and f"lit:{term.value}" in self.axis_class:
            return self.axis_class[f"lit:{term.value}"]
        raise Unsupported(f"axis {term} is not an axis of the rule's parallel ops")

    # --- placements with symbolic dims
    def dim_key(self, term: Term) -> str:
        expr = z3.simplify(self.value(term))
        key = str(expr)
        self.dims[key] = expr
        return key


def axis_classes(rule: Rule, axis_vars: list[str], literals: list[str]) -> list[dict[str, str]]:
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
