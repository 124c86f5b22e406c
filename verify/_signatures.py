"""Signatures: which bounded cases are alike for a rule, and a sample of them that spreads over every class.

Cases with the same *signature* are alike for the rule: same axis sizes, same values of every non-tensor
variable (dims, axes, attributes), same rank of every tensor, and the same pattern of which dims are 1 and
which divide each axis size. The *primary* part of a signature (axis sizes, guard bindings, String
attributes) names a class that every sample checks at least once.

A sample takes the smallest case of each signature; past its budget it deals signatures round-robin over
the primary classes, so a budget cuts the number of cases of each class, never a class. The numeric
back-up samples this way, and so does a generic proof's cross-check of its axioms (verify/_decide.py): one
case per signature over every rank, attribute value, size-1 and divisibility pattern, instead of the
smallest cases only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from unity_eq.rulefile.terms import App, Rule, Var, walk
from unity_eq.verify._semantics import SYMBOLIC

#: a bounded case (verify/_bounded_cases.py's ``Case``; not imported: that module imports this one)
Case = Any

__all__ = ["by_signature", "placement_vars"]


def placement_vars(rule: Rule) -> set[str]:
    """Variables naming a dim of a placement (the dim of a Partition, Combine or PList, or of ``(S d)``):
    each of their values changes placements, so each is a class checked at least once."""
    out: set[str] = set()
    for term in (rule.lhs, rule.rhs, *rule.guards):
        for t in walk(term):
            if isinstance(t, App) and t.head in ("Partition", "Combine", "PList", "S"):
                dim = t.args[0] if t.head == "S" else t.args[1] if len(t.args) > 1 else None
                if isinstance(dim, Var):
                    out.add(dim.name)
    return out


def _signature(case: Case, sorts: dict[str, str], guard_vars: set[str]) -> tuple[Any, Any]:
    sizes = case.mesh.sizes
    primary: list[Any] = [sizes]
    secondary: list[Any] = []
    for name in sorted(case.binding):
        value = case.binding[name]
        sort = sorts.get(name)
        if sort in ("T", "TList"):
            specs = value if sort == "TList" else [value]
            secondary.append((name, tuple(None if s is None else len(s.shape) for s in specs)))
            for s in specs:
                if s is not None:
                    secondary.append(tuple((n == 1, tuple(n % k == 0 for k in sizes)) for n in s.shape))
        elif value == SYMBOLIC:
            continue
        elif sort == "IVec" and name in guard_vars:
            continue  # shapes read by guards: covered by the tensor patterns
        else:
            (primary if name in guard_vars or sort == "String" else secondary).append((name, value))
    return tuple(primary), (tuple(primary), tuple(secondary))


def by_signature(
    cases: Iterable[Case], rule: Rule, budget: int, placement_cases: bool = True
) -> tuple[list[Case], int]:
    """The smallest case of every signature of ``cases``, at most ``budget`` of them (but every primary
    class once), smallest first; and how many signatures there were. ``placement_cases``: every value of a
    placement dim variable is a primary class of its own (a proof's cross-check needs them; the numeric
    back-up, which wants the largest cases, does not)."""
    sorts = rule.var_sorts
    lhs_vars = {t.name for t in walk(rule.lhs) if isinstance(t, Var)}
    guard_vars = {v for v in sorts if v not in lhs_vars} | (placement_vars(rule) if placement_cases else set())
    best: dict[Any, tuple[int, Case]] = {}
    primaries: dict[Any, list[Any]] = {}
    for case in cases:
        primary, sig = _signature(case, sorts, guard_vars)
        size = case.elements()
        if sig not in best:
            primaries.setdefault(primary, []).append(sig)
            best[sig] = (size, case)
        elif size < best[sig][0]:
            best[sig] = (size, case)
    if len(best) <= budget:
        chosen = [case for _, case in best.values()]
    else:
        chosen = []
        queues = [list(sigs) for sigs in primaries.values()]
        while len(chosen) < max(budget, len(queues)) and any(queues):
            for q in queues:
                if q and len(chosen) < max(budget, len(queues)):
                    chosen.append(best[q.pop(0)][1])
    chosen.sort(key=lambda c: (c.elements(), c.mesh.sizes))
    return chosen, len(best)
