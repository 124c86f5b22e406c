"""Parse ``.egg`` files with lark into the rule AST, and check rules when they load.

The grammar is plain s-expressions; the commands that matter to the prover are interpreted here:
declarations (``sort``, ``datatype``, ``datatype*``, ``constructor``, ``function``, ``relation``, ``ruleset``)
build the :class:`~unity_eq.rulefile.env.Env`, and ``rewrite``, ``birewrite`` and ``rule`` become
:class:`~unity_eq.rulefile.terms.Rule` (a ``rule`` whose action is a ``union``) or
:class:`~unity_eq.rulefile.terms.AnalysisDecl` (a ``rule`` that only adds facts). Any other command is an error
(:data:`COMMANDS` lists the allowed ones).

Load-time checks (egg's ``Rewrite::new`` does the same), each a one-line message naming the rule and its
file:line: unknown constructors, relations or functions; wrong arity; a variable used at two sorts; a
right-hand side or guard variable that nothing binds; duplicate rule names; unknown rulesets. Syntax errors
name file:line:column.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from unity_eq.errors import RuleError
from unity_eq.rulefile.env import Env, Signature
from unity_eq.rulefile.terms import (
    APPLICABILITY_FILTERS,
    AnalysisDecl,
    App,
    Lit,
    Pos,
    Rule,
    Term,
    Var,
    term_vars,
    walk,
)

__all__ = ["ANNOTATION", "COMMANDS", "Program", "RuleSource", "parse_program", "parse_sexps"]

GRAMMAR = r"""
start: _item*
_item: list | STRING | ATOM
list: "(" _item* ")"
STRING: /"(\\.|[^"\\])*"/
ATOM: /[^\s()";]+/
COMMENT: /;[^\n]*/
%import common.WS
%ignore WS
%ignore COMMENT
"""

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

_PARSER = Lark(GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.\d*([eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+([eE][-+]?\d+)?)")

#: ``; verify: unknown-ok <reason>`` in the comment block right above a rule: a reviewed "unknown is fine".
ANNOTATION = re.compile(r";+\s*verify:\s*unknown-ok\b(.*)$")


@dataclass(frozen=True)
class RuleSource:
    """One file's text and the path to show in messages (``rules/parallel/matmul.egg``)."""

    display: str
    text: str


@dataclass
class SExp:
    """A parsed s-expression: ``items`` for a list, ``atom`` for a token (``is_string``: a string literal)."""

    pos: Pos
    items: list[SExp] | None = None
    atom: str | None = None
    is_string: bool = False

    @property
    def head(self) -> str | None:
        if self.items and self.items[0].atom is not None and not self.items[0].is_string:
            return self.items[0].atom
        return None

    def text(self) -> str:
        if self.items is None:
            return f'"{self.atom}"' if self.is_string else str(self.atom)
        return "(" + " ".join(i.text() for i in self.items) + ")"


@dataclass
class Program:
    """Everything loaded: the environment, the rules and the analysis declarations, in file order."""

    env: Env
    rules: list[Rule] = field(default_factory=list)
    analyses: list[AnalysisDecl] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------
# s-expressions


def _unclosed(text: str) -> tuple[int, int] | None:
    """Line and column of the first '(' that is never closed (strings and comments skipped)."""
    stack: list[tuple[int, int]] = []
    line, col, i = 1, 1, 0
    in_string = False
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
                col += 1
            elif ch == '"':
                in_string = False
        elif ch == ";":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif ch == '"':
            in_string = True
        elif ch == "(":
            stack.append((line, col))
        elif ch == ")" and stack:
            stack.pop()
        if ch == "\n":
            line, col = line + 1, 1
        else:
            col += 1
        i += 1
    return stack[0] if stack else None


def parse_sexps(source: RuleSource) -> list[SExp]:
    """The top-level s-expressions of a file; a syntax error raises RuleError with file:line:column."""
    try:
        tree = _PARSER.parse(source.text)
    except UnexpectedInput as exc:
        raise RuleError(_syntax_message(source, exc)) from None
    return [_sexp(item, source.display) for item in tree.children]


def _syntax_message(source: RuleSource, exc: UnexpectedInput) -> str:
    where = f"{source.display}:{exc.line}:{exc.column}"
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        opened = _unclosed(source.text)
        if opened:
            line, col = opened
            return f"{source.display}:{line}:{col}: syntax error: this '(' is never closed. Add the ')'."
        return f"{where}: syntax error: unexpected end of file."
    if isinstance(exc, UnexpectedToken):
        return f"{where}: syntax error: unexpected {exc.token.value!r}. Check the parentheses before it."
    if isinstance(exc, UnexpectedCharacters):
        char = source.text[exc.pos_in_stream] if exc.pos_in_stream is not None else "?"
        if char == '"':
            return f"{where}: syntax error: unterminated string. Close it with '\"'."
        return f"{where}: syntax error: unexpected character {char!r}."
    return f"{where}: syntax error."  # pragma: no cover - lark raises one of the above


def _sexp(node: Tree | Token, file: str) -> SExp:
    if isinstance(node, Token):
        pos = Pos(file, node.line or 0, node.column or 0)
        if node.type == "STRING":
            return SExp(pos, atom=_unescape(node.value[1:-1]), is_string=True)
        return SExp(pos, atom=node.value)
    pos = Pos(file, node.meta.line, node.meta.column) if not node.meta.empty else Pos(file, 0, 0)
    return SExp(pos, items=[_sexp(child, file) for child in node.children])


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


# ----------------------------------------------------------------------------------------------------------
# terms


class _Bad(Exception):
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
            raise _Bad(sexp.pos, f"unexpected keyword {sexp.atom} inside a term")
        return Var(sexp.atom, sexp.pos)
    if not sexp.items:
        raise _Bad(sexp.pos, "empty term '()'")
    head = sexp.items[0]
    if head.items is not None or head.is_string or head.atom is None:
        raise _Bad(sexp.pos, f"a term must start with a name, got {head.text()}")
    return App(head.atom, tuple(_term(i) for i in sexp.items[1:]), sexp.pos)


def _options(items: Sequence[SExp], start: int, pos: Pos) -> dict[str, SExp | None]:
    opts: dict[str, SExp | None] = {}
    i = start
    while i < len(items):
        key = items[i]
        if key.atom is None or not key.atom.startswith(":") or key.is_string:
            raise _Bad(key.pos, f"expected an option such as :ruleset, got {key.text()}")
        if key.atom in (":subsume",):
            opts[key.atom] = None
            i += 1
            continue
        if i + 1 >= len(items):
            raise _Bad(key.pos, f"option {key.atom} needs a value")
        opts[key.atom] = items[i + 1]
        i += 2
    return opts


# ----------------------------------------------------------------------------------------------------------
# declarations


def _sort_name(sexp: SExp) -> str:
    if sexp.atom is not None and not sexp.is_string:
        return sexp.atom
    raise _Bad(sexp.pos, f"expected a sort name, got {sexp.text()}")


def _declare(env: Env, cmd: SExp) -> None:
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
                raise _Bad(group.pos, "expected (Sort variants...) in datatype*")
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
            raise _Bad(items[2].pos, f"{head} {items[1].text()}: expected a list of argument sorts")
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
        raise _Bad(variant.pos, f"expected (Constructor sorts...) in datatype {sort}")
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


def _rule_from_command(cmd: SExp, lines: list[str]) -> Rule | AnalysisDecl | None:
    head, items = cmd.head, cmd.items or []
    text = "\n".join(lines[cmd.pos.line - 1 : _end_line(cmd)])
    if head in ("rewrite", "birewrite"):
        if len(items) < 3:
            raise _Bad(cmd.pos, f"{head} needs a left and a right side")
        opts = _options(items, 3, cmd.pos)
        lhs, rhs = _term(items[1]), _term(items[2])
        guards = _facts(opts.get(":when"))
        return _make_rule(cmd, lhs, rhs, guards, opts, head == "birewrite", lines, text)
    if head == "rule":
        if len(items) < 3 or items[1].items is None or items[2].items is None:
            raise _Bad(cmd.pos, "rule needs a query list and an action list")
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
                raise _Bad(union.pos or cmd.pos, "union takes two terms")
            target, rhs = union.args
            pattern = _pattern_of(target, rest)
            if pattern is None:
                raise _Bad(cmd.pos, f"cannot tell which pattern {target} names: bind it with (= {target} (...))")
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
        raise _Bad(sexp.pos, f":when expects a list of facts, got {sexp.text()}")
    return tuple(_term(f) for f in sexp.items)


def _ruleset(opts: dict[str, SExp | None]) -> str:
    value = opts.get(":ruleset")
    if value is None:
        return ""
    if value.atom is None or value.is_string:
        raise _Bad(value.pos, f":ruleset expects a name, got {value.text()}")
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
            raise _Bad(name_opt.pos, f":name expects a string, got {name_opt.text()}")
        name = name_opt.atom
    else:
        name = f"{Path(cmd.pos.file).stem}-{cmd.head}-{cmd.pos.line}"
    reason, where = _annotation(lines, cmd.pos.line)
    if where is not None and not reason:
        raise _Bad(
            Pos(cmd.pos.file, where.line, 1),
            "`; verify: unknown-ok` needs a reason after it, e.g. `; verify: unknown-ok z3 times out on Pow`",
        )
    return Rule(name, cmd.pos, lhs, rhs, guards, _ruleset(opts), bidirectional, (), reason, text)


# ----------------------------------------------------------------------------------------------------------
# checks


class _Checker:
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


def _check_analysis(env: Env, decl: AnalysisDecl) -> list[str]:
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


def parse_program(sources: Sequence[RuleSource], base: Sequence[RuleSource] = (), env: Env | None = None) -> Program:
    """Parse ``base`` (schema, analyses) and then ``sources``; rules of both are collected and checked.

    Errors are collected in ``Program.errors`` (one line each) rather than raised: the caller decides.
    A syntax error stops the file it is in.
    """
    program = Program(env.copy() if env is not None else Env())
    names: dict[str, Rule] = {}
    for source in (*base, *sources):
        program.files.append(source.display)
        try:
            commands = parse_sexps(source)
        except RuleError as exc:
            program.errors.append(str(exc))
            continue
        lines = source.text.splitlines()
        pending: list[Rule] = []
        for cmd in commands:
            if cmd.items is None:
                program.errors.append(
                    f"{cmd.pos.file}:{cmd.pos.line}:{cmd.pos.column}: expected a command, got {cmd.text()}"
                )
                continue
            if cmd.head not in COMMANDS:
                got = cmd.head if cmd.head is not None else cmd.text()
                program.errors.append(
                    f"{cmd.pos.file}:{cmd.pos.line}:{cmd.pos.column}: unknown command {got!r}; a rule file may "
                    f"contain only {', '.join(COMMANDS)}. Remove it or write it as one of these."
                )
                continue
            try:
                _declare(program.env, cmd)
                item = _rule_from_command(cmd, lines)
            except _Bad as exc:
                program.errors.append(f"{exc.pos.file or cmd.pos.file}:{exc.pos.line}:{exc.pos.column}: {exc.message}")
                continue
            if isinstance(item, Rule):
                pending.append(item)
            elif isinstance(item, AnalysisDecl):
                program.analyses.append(item)
                program.errors.extend(_check_analysis(program.env, item))
        for rule in pending:
            checker = _Checker(program.env, rule)
            checked = checker.check()
            program.errors.extend(checker.errors)
            if rule.name in names:
                first = names[rule.name]
                program.errors.append(
                    f"rule '{rule.name}' ({rule.pos}) has the name of rule '{first.name}' ({first.pos}); "
                    "rule names must be unique. Rename one of them."
                )
                continue
            names[rule.name] = checked
            if not checker.errors:
                program.rules.append(checked)
    return program
