"""Rediscovery: which generated rules equal, specialize or generalize a hand-written core rule.

Part of phase 5 of :mod:`unity_eq.verify._generate`.
"""

from __future__ import annotations

from collections.abc import Sequence

from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var
from unity_eq.verify._candidates import subterms
from unity_eq.verify._enumerate import (
    list_items,
)

# ----------------------------------------------------------------------------------------------------------
# Rediscovery


def _match(pattern: Term, term: Term, subst: dict[str, Term]) -> bool:
    if isinstance(pattern, Var):
        got = subst.get(pattern.name)
        if got is None:
            subst[pattern.name] = term
            return True
        return got == term
    if isinstance(pattern, Lit):
        return isinstance(term, Lit) and _lit_eq(pattern, term)
    return (
        isinstance(term, App)
        and term.head == pattern.head
        and len(term.args) == len(pattern.args)
        and all(_match(p, t, subst) for p, t in zip(pattern.args, term.args, strict=True))
    )


def _lit_eq(a: Lit, b: Lit) -> bool:
    return a.value == b.value or (a.sort == "f64" and b.sort == "f64" and float(a.value) == float(b.value))


def _match_rhs(pattern: Term, term: Term, subst: dict[str, Term]) -> bool:
    """``_match``, where ``(PList l d ax)`` matches the list of ``(Partition item d ax)``."""
    if isinstance(pattern, App) and pattern.head == "PList":
        items, parts = list_items(term), []
        for item in items:
            if not (isinstance(item, App) and item.head == "Partition"):
                return False
            parts.append(item)
        if not parts and not (isinstance(term, App) and term.head == "TNil"):
            return False
        inner = App("TNil")
        for part in reversed(parts):
            inner = App("TCons", (part.args[0], inner))
        return all(
            _match(pattern.args[1], p.args[1], subst) and _match(pattern.args[2], p.args[2], subst) for p in parts
        ) and _match(pattern.args[0], inner, subst)
    if isinstance(pattern, App) and isinstance(term, App):
        return (
            term.head == pattern.head
            and len(term.args) == len(pattern.args)
            and all(_match_rhs(p, t, subst) for p, t in zip(pattern.args, term.args, strict=True))
        )
    return _match(pattern, term, subst)


def _same_rule(general: Rule, special: Rule) -> bool:
    """``special`` is ``general`` with its variables instantiated (equal when both ways): the same rewrite,
    maybe with literal dims where ``general`` has guarded variables."""
    subst: dict[str, Term] = {}
    return _match(general.lhs, special.lhs, subst) and _match_rhs(general.rhs, special.rhs, subst)


def rediscoveries(generated: Sequence[tuple[str, Rule]], core: Sequence[Rule]) -> dict[str, list[str]]:
    """Core rule name -> generated rules that equal it, specialize it or generalize it."""
    out: dict[str, list[str]] = {}
    for c in core:
        for name, g in generated:
            if _same_rule(c, g) or _same_rule(g, c):
                out.setdefault(c.name, []).append(name)
    return out


def constructors(rule: Rule) -> set[str]:
    return {
        t.head
        for side in (rule.lhs, rule.rhs)
        for t in subterms(side)
        if isinstance(t, App) and t.head[:1].isupper() and t.head not in ("R", "D", "P", "S")
    }
