"""Installed as ``unity_eq.verify`` (pyproject ``[tool.setuptools.package-dir]``): import it by that name.

Prove rewrite rules sound with z3: ``unity-eq verify`` and ``python -m unity_eq.verify``.

A rule is parsed from its ``.egg`` file (lark; :func:`load_program`), then proven three ways:

* **generic**: for all shapes, from operator axioms over uninterpreted tensors (TASO's method);
* **bounded**: exactly, with z3, on every small case (dims 1-4, axis sizes 1-4) its guards allow;
* **numeric**: on random inputs at larger shapes, with numpy.

The contract a rule must keep (global value, placement per mesh axis, pieces per device) is in
:mod:`unity_eq.verify._semantics` and docs/verify.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unity_eq.rulefile.parse import Program, RuleSource, parse_program
from unity_eq.rulefile.terms import AnalysisDecl, App, Lit, Rule, Term, Var
from unity_eq.verify._bounded import BoundedResult, Counterexample
from unity_eq.verify._cli import main, render
from unity_eq.verify._cli import run as run_verify
from unity_eq.verify._generic import GenericResult
from unity_eq.verify._memory import memory_capped
from unity_eq.verify._numeric import NumericResult
from unity_eq.verify._verify import (
    Options,
    Report,
    RuleReport,
    load_program,
    shipped_rule_files,
    verify_program,
    verify_rules,
)

__all__ = [
    "AnalysisDecl",
    "App",
    "BoundedResult",
    "Counterexample",
    "GenericResult",
    "Lit",
    "NumericResult",
    "Options",
    "Program",
    "Report",
    "Rule",
    "RuleReport",
    "RuleSource",
    "Term",
    "Var",
    "check_ops",
    "generate_rules",
    "load_program",
    "main",
    "memory_capped",
    "parse_program",
    "render",
    "render_report",
    "run_verify",
    "shipped_rule_files",
    "verify_program",
    "verify_rules",
]

#: The rule generator (``unity-eq generate-rules``), imported when first used: ``verify`` does not need it.
_LAZY = {name: "unity_eq.verify._generate" for name in ("check_ops", "generate_rules", "render_report")}

if TYPE_CHECKING:
    from unity_eq.verify._generate import check_ops, generate_rules, render_report


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'unity_eq.verify' has no attribute {name!r}")
