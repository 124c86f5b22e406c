"""Rank facts of a rule's guards, checked by the generator while it binds the left-hand side's variables.

A bounded proof enumerates the left-hand side's instances and then solves the guards on each
(:mod:`unity_eq.verify._bounded_cases`). For rules whose guards tie the ranks of several tensors together
(the fused attention's ``(= r (vec-length (shape q)))``, ``(= r (vec-length (shape kt)))``, ``(> r 1)``,
``(= ax (- r 1))``, ``(<= (vec-length (shape m)) r)``) almost every instance fails them: 3.7 million left-hand
sides for 131 868 cases. The generator (:mod:`unity_eq.verify._gen`) asks :meth:`RankFacts.violated` each
time it binds a variable (or learns the shape an operand will have) and drops the branch when a fact is
already false.

Sound by construction: a *rank fact* is a top-level guard ``(OP x y)``, OP one of ``= != < <= > >=``, whose
sides are integer expressions over

* integer literals, ``+ - * min max`` (``/`` and ``%`` only where the divisor is known non-zero),
* ``(vec-length (shape X))`` with X a tensor variable of the left-hand side (an absent one, NoneT, has shape
  ``()`` in the guards: rank 0), ``(vec-length s)`` where a guard ``(= s (shape X))`` names X's shape, and
  ``(vec-length v)`` of an ``IVec`` variable of the left-hand side (a Split's sizes: the length of its value),
* ``i64`` variables: those of the left-hand side take their bound value; the others (``r``) are guard
  variables, whose value in every solution of the guards equals each side of every ``(= r E)`` guard.

The guards are a conjunction (:func:`unity_eq.verify._guards.solve_guards` yields only bindings under which
each of them holds, evaluated by ``_value`` with the same integer semantics as here), so a binding on which
a rank fact is false has no solution: pruning it drops no case and, because a branch is cut only by facts
about the variables bound on it, it keeps the order of the cases that remain. A fact that cannot be
evaluated yet (a variable unbound, a guard variable not defined by the values known) prunes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from unity_eq.rulefile.terms import App, Lit, Term, Var, walk
from unity_eq.verify._guards import GUARD_ARITHMETIC
from unity_eq.verify._semantics import VarSpec

__all__ = ["RankFacts", "project", "rank_facts"]

Env = dict[str, int]
Expr = Callable[[Env], "int | None"]

_COMPARE: dict[str, Callable[[int, int], bool]] = {
    "=": lambda x, y: x == y,
    "!=": lambda x, y: x != y,
    "<": lambda x, y: x < y,
    ">": lambda x, y: x > y,
    "<=": lambda x, y: x <= y,
    ">=": lambda x, y: x >= y,
}


def _arith(head: str, x: int, y: int) -> int | None:
    """The guards' integer arithmetic (``_guards.GUARD_ARITHMETIC``); None where a fact would fail instead
    (division by zero), which is left to the guards."""
    if head in ("/", "%") and y == 0:
        return None
    return int(GUARD_ARITHMETIC[head](x, y))


_ARITH = frozenset(GUARD_ARITHMETIC)


@dataclass(frozen=True)
class _Component:
    """Facts that share variables (through guard variables too): each is checked when one of its
    left-hand-side variables becomes known."""

    lhs_vars: tuple[str, ...]  # the left-hand side's variables its facts read, in a fixed order
    facts: tuple[tuple[str, Term, Term], ...]


class RankFacts:
    """The rank facts of one rule's guards (:func:`rank_facts`), by component."""

    def __init__(
        self,
        facts: Sequence[tuple[str, Term, Term]],
        lhs_vars: set[str],
        sorts: dict[str, str],
        aliases: dict[str, str],
    ) -> None:
        self.key = tuple(facts)  # hashable: caches of instances are keyed by it
        self.sorts = sorts
        self._aliases = aliases
        self._lhs = lhs_vars
        self.components: list[_Component] = []
        self.component_of: dict[str, int] = {}
        self._compiled: list[tuple[list[tuple[str, Expr]], list[tuple[Callable[[int, int], bool], Expr, Expr]]]] = []
        self._verdicts: dict[tuple[int, tuple[int | None, ...]], bool] = {}
        for group in _components(facts, self._names):
            names = sorted({n for f in group for n in self._names(f[1]) | self._names(f[2]) if n in lhs_vars})
            index = len(self.components)
            self.components.append(_Component(tuple(names), tuple(group)))
            for n in names:
                self.component_of[n] = index
            self._compiled.append(self._compile(group))

    def __bool__(self) -> bool:
        return bool(self.components)

    # --- reading the facts
    def _names(self, term: Term) -> set[str]:
        """Variables an expression reads: tensor variables through their rank, ``i64`` ones by value."""
        out: set[str] = set()
        for t in walk(term):
            if isinstance(t, App) and t.head == "vec-length" and isinstance(t.args[0], Var):
                out.add(self._aliases[t.args[0].name])
            elif isinstance(t, App) and t.head == "shape" and isinstance(t.args[0], Var):
                out.add(t.args[0].name)
            elif isinstance(t, Var) and self.sorts.get(t.name) == "i64":
                out.add(t.name)
        return out

    def _expr(self, term: Term) -> Expr:
        if isinstance(term, Lit):
            value = term.value
            assert isinstance(value, int)  # rank_facts admits integer literals only
            return lambda env: value
        if isinstance(term, Var):
            name = term.name
            return lambda env: env.get(name)
        assert isinstance(term, App)
        if term.head == "vec-length":
            arg = term.args[0]
            if isinstance(arg, App):
                shaped = arg.args[0]
                assert isinstance(shaped, Var)  # rank_facts admits (vec-length (shape X)) of a variable only
                name = shaped.name
            else:
                assert isinstance(arg, Var)
                name = self._aliases[arg.name]
            return lambda env: env.get(name)
        x, y = (self._expr(a) for a in term.args)
        head = term.head

        def arith(env: Env) -> int | None:
            a, b = x(env), y(env)
            return None if a is None or b is None else _arith(head, a, b)

        return arith

    def _compile(
        self, group: Sequence[tuple[str, Term, Term]]
    ) -> tuple[list[tuple[str, Expr]], list[tuple[Callable[[int, int], bool], Expr, Expr]]]:
        definitions: list[tuple[str, Expr]] = []  # (guard variable, an expression it equals)
        checks = []
        for op, left, right in group:
            checks.append((_COMPARE[op], self._expr(left), self._expr(right)))
            if op == "=":
                for target, other in ((left, right), (right, left)):
                    if isinstance(target, Var) and target.name not in self._lhs:
                        definitions.append((target.name, self._expr(other)))
        return definitions, checks

    # --- checking
    def violated(self, component: int, known: tuple[int | None, ...]) -> bool:
        """True when a fact of the component is false on these values of its left-hand-side variables
        (``known``, aligned with its ``lhs_vars``; None: not known yet)."""
        key = (component, known)
        got = self._verdicts.get(key)
        if got is None:
            got = self._violated(component, known)
            self._verdicts[key] = got
        return got

    def _violated(self, component: int, known: tuple[int | None, ...]) -> bool:
        env: Env = {n: v for n, v in zip(self.components[component].lhs_vars, known, strict=True) if v is not None}
        definitions, checks = self._compiled[component]
        changed = True
        while changed:  # guard variables: each equals every expression an `=` fact gives it
            changed = False
            for name, expr in definitions:
                if name not in env and (value := expr(env)) is not None:
                    env[name] = value
                    changed = True
        for compare, left, right in checks:
            a, b = left(env), right(env)
            if a is not None and b is not None and not compare(a, b):
                return True
        return False


def project(value: Any, sort: str | None) -> int | None:
    """What a rank fact reads of a bound value: a tensor's rank (NoneT: 0), an ``i64`` variable's value, an
    ``IVec`` variable's length."""
    if sort == "T":
        if value is None:
            return 0
        return len(value.shape) if isinstance(value, VarSpec) else None
    if sort == "IVec":
        return len(value) if isinstance(value, tuple | list) else None
    if sort == "i64" and isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def rank_facts(guards: Sequence[Term], lhs: Term, sorts: dict[str, str]) -> RankFacts:
    """The rank facts of ``guards`` (module docstring) for the left-hand side ``lhs``."""
    lhs_vars = {t.name for t in walk(lhs) if isinstance(t, Var)}
    aliases = _shape_aliases(guards, lhs_vars, sorts)
    facts = []
    for guard in guards:
        if isinstance(guard, App) and guard.head in _COMPARE and len(guard.args) == 2:
            left, right = guard.args
            if _integer(left, lhs_vars, sorts, aliases) and _integer(right, lhs_vars, sorts, aliases):
                facts.append((guard.head, left, right))
    return RankFacts(facts, lhs_vars, sorts, aliases)


def _shape_aliases(guards: Sequence[Term], lhs_vars: set[str], sorts: dict[str, str]) -> dict[str, str]:
    """Guard variables that a guard ``(= s (shape X))`` makes X's shape (X a tensor of the left-hand side); the
    left-hand side's tensor and ``IVec`` variables map themselves (the rank, the length, is what is read)."""
    aliases = {v: v for v in lhs_vars if sorts.get(v) in ("T", "IVec")}
    for guard in guards:
        if not (isinstance(guard, App) and guard.head == "=" and len(guard.args) == 2):
            continue
        for name, shape in (guard.args, guard.args[::-1]):
            if (
                isinstance(name, Var)
                and name.name not in lhs_vars
                and isinstance(shape, App)
                and shape.head == "shape"
                and isinstance(x := shape.args[0], Var)
                and x.name in lhs_vars
                and sorts.get(x.name) == "T"
            ):
                aliases.setdefault(name.name, x.name)
    return aliases


def _integer(term: Term, lhs_vars: set[str], sorts: dict[str, str], aliases: dict[str, str]) -> bool:
    """Whether ``term`` is an integer expression a rank fact may read (module docstring)."""
    if isinstance(term, Lit):
        return term.sort == "i64" and isinstance(term.value, int) and not isinstance(term.value, bool)
    if isinstance(term, Var):
        return sorts.get(term.name) == "i64"
    if term.head == "vec-length" and len(term.args) == 1:
        arg = term.args[0]
        if isinstance(arg, Var):
            return arg.name in aliases and (arg.name not in lhs_vars or sorts.get(arg.name) == "IVec")
        return (
            isinstance(arg, App)
            and arg.head == "shape"
            and isinstance(arg.args[0], Var)
            and arg.args[0].name in lhs_vars
            and sorts.get(arg.args[0].name) == "T"
        )
    return term.head in _ARITH and len(term.args) == 2 and all(_integer(a, lhs_vars, sorts, aliases) for a in term.args)


def _components(
    facts: Sequence[tuple[str, Term, Term]], names: Callable[[Term], set[str]]
) -> Iterable[list[tuple[str, Term, Term]]]:
    """The facts grouped by shared variables (union-find over the variables each reads)."""
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        while parent.setdefault(n, n) != n:
            n = parent[n]
        return n

    reads = [names(left) | names(right) for _op, left, right in facts]
    for vs in reads:
        first, *rest = sorted(vs) if vs else [""]
        for n in rest:
            parent[find(n)] = find(first)
    groups: dict[str, list[tuple[str, Term, Term]]] = {}
    for fact, vs in zip(facts, reads, strict=True):
        if vs:  # a fact over literals only is the guards' business
            groups.setdefault(find(min(vs)), []).append(fact)
    return list(groups.values())
