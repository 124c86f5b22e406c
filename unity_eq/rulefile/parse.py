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

This module runs the files through the three steps, each in its own module: :mod:`~unity_eq.rulefile.sexp`
(text to s-expressions), :mod:`~unity_eq.rulefile.commands` (s-expressions to declarations and rules) and
:mod:`~unity_eq.rulefile.checks` (the checks of each rule); it collects their errors in :class:`Program`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from unity_eq.errors import RuleError
from unity_eq.rulefile.checks import Checker, check_analysis
from unity_eq.rulefile.commands import (
    ANNOTATION,
    COMMANDS,
    BadCommand,
    declare,
    facts_beside_unions,
    rule_from_command,
)
from unity_eq.rulefile.env import Env
from unity_eq.rulefile.sexp import RuleSource, parse_sexps
from unity_eq.rulefile.terms import AnalysisDecl, Rule

__all__ = ["ANNOTATION", "COMMANDS", "Program", "RuleSource", "parse_program", "parse_sexps"]


@dataclass
class Program:
    """Everything loaded: the environment, the rules and the analysis declarations, in file order."""

    env: Env
    rules: list[Rule] = field(default_factory=list)
    analyses: list[AnalysisDecl] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


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
                declare(program.env, cmd)
                item = rule_from_command(cmd, lines)
            except BadCommand as exc:
                program.errors.append(f"{exc.pos.file or cmd.pos.file}:{exc.pos.line}:{exc.pos.column}: {exc.message}")
                continue
            beside = facts_beside_unions(cmd)
            if beside:
                program.errors.append(
                    f"{cmd.pos.file}:{cmd.pos.line}:{cmd.pos.column}: a rule that unions may not also state facts "
                    f"({', '.join(beside)}): only its unions are verified, so those facts would reach the e-graph "
                    "unchecked. State them in an analysis rule of their own."
                )
                continue
            if isinstance(item, Rule):
                pending.append(item)
            elif isinstance(item, AnalysisDecl):
                program.analyses.append(item)
                program.errors.extend(check_analysis(program.env, item))
        for rule in pending:
            checker = Checker(program.env, rule)
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
