"""The syntax layer of rule files: the lark grammar, a file's text as s-expressions, and syntax errors that
name file:line:column (an unclosed '(' is named where it opens).

Separate from :mod:`unity_eq.rulefile.commands` (what the s-expressions mean) so that reading the text knows
nothing of declarations or rules.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from unity_eq.errors import RuleError
from unity_eq.rulefile.terms import Pos

__all__ = ["GRAMMAR", "RuleSource", "SExp", "parse_sexps"]

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

PARSER = Lark(GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)


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
        tree = PARSER.parse(source.text)
    except UnexpectedInput as exc:
        raise RuleError(_syntax_message(source, exc)) from None
    return [sexp_of(item, source.display) for item in tree.children]


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


def sexp_of(node: Tree | Token, file: str) -> SExp:
    if isinstance(node, Token):
        pos = Pos(file, node.line or 0, node.column or 0)
        if node.type == "STRING":
            return SExp(pos, atom=_unescape(node.value[1:-1]), is_string=True)
        return SExp(pos, atom=node.value)
    pos = Pos(file, node.meta.line, node.meta.column) if not node.meta.empty else Pos(file, 0, 0)
    return SExp(pos, items=[sexp_of(child, file) for child in node.children])


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def render_sexp(sexp: SExp) -> str:
    """One line of canonical text (comments and layout dropped, strings escaped): what the digest reads and
    what a guarded rule is written back as."""
    if sexp.items is None:
        if sexp.is_string:
            escaped = str(sexp.atom).replace("\\", "\\\\").replace('"', '\\"')
            return f'"{escaped}"'
        return str(sexp.atom)
    return "(" + " ".join(render_sexp(i) for i in sexp.items) + ")"


def command_digest(cmd: SExp) -> str:
    """The digest of a rule's text: its certificate entry is current only while the text is unchanged
    (comments and layout aside)."""
    return hashlib.sha256(render_sexp(cmd).encode()).hexdigest()[:16]
