"""The load-time checks of a rule (egg's ``Rewrite::new`` does the same): known constructors, relations and
functions, arity, one sort per variable, bound right-hand side and guard variables, declared rulesets, and
the applicability filters the proof leaves out; and the checks of an analysis rule.

Separate from building rules (:mod:`unity_eq.rulefile.commands`): a rule is checked against the whole
environment of its file, after every declaration in it has been read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from unity_eq.rulefile.env import Env
from unity_eq.rulefile.terms import APPLICABILITY_FILTERS, AnalysisDecl, App, Lit, Rule, Term, Var, term_vars, walk

__all__ = ["Checker", "check_analysis"]


class Checker:
    """Sorts, arity, known names and bound variables of one rule, against an Env."""

    def __init__(self, env: Env, rule: Rule) -> None:
        self.env = env
        self.rule = rule
        self.sorts: dict[str, str] = {}
        self.errors: list[str] = []

    def fail(self, message: str) -> None:
        self.errors.append(f"{self.rule.where()} {message}")

    def infer(self, term: Term, expected: str | None, context: str) -> str | None:
        """Check ``term`` and return its sort (None when unknown, e.g. an untyped variable)."""
        if isinstance(term, Lit):
            if expected is not None and expected != term.sort:
                self.fail(f"uses {term} where {expected} is expected, in {context}")
            return term.sort
        if isinstance(term, Var):
            known = self.sorts.get(term.name)
            if expected is None:
                return known
            if known is None:
                self.sorts[term.name] = expected
            elif known != expected:
                self.fail(f"uses var {term.name} both as {known} and as {expected}")
            return expected
        sig = self.env.get(term.head)
        if sig is None:
            hint = _suggest(term.head, self.env.signatures)
            self.fail(
                f"uses unknown {'relation or function' if context == 'guard' else 'constructor'} '{term.head}'{hint}"
            )
            for arg in term.args:
                self.infer(arg, None, context)
            return None
        if context in ("lhs", "rhs") and sig.kind in ("relation",):
            self.fail(f"uses relation '{term.head}' inside a term; relations belong in :when")
        if context == "lhs" and sig.kind == "primitive":
            self.fail(f"uses primitive '{term.head}' in its left-hand side; bind it in :when instead")
        n = len(term.args)
        if (sig.variadic and n < len(sig.args) - 1) or (not sig.variadic and n != len(sig.args)):
            self.fail(
                f"calls '{term.head}' with {n} argument{'s' if n != 1 else ''}, expected {len(sig.args)}"
                f" ({' '.join(str(s) for s in sig.args)}); see {sig.where}"
            )
        if expected is not None and sig.result not in (None, expected) and sig.kind != "relation":
            self.fail(f"uses {term} (sort {sig.result}) where {expected} is expected")
        if sig.args and sig.args[0] is None:  # = and !=: both sides share a sort
            left = self.infer(term.args[0], None, context) if term.args else None
            right = self.infer(term.args[1], left, context) if len(term.args) > 1 else None
            if left is None and right is not None and term.args:
                self.infer(term.args[0], right, context)
            return sig.result
        for i, arg in enumerate(term.args):
            sort = sig.args[min(i, len(sig.args) - 1)] if sig.args else None
            self.infer(arg, sort, context)
        return sig.result

    def check(self) -> Rule:
        rule = self.rule
        lhs_sort = self.infer(rule.lhs, None, "lhs")
        if isinstance(rule.lhs, Var):
            self.fail("has a bare variable as its left-hand side; it would match everything")
        for _ in range(2):  # a second pass types = atoms whose sides were untyped the first time
            for guard in rule.guards:
                self.infer(guard, None, "guard")
        self.infer(rule.rhs, lhs_sort, "rhs")
        if rule.ruleset and rule.ruleset not in self.env.rulesets:
            self.fail(f"uses undeclared ruleset '{rule.ruleset}'; declare it with (ruleset {rule.ruleset})")
        bound = set(term_vars(rule.lhs))
        for guard in rule.guards:
            bound |= _binding_vars(guard, self.env)
        for guard in rule.guards:
            for var in term_vars(guard):
                if var not in bound:
                    self.fail(f"refers to unbound var {var} in :when; bind it in a relation or with (= {var} ...)")
        for var in term_vars(rule.rhs):
            if var not in bound:
                self.fail(f"refers to unbound var {var}")
        if rule.bidirectional:
            back = set(term_vars(rule.rhs))
            for guard in rule.guards:
                back |= _binding_vars(guard, self.env)
            for var in term_vars(rule.lhs):
                if var not in back:
                    self.fail(f"is a birewrite whose right-hand side does not bind var {var}")
        for var in sorted(set(term_vars(rule.lhs)) | bound):
            if var not in self.sorts:
                self.fail(f"cannot tell the sort of var {var}")
        guards, filters = self.split_filters()
        return dataclasses.replace(rule, guards=guards, filters=filters, sorts=tuple(sorted(self.sorts.items())))

    def split_filters(self) -> tuple[tuple[Term, ...], tuple[Term, ...]]:
        """The guards the proof needs, and the applicability filters it leaves out (APPLICABILITY_FILTERS with
        the comparisons between the numbers only they bind). A filter's numbers must not reach the right-hand
        side or another guard: then leaving the filter out would change what the rule builds."""
        rule = self.rule
        filters = [g for g in rule.guards if isinstance(g, App) and g.head in APPLICABILITY_FILTERS]
        if not filters:
            return rule.guards, ()
        outside = set(term_vars(rule.lhs))
        for guard in rule.guards:
            if guard not in filters:
                outside |= _binding_vars(guard, self.env)
        filter_only = {v for f in filters for v in term_vars(f) if v not in outside}
        for guard in rule.guards:
            used = set(term_vars(guard))
            comparison = isinstance(guard, App) and guard.head in ("<", "<=", ">", ">=", "!=", "=")
            if comparison and isinstance(guard, App) and guard not in filters and used and used <= filter_only:
                filters.append(guard)
        kept = tuple(g for g in rule.guards if g not in filters)
        for term in (rule.rhs, *kept):
            leaked = sorted(set(term_vars(term)) & filter_only)
            if leaked:
                self.fail(
                    f"uses {', '.join(leaked)}, bound only by an applicability filter "
                    f"({', '.join(sorted(APPLICABILITY_FILTERS))}), outside the filter and its comparisons"
                )
        return kept, tuple(filters)


def _binding_vars(guard: Term, env: Env) -> set[str]:
    """Variables a guard fact binds: those inside a relation, function or constructor call, and the
    variable side of an ``=``. Variables only compared by primitives are not bound."""
    out: set[str] = set()
    if not isinstance(guard, App):
        return out
    sig = env.get(guard.head)
    if guard.head == "=" and len(guard.args) == 2:
        for side in guard.args:
            if isinstance(side, Var):
                out.add(side.name)
            else:
                out |= _binding_vars(side, env)
        return out
    if sig is not None and sig.kind in ("relation", "function", "constructor"):
        for arg in guard.args:
            for t in walk(arg):
                if isinstance(t, Var):
                    out.add(t.name)
        return out
    for arg in guard.args:
        out |= _binding_vars(arg, env)
    return out


def _suggest(name: str, names: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1)
    return f". Did you mean '{close[0]}'?" if close else ""


def check_analysis(env: Env, decl: AnalysisDecl) -> list[str]:
    errors: list[str] = []
    for term in (*decl.query, *decl.actions):
        for t in walk(term):
            if isinstance(t, App) and t.head not in ("union", "set", "delete", "subsume", "let", "panic"):
                sig = env.get(t.head)
                if sig is None:
                    errors.append(f"analysis rule ({decl.pos}) uses unknown relation or constructor '{t.head}'")
                elif not sig.variadic and len(t.args) != len(sig.args):
                    errors.append(
                        f"analysis rule ({decl.pos}) calls '{t.head}' with {len(t.args)} arguments, "
                        f"expected {len(sig.args)}"
                    )
    if decl.ruleset and decl.ruleset not in env.rulesets:
        errors.append(f"analysis rule ({decl.pos}) uses undeclared ruleset '{decl.ruleset}'")
    return errors
