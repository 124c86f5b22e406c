"""The meaning of a rule file's commands: declarations build the :class:`~unity_eq.rulefile.env.Env`,
``rewrite``, ``birewrite`` and ``rule`` become :class:`~unity_eq.rulefile.terms.Rule` or
:class:`~unity_eq.rulefile.terms.AnalysisDecl` (with their names, rulesets and ``; verify: unknown-ok``
annotations).

Separate from the s-expression reader (:mod:`unity_eq.rulefile.sexp`) and from the checks of the rules built
(:mod:`unity_eq.rulefile.checks`): this is where the rule AST is made. A command that cannot be read raises
:class:`BadCommand` with its position; :func:`~unity_eq.rulefile.parse.parse_program` turns it into one line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from unity_eq.rulefile.env import Env, Signature
from unity_eq.rulefile.sexp import SExp, command_digest
from unity_eq.rulefile.terms import AnalysisDecl, App, Lit, Pos, Rule, Term, Var

__all__ = ["ANNOTATION", "COMMANDS", "BadCommand", "declare", "facts_beside_unions", "rule_from_command"]

#: The top-level commands a rule file may contain: declarations and rules. Anything else (``run``, ``let``,
#: ``include``…) is an error when the file loads, in ``optimize`` and ``verify`` alike.
COMMANDS = (
    "sort",
    "datatype",
    "datatype*",
    "constructor",
    "function",
    "relation",
    "ruleset",
    "rewrite",
    "birewrite",
    "rule",
)

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.\d*([eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+([eE][-+]?\d+)?)")

#: ``; verify: unknown-ok <reason>`` in the comment block right above a rule: a reviewed "unknown is fine".
ANNOTATION = re.compile(r";+\s*verify:\s*unknown-ok\b(.*)$")


# ----------------------------------------------------------------------------------------------------------
# terms


class BadCommand(Exception):
    """A command that cannot be read: where, and why (one line once the file is named)."""

    def __init__(self, pos: Pos, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


def _term(sexp: SExp) -> Term:
    if sexp.items is None:
        assert sexp.atom is not None
        if sexp.is_string:
            return Lit(sexp.atom, "String", sexp.pos)
        if _INT.fullmatch(sexp.atom):
            return Lit(int(sexp.atom), "i64", sexp.pos)
        if _FLOAT.fullmatch(sexp.atom):
            return Lit(float(sexp.atom), "f64", sexp.pos)
        if sexp.atom.startswith(":"):
            raise BadCommand(sexp.pos, f"unexpected keyword {sexp.atom} inside a term")
        return Var(sexp.atom, sexp.pos)
    if not sexp.items:
        raise BadCommand(sexp.pos, "empty term '()'")
    head = sexp.items[0]
    if head.items is not None or head.is_string or head.atom is None:
        raise BadCommand(sexp.pos, f"a term must start with a name, got {head.text()}")
    return App(head.atom, tuple(_term(i) for i in sexp.items[1:]), sexp.pos)


def _options(items: Sequence[SExp], start: int, pos: Pos) -> dict[str, SExp | None]:
    opts: dict[str, SExp | None] = {}
    i = start
    while i < len(items):
        key = items[i]
        if key.atom is None or not key.atom.startswith(":") or key.is_string:
            raise BadCommand(key.pos, f"expected an option such as :ruleset, got {key.text()}")
        if key.atom in (":subsume",):
            opts[key.atom] = None
            i += 1
            continue
        if i + 1 >= len(items):
            raise BadCommand(key.pos, f"option {key.atom} needs a value")
        opts[key.atom] = items[i + 1]
        i += 2
    return opts


# ----------------------------------------------------------------------------------------------------------
# declarations


def _sort_name(sexp: SExp) -> str:
    if sexp.atom is not None and not sexp.is_string:
        return sexp.atom
    raise BadCommand(sexp.pos, f"expected a sort name, got {sexp.text()}")


def declare(env: Env, cmd: SExp) -> None:
    head, items = cmd.head, cmd.items or []
    where = str(cmd.pos)
    if head == "sort" and len(items) >= 2:
        env.sorts.add(_sort_name(items[1]))
    elif head == "datatype":
        sort = _sort_name(items[1])
        env.sorts.add(sort)
        for variant in items[2:]:
            _constructor(env, variant, sort, where)
    elif head == "datatype*":
        for group in items[1:]:
            if not group.items:
                raise BadCommand(group.pos, "expected (Sort variants...) in datatype*")
            env.sorts.add(_sort_name(group.items[0]))
        for group in items[1:]:
            assert group.items is not None
            sort = _sort_name(group.items[0])
            for variant in group.items[1:]:
                _constructor(env, variant, sort, where)
    elif head == "constructor" and len(items) >= 4:
        args = tuple(_sort_name(s) for s in items[2].items or [])
        env.declare(Signature(_sort_name(items[1]), "constructor", args, _sort_name(items[3]), where=where))
    elif head in ("function", "relation") and len(items) >= 3:
        if items[2].items is None:
            raise BadCommand(items[2].pos, f"{head} {items[1].text()}: expected a list of argument sorts")
        args = tuple(_sort_name(s) for s in items[2].items)
        if head == "relation":
            env.declare(Signature(_sort_name(items[1]), "relation", args, None, where=where))
        else:
            result = _sort_name(items[3]) if len(items) > 3 else "Unit"
            env.declare(Signature(_sort_name(items[1]), "function", args, result, where=where))
    elif head == "ruleset" and len(items) >= 2:
        env.rulesets.add(_sort_name(items[1]))


def _constructor(env: Env, variant: SExp, sort: str, where: str) -> None:
    if not variant.items or variant.head is None:
        raise BadCommand(variant.pos, f"expected (Constructor sorts...) in datatype {sort}")
    args = tuple(_sort_name(s) for s in variant.items[1:])
    if args and args[-1] == ":cost":  # (Ctor T :cost 3)
        args = args[:-2] if len(args) >= 2 else args
    env.declare(Signature(variant.head, "constructor", args, sort, where=where))


# ----------------------------------------------------------------------------------------------------------
# rules


def _annotation(lines: list[str], line: int) -> tuple[str | None, Pos | None]:
    """The reason of a ``; verify: unknown-ok <reason>`` comment in the comment block above ``line``."""
    i = line - 2
    while i >= 0 and lines[i].strip().startswith(";"):
        match = ANNOTATION.search(lines[i].strip())
        if match:
            return match.group(1).strip(), Pos("", i + 1, 1)
        i -= 1
    return None, None


def rule_from_command(cmd: SExp, lines: list[str]) -> Rule | AnalysisDecl | None:
    head, items = cmd.head, cmd.items or []
    text = "\n".join(lines[cmd.pos.line - 1 : _end_line(cmd)])
    if head in ("rewrite", "birewrite"):
        if len(items) < 3:
            raise BadCommand(cmd.pos, f"{head} needs a left and a right side")
        opts = _options(items, 3, cmd.pos)
        lhs, rhs = _term(items[1]), _term(items[2])
        guards = _facts(opts.get(":when"))
        return _make_rule(cmd, lhs, rhs, guards, opts, head == "birewrite", lines, text)
    if head == "rule":
        if len(items) < 3 or items[1].items is None or items[2].items is None:
            raise BadCommand(cmd.pos, "rule needs a query list and an action list")
        opts = _options(items, 3, cmd.pos)
        query = tuple(_term(f) for f in items[1].items)
        actions = tuple(_term(a) for a in items[2].items)
        unions = [a for a in actions if isinstance(a, App) and a.head == "union"]
        ruleset = _ruleset(opts)
        if not unions:
            return AnalysisDecl(cmd.pos, query, actions, ruleset)
        rest = list(query)
        pairs: list[tuple[Term, Term]] = []
        for union in unions:
            if len(union.args) != 2:
                raise BadCommand(union.pos or cmd.pos, "union takes two terms")
            target, rhs = union.args
            pattern = _pattern_of(target, rest)
            if pattern is None:
                raise BadCommand(cmd.pos, f"cannot tell which pattern {target} names: bind it with (= {target} (...))")
            pairs.append((pattern, rhs))
        # a root's name in the other facts stands for its pattern
        names = {str(t): p for t, p in zip((u.args[0] for u in unions), (p for p, _ in pairs), strict=True)}
        rest = [_subst_vars(f, names) for f in rest]
        if len(pairs) == 1:
            pattern, rhs = pairs[0]
            return _make_rule(cmd, pattern, _subst_vars(rhs, names), tuple(rest), opts, False, lines, text)
        # several roots (a multi-pattern rule, e.g. two MatMuls sharing an input merged into one): verified as
        # the rewrite of the list of its patterns into the list of their replacements, so every root pair
        # must keep its global value and placement, and every right-hand side term its pieces
        lhs_list: Term = App("TNil")
        rhs_list: Term = App("TNil")
        for pattern, rhs in reversed(pairs):
            lhs_list = App("TCons", (pattern, lhs_list), pattern.pos if isinstance(pattern, App) else None)
            rhs_list = App("TCons", (_subst_vars(rhs, names), rhs_list))
        rule = _make_rule(cmd, lhs_list, rhs_list, tuple(rest), opts, False, lines, text)
        return dataclasses.replace(rule, roots=len(pairs))
    return None


def facts_beside_unions(cmd: SExp) -> list[str]:
    """The actions other than ``union`` of a ``(rule ...)`` that unions: a rule is verified as the rewrite of
    its unions, so a fact it also states (``(nonzero-values e)``, ``(can-split e 0 ax)``, ``(set (shape e)
    s)``) would reach the e-graph unchecked, and every rewrite guarded by it fire where it does not hold.
    Empty for every other command (an analysis rule's facts are checked as a declaration)."""
    if cmd.head != "rule" or not cmd.items or len(cmd.items) < 3 or cmd.items[2].items is None:
        return []
    actions = [_term(a) for a in cmd.items[2].items]
    if not any(isinstance(a, App) and a.head == "union" for a in actions):
        return []
    return [str(a) for a in actions if not (isinstance(a, App) and a.head == "union")]


def _pattern_of(target: Term, facts: list[Term]) -> Term | None:
    """The pattern a union target names: ``(= target (Op ...))`` in the query (removed from ``facts``), or the
    target itself when it is a term."""
    if isinstance(target, App):
        return target
    for i, fact in enumerate(facts):
        if (
            isinstance(fact, App)
            and fact.head == "="
            and len(fact.args) == 2
            and fact.args[0] == target
            and isinstance(fact.args[1], App)
        ):
            del facts[i]
            return fact.args[1]
    return None


def _subst_vars(term: Term, names: dict[str, Term]) -> Term:
    if isinstance(term, Var):
        return names.get(term.name, term)
    if isinstance(term, App):
        return App(term.head, tuple(_subst_vars(a, names) for a in term.args), term.pos)
    return term


def _end_line(cmd: SExp) -> int:
    last = cmd.pos.line
    for item in cmd.items or []:
        last = max(last, item.pos.line, _end_line(item) if item.items else item.pos.line)
    return last


def _facts(sexp: SExp | None) -> tuple[Term, ...]:
    if sexp is None:
        return ()
    if sexp.items is None:
        raise BadCommand(sexp.pos, f":when expects a list of facts, got {sexp.text()}")
    return tuple(_term(f) for f in sexp.items)


def _ruleset(opts: dict[str, SExp | None]) -> str:
    value = opts.get(":ruleset")
    if value is None:
        return ""
    if value.atom is None or value.is_string:
        raise BadCommand(value.pos, f":ruleset expects a name, got {value.text()}")
    return value.atom


def _make_rule(
    cmd: SExp,
    lhs: Term,
    rhs: Term,
    guards: tuple[Term, ...],
    opts: dict[str, SExp | None],
    bidirectional: bool,
    lines: list[str],
    text: str,
) -> Rule:
    name_opt = opts.get(":name")
    if name_opt is not None:
        if not name_opt.is_string or name_opt.atom is None:
            raise BadCommand(name_opt.pos, f":name expects a string, got {name_opt.text()}")
        name = name_opt.atom
    else:
        name = f"{Path(cmd.pos.file).stem}-{cmd.head}-{cmd.pos.line}"
    reason, where = _annotation(lines, cmd.pos.line)
    if where is not None and not reason:
        raise BadCommand(
            Pos(cmd.pos.file, where.line, 1),
            "`; verify: unknown-ok` needs a reason after it, e.g. `; verify: unknown-ok z3 times out on Pow`",
        )
    ruleset = _ruleset(opts)
    return Rule(name, cmd.pos, lhs, rhs, guards, ruleset, bidirectional, (), reason, text, digest=command_digest(cmd))
