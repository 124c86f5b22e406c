"""Proof certificates: a rule fires only where it was proven.

``unity-eq verify --write-certificate`` records, per rule, what its proof covers: ``generic`` (every shape:
the rule fires everywhere its guards hold), ``bounded`` with the *domain* the bounded check enumerated (the
rule fires only inside it), or ``accepted`` (an unknown or partial rule a reviewer annotated with ``; verify:
unknown-ok``). The certificate of the shipped rules is ``rules/proofs.json``; a user's ``my.egg`` has its own
beside it, ``my.proofs.json``. Each entry is keyed by the rule's name and the digest of its text
(:func:`command_digest`): an edited rule has no current entry.

A bounded domain is a table: its *components* are the left-hand side's tensor variables (their rank and
dtype class, :data:`TENSOR_KIND`), its ``TList`` variables (their elements' class, :data:`LIST_KIND`), its
``IVec`` variables (their length) and its finite attribute variables
(``rulefile.domain.FINITE_I64``, string attributes: their value); its rows are the combinations the checked
cases took (:mod:`unity_eq.rulefile.domain` says what they are made of). When the engine loads a rule file it
adds that table as a guard (:func:`guard_text`): one relation per rule,
``(domain--NAME c1 c2 …)``, stated once per row, and facts binding each component, so the rule matches only a
combination that was checked. A rule with no current entry does not fire: it is moved to a ruleset the
engine never runs (egglog still loads it, so a broken file fails as before), with one warning line
(``UNITY_EQ_UNPROVEN_RULES=1`` keeps such rules, for experiments).

Dims and mesh sizes are not guarded (a bounded domain on dims would stop every rule on every real model):
docs/verify.md says why the enumerated sizes stand for all sizes. The engine never imports the verifier:
the verifier writes the certificate through :func:`write_certificate`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lark import Tree

from unity_eq.errors import RuleError
from unity_eq.files import write_file_atomic
from unity_eq.rulefile.sexp import PARSER, SExp, command_digest, render_sexp, sexp_of

__all__ = [
    "CERTIFICATE_NAME",
    "DOMAIN_PRELUDE",
    "OPT_OUT",
    "RULESET_DECLARATION",
    "Certificate",
    "GuardedFile",
    "certificate_path",
    "command_digest",
    "guard_text",
    "load_certificate",
    "render_sexp",
    "write_certificate",
]

#: The shipped rules' certificate, in rules/.
CERTIFICATE_NAME = "proofs.json"
#: Set to 1 to let rules with no current certificate entry fire anyway (experiments only).
OPT_OUT = "UNITY_EQ_UNPROVEN_RULES"
#: Format of the certificate file.
VERSION = 1

#: The ruleset of rules left out (declared by DOMAIN_PRELUDE, never run by the engine).
UNPROVEN = "unproven"

#: A tensor's class in a domain: its rank for a floating dtype, 100 + its rank for an integer dtype (an
#: index), -1 for an absent optional input (NoneT). The bounded semantics are over the reals, so a tensor
#: of another dtype (bool) matches no row.
TENSOR_KIND = "tkind"
#: A ``TList``'s class in a domain: its elements' common class (-2 for mixed classes, -1 for an empty list).
LIST_KIND = "tlkind"
_REAL = ("float16", "float32", "float64", "bfloat16", "float8")
#: signed integers only: an unsigned one wraps below zero at ordinary values (uint8 1 − 2 is 255), where the
#: integer proofs count over the integers, so no domain holds an unsigned tensor and no rule fires on one
#: (issue 21's fourth adversary: ``a − b > b − a`` → ``a > b`` is right on int8, wrong on uint8)
_INDEX = ("int64", "int32", "int16", "int8")

#: Put before analysis.egg's first line (on it: line numbers stay), whose own rewrites may need it.
RULESET_DECLARATION = f"(ruleset {UNPROVEN}) "

#: Loaded after analysis.egg by the engine (never by the verifier): the tensor class every domain reads.
DOMAIN_PRELUDE = "\n".join(
    [
        "; the dtype classes and tensor kinds of proof domains (unity_eq/rulefile/certificate.py)",
        "(relation real-dtype (String))",
        "(relation index-dtype (String))",
        *(f'(real-dtype "{d}")' for d in _REAL),
        *(f'(index-dtype "{d}")' for d in _INDEX),
        f"(function {TENSOR_KIND} (T) i64 :merge old)",
        f"(rule ((= s (shape t)) (= d (dtype t)) (real-dtype d)) ((set ({TENSOR_KIND} t) (vec-length s)))"
        " :ruleset analysis)",
        f"(rule ((= s (shape t)) (= d (dtype t)) (index-dtype d)) ((set ({TENSOR_KIND} t) (+ 100 (vec-length s))))"
        " :ruleset analysis)",
        f"(rule ((= t (NoneT))) ((set ({TENSOR_KIND} t) -1)) :ruleset analysis)",
        # a list's class: its elements' when they share one, -2 when they do not, -1 when it is empty
        f"(function {LIST_KIND} (TList) i64 :merge old)",
        f"(rule ((= l (TNil))) ((set ({LIST_KIND} l) -1)) :ruleset analysis)",
        f"(rule ((= l (TCons t r)) (= k ({TENSOR_KIND} t)) (= -1 ({LIST_KIND} r))) ((set ({LIST_KIND} l) k))"
        " :ruleset analysis)",
        f"(rule ((= l (TCons t r)) (= k ({TENSOR_KIND} t)) (= k ({LIST_KIND} r))) ((set ({LIST_KIND} l) k))"
        " :ruleset analysis)",
        f"(rule ((= l (TCons t r)) (= k ({TENSOR_KIND} t)) (= j ({LIST_KIND} r)) (!= j -1) (!= j k))"
        f" ((set ({LIST_KIND} l) -2)) :ruleset analysis)",
        f"(rule ((= l (PList m d a)) (= k ({LIST_KIND} m))) ((set ({LIST_KIND} l) k)) :ruleset analysis)",
        "",
    ]
)


# ----------------------------------------------------------------------------------------------------------
# The certificate file


@dataclass
class Certificate:
    """Entries keyed by rule name: ``{"digest", "proof": generic|bounded|accepted, ...}``."""

    path: Path
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)

    def current(self, name: str, digest: str) -> dict[str, Any] | None:
        entry = self.rules.get(name)
        return entry if entry is not None and entry.get("digest") == digest else None


def certificate_path(rule_file: Path, shipped_dir: Path) -> Path:
    """rules/proofs.json for a shipped file, ``my.proofs.json`` beside a user's ``my.egg``."""
    resolved = rule_file.resolve()
    if resolved.is_relative_to(shipped_dir.resolve()):
        return shipped_dir / CERTIFICATE_NAME
    return rule_file.with_name(rule_file.stem + ".proofs.json")


def load_certificate(path: Path) -> Certificate:
    """The certificate at ``path`` (empty when there is none)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Certificate(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RuleError(f"{path}: cannot read the proof certificate ({exc}). Rewrite it: {_fix(path)}.") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("rules"), dict):
        raise RuleError(f"{path}: not a version-{VERSION} proof certificate. Rewrite it: {_fix(path)}.")
    return Certificate(path, data["rules"])


def write_certificate(cert: Certificate) -> None:
    """Write ``cert`` atomically, one line per rule, sorted by name (a stable, readable diff)."""
    head = {"version": VERSION, "note": "written by `unity-eq verify --write-certificate`; read by the engine"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rules = [f"  {json.dumps(name)}: {json.dumps(cert.rules[name])}" for name in sorted(cert.rules)]
    text = "{\n" + "\n".join(lines) + '\n "rules": {\n' + ",\n".join(rules) + "\n }\n}\n"
    write_file_atomic(cert.path, text, "the proof certificate")


def _fix(path: Path) -> str:
    if path.name == CERTIFICATE_NAME:
        return "`unity-eq verify --write-certificate`"
    egg = path.with_name(path.name.removesuffix(".proofs.json") + ".egg")
    return f"`unity-eq verify {egg} --write-certificate`"


# ----------------------------------------------------------------------------------------------------------
# Guarding a rule file's text


@dataclass
class GuardedFile:
    """A rule file's text with each rule limited to its certificate: ``skipped`` names the rules left out
    (no current entry), ``guarded`` those limited to a bounded domain."""

    text: str
    skipped: list[str] = field(default_factory=list)
    guarded: list[str] = field(default_factory=list)


def _commands(text: str, display: str) -> list[tuple[int, int, SExp]]:
    """(start, end, s-expression) of each top-level command."""
    from lark.exceptions import UnexpectedInput

    try:
        tree = PARSER.parse(text)
    except UnexpectedInput:
        raise RuleError(f"{display}: syntax error (run `unity-eq verify {display}` for where)") from None
    out = []
    for child in tree.children:
        if isinstance(child, Tree) and not child.meta.empty:
            out.append((child.meta.start_pos, child.meta.end_pos, sexp_of(child, display)))
    return out


def _name(cmd: SExp, lines: list[str]) -> str | None:
    from unity_eq.rulefile.commands import BadCommand, rule_from_command
    from unity_eq.rulefile.terms import Rule

    try:
        rule = rule_from_command(cmd, lines)
    except BadCommand:  # a malformed command: egglog reports it when it loads the text unchanged
        return None
    return rule.name if isinstance(rule, Rule) else None


def _atom(text: str, is_string: bool = False) -> SExp:
    from unity_eq.rulefile.terms import Pos

    return SExp(Pos("", 0, 0), atom=text, is_string=is_string)


def _list(*items: SExp) -> SExp:
    from unity_eq.rulefile.terms import Pos

    return SExp(Pos("", 0, 0), items=list(items))


def relation_name(rule: str) -> str:
    return "domain--" + re.sub(r"[^A-Za-z0-9_-]", "_", rule)


def _domain_text(rule: str, entry: dict[str, Any]) -> tuple[str, list[SExp]]:
    """The declarations (relation and rows) and the guard facts of one bounded domain."""
    comps: list[list[str]] = entry["components"]
    rel = relation_name(rule)
    sorts = " ".join("String" if kind == "String" else "i64" for _name, kind in comps)
    decl = [f"(relation {rel} ({sorts}))"]  # written on the rule's line (see guard_text)
    for row in entry["rows"]:
        values = " ".join(json.dumps(v) if isinstance(v, str) else str(int(v)) for v in row)
        decl.append(f"({rel} {values})")
    facts: list[SExp] = []
    args: list[SExp] = []
    for i, (var, kind) in enumerate(comps):
        if kind in ("i64", "String"):
            args.append(_atom(var))
            continue
        bound = f"__domain{i}"
        fn = {"tensor": TENSOR_KIND, "tensors": LIST_KIND}.get(kind, "vec-length")
        facts.append(_list(_atom("="), _atom(bound), _list(_atom(fn), _atom(var))))
        args.append(_atom(bound))
    facts.append(_list(_atom(rel), *args))
    return "\n".join(decl) + "\n", facts


def _with_facts(cmd: SExp, facts: Sequence[SExp]) -> SExp:
    """``cmd`` with ``facts`` added to its ``:when`` list (a rewrite) or its query (a rule)."""
    items = list(cmd.items or [])
    if cmd.head == "rule":
        query = items[1]
        items[1] = _list(*(query.items or []), *facts)
        return _list(*items)
    for i, item in enumerate(items):
        if item.atom == ":when" and not item.is_string and i + 1 < len(items):
            items[i + 1] = _list(*(items[i + 1].items or []), *facts)
            return _list(*items)
    return _list(*items[:3], _atom(":when"), _list(*facts), *items[3:])


def _in_ruleset(cmd: SExp, ruleset: str) -> SExp:
    items = list(cmd.items or [])
    for i, item in enumerate(items):
        if item.atom == ":ruleset" and not item.is_string and i + 1 < len(items):
            items[i + 1] = _atom(ruleset)
            return _list(*items)
    return _list(*items, _atom(":ruleset"), _atom(ruleset))


def guard_text(text: str, display: str, cert: Certificate, allow_unproven: bool = False) -> GuardedFile:
    """``text`` with every rule limited to what ``cert`` says was proven of it: a ``generic`` or
    ``accepted`` rule unchanged, a ``bounded`` one guarded by its domain, one with no current entry left out
    (kept when ``allow_unproven``). Everything else (declarations, analysis rules) is kept as written."""
    from unity_eq.rulefile.commands import facts_beside_unions

    lines = text.splitlines()
    out: list[str] = []
    result = GuardedFile("")
    last = 0
    for start, end, cmd in _commands(text, display):
        if cmd.head not in ("rewrite", "birewrite", "rule"):
            continue
        name = _name(cmd, lines)
        if name is None:
            continue
        entry = cert.current(name, command_digest(cmd))
        if facts_beside_unions(cmd):
            entry = None  # verify refuses it (only its unions would be proven): an entry written before is void
        if entry is None:
            if allow_unproven:
                continue
            result.skipped.append(name)
            # kept in a ruleset that never runs: egglog still checks it (a broken file fails as before)
            replacement = render_sexp(_in_ruleset(cmd, UNPROVEN))
        elif entry.get("proof") == "bounded" and entry.get("components"):
            if cmd.head == "birewrite":  # the certificate has no domain per direction: written as two rules
                raise RuleError(f"{display}: rule '{name}': a bounded domain for a birewrite is not supported.")
            decl, facts = _domain_text(name, entry)
            replacement = decl + render_sexp(_with_facts(cmd, facts))
            result.guarded.append(name)
        else:
            continue
        out.append(text[last:start])
        # on the rule's first line, and as many lines as it had: egglog's errors keep their line numbers
        out.append(replacement.replace("\n", " ") + "\n" * text[start:end].count("\n"))
        last = end
    out.append(text[last:])
    result.text = "".join(out)
    return result


def allow_unproven() -> bool:
    return os.environ.get(OPT_OUT, "") not in ("", "0")


def guard_files(files: Iterable[tuple[Path, str, str]], shipped_dir: Path) -> tuple[list[str], list[str]]:
    """Guard each (path, display, text) rule file by its certificate; returns the new texts and one warning
    line per file with rules left out (printed by :func:`warn`)."""
    certs: dict[Path, Certificate] = {}
    texts: list[str] = []
    warnings: list[str] = []
    opt_out = allow_unproven()
    for path, display, text in files:
        cpath = certificate_path(path, shipped_dir)
        if cpath not in certs:
            certs[cpath] = load_certificate(cpath)
        guarded = guard_text(text, display, certs[cpath], opt_out)
        texts.append(guarded.text)
        if guarded.skipped:
            names = ", ".join(guarded.skipped[:3]) + (
                f" and {len(guarded.skipped) - 3} more" if len(guarded.skipped) > 3 else ""
            )
            warnings.append(
                f"warning: {display}: {len(guarded.skipped)} rule(s) left out, not proven by a current certificate "
                f"({names}): run {_fix(cpath)} "
                f"(or set {OPT_OUT}=1 to use them unproven)"
            )
    return texts, warnings


def warn(lines: Sequence[str]) -> None:
    for line in lines:
        sys.stderr.write(line + "\n")
