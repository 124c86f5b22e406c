"""Verify rule files: load them, prove every rule three ways, and decide.

For each rule: a shape-generic proof (:mod:`unity_eq.verify._generic`), a bounded proof
(:mod:`unity_eq.verify._bounded`) and the numeric back-up (:mod:`unity_eq.verify._numeric`). The verdict:

* **refuted** when the bounded proof finds a counterexample or the numeric back-up finds a mismatch;
* **proven** otherwise, when the generic or the bounded proof succeeds (``kind`` says which: ``generic``
  when it holds for all shapes, ``bounded`` when for every case enumerated). A generic proof counts only
  from premises shown satisfiable: by a bounded case that satisfies the guards, or, when the bounded proof
  has no such case, by z3 itself; otherwise (``vacuous``) it does not count;
* **unknown** otherwise (z3 timed out, or a guard relation has no Python mirror); ``kind`` is ``numeric``
  when only the numeric back-up passed. Unknown fails unless the rule carries ``; verify: unknown-ok
  <reason>`` in the comment block right above it.

A ``birewrite`` is verified in both directions. Rules run in parallel worker processes (``jobs``); rules
with the same structure (the 16 binary elementwise ops…) share one enumeration of cases.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any

from unity_eq.files import worker_pool
from unity_eq.rulefile.load import load_program, shipped_rule_files
from unity_eq.rulefile.parse import Program
from unity_eq.rulefile.terms import AnalysisDecl, App, Rule
from unity_eq.verify._analysis import AnalysisOutcome, check_analysis_decl, checked_claims
from unity_eq.verify._bounded import (
    BoundedResult,
    Counterexample,
    enumeration_key,
)
from unity_eq.verify._decide import decide_rule, instance_key, is_template
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._rule_report import Options, Report, RuleReport

__all__ = [
    "Options",
    "Report",
    "RuleReport",
    "decide_rule",
    "load_program",
    "shipped_rule_files",
    "verify_analyses",
    "verify_program",
    "verify_rules",
]


def _templates_first(rules: Sequence[Rule]) -> list[int]:
    """Rule indices with the uninterpreted templates first (their proofs then serve the other rules)."""
    return sorted(range(len(rules)), key=lambda i: not is_template(rules[i]))


def _worker(args: tuple[list[Rule], Program, Options]) -> list[RuleReport]:
    rules, program, options = args
    facts = DerivedFacts(program.analyses)
    cache: dict[Any, Any] = {}
    out: dict[int, RuleReport] = {}
    for i in _templates_first(rules):
        out[i] = decide_rule(rules[i], facts, options, cache)
    return [out[i] for i in range(len(rules))]


def verify_program(
    program: Program,
    rules: Sequence[Rule],
    options: Options = Options(),
    progress: Callable[[RuleReport], None] | None = None,
) -> list[RuleReport]:
    """Verify ``rules`` of ``program``, in parallel when ``options.jobs`` allows; results in rule order."""
    jobs = options.jobs or (os.cpu_count() or 1)
    jobs = max(1, min(jobs, len(rules)))
    facts = DerivedFacts(program.analyses)
    if jobs == 1 or len(rules) < 8:
        cache: dict[Any, Any] = {}
        done: dict[int, RuleReport] = {}
        for i in _templates_first(rules):
            report = decide_rule(rules[i], facts, options, cache)
            if progress:
                progress(report)
            done[i] = report
        return [done[i] for i in range(len(rules))]
    # rules that share an enumeration go to the same worker; groups are dealt largest first
    groups: dict[Any, list[int]] = {}
    for i, rule in enumerate(rules):
        groups.setdefault((enumeration_key(rule, facts), instance_key(rule, facts)), []).append(i)
    buckets: list[list[int]] = [[] for _ in range(jobs * 2)]
    for members in sorted(groups.values(), key=len, reverse=True):
        min(buckets, key=len).extend(members)
    results: dict[int, RuleReport] = {}
    # fork is cheap (no re-import) and safe while this process runs no other thread; spawn otherwise
    method = "fork" if "fork" in get_all_start_methods() and threading.active_count() == 1 else "spawn"
    with worker_pool(jobs, get_context(method)) as pool:  # an interrupt stops the workers at once
        futures = [
            (bucket, pool.submit(_worker, ([rules[i] for i in bucket], program, options)))
            for bucket in buckets
            if bucket
        ]
        for bucket, future in futures:
            for i, report in zip(bucket, future.result(), strict=True):
                results[i] = report
                if progress:
                    progress(report)
    return [results[i] for i in range(len(rules))]


def _analysis_worker(args: tuple[AnalysisDecl, Program, tuple[int, ...]]) -> AnalysisOutcome:
    decl, program, sizes = args
    return check_analysis_decl(decl, program.env, DerivedFacts(program.analyses), sizes)


def verify_analyses(
    program: Program,
    decls: Sequence[AnalysisDecl],
    options: Options = Options(),
    progress: Callable[[RuleReport], None] | None = None,
) -> list[RuleReport]:
    """Check each analysis declaration that derives a relation the guards rely on (can-split, perm-map…)
    against that relation's meaning (:mod:`unity_eq.verify._analysis`): one report each, named
    ``analysis <relations>``, refuted with the case where a derived fact is false."""
    jobs = max(1, min(options.jobs or (os.cpu_count() or 1), len(decls)))
    if jobs == 1:
        facts = DerivedFacts(program.analyses)
        outcomes = [check_analysis_decl(decl, program.env, facts, options.sizes) for decl in decls]
    else:
        method = "fork" if "fork" in get_all_start_methods() and threading.active_count() == 1 else "spawn"
        with worker_pool(jobs, get_context(method)) as pool:
            futures = [pool.submit(_analysis_worker, (decl, program, options.sizes)) for decl in decls]
            outcomes = [f.result() for f in futures]
    out = []
    for decl, got in zip(decls, outcomes, strict=True):
        relations = " ".join(dict.fromkeys(_claim_name(c) for c in checked_claims(decl)))
        cex = Counterexample(got.case, "analysis", got.message) if got.status == "refuted" else None
        bounded = BoundedResult(got.status, got.checked, got.checked, got.checked, cex, got.message, got.seconds)
        report = RuleReport(f"analysis {relations}", decl.pos.file, decl.pos.line, got.status, "bounded", got.seconds)
        report.bounded, report.message, report.analysis = bounded, got.message, True
        if got.status == "unknown":
            report.kind = "none"
        out.append(report)
        if progress:
            progress(report)
    return out


def _claim_name(claim: App) -> str:
    """A checked claim's relation, as a report names it (``(= (shape e) s)``: ``shape``)."""
    if claim.head == "=" and isinstance(claim.args[0], App):
        return claim.args[0].head
    return claim.head


def verify_rules(
    paths: Sequence[Path] | None = None,
    names: Sequence[str] = (),
    options: Options = Options(),
    progress: Callable[[RuleReport], None] | None = None,
) -> Report:
    """Load ``paths`` (default: every shipped rule file) and verify their rules (or only ``names``)."""
    start = time.perf_counter()
    program, targets = load_program(paths)
    report = Report(analyses=0, files=sorted(targets), errors=list(program.errors))
    chosen = [r for r in program.rules if r.file in targets]
    declared = [a for a in program.analyses if a.pos.file in targets]
    report.analyses = sum(1 for a in declared if not checked_claims(a))  # the others are checked, as rules
    if not chosen and not declared and not program.errors and paths:
        report.errors.append(
            f"nothing to verify: no rewrite, rule or analysis declaration in {', '.join(sorted(targets))}."
        )
    if names:
        wanted = set(names)
        chosen = [r for r in program.rules if r.name in wanted]
        missing = wanted - {r.name for r in chosen}
        if missing:
            known = ", ".join(sorted(r.name for r in program.rules)[:5])
            report.errors.append(
                f"`--rule`: no rule named {', '.join(sorted(missing))} in the loaded files (e.g. {known}, …)."
            )
    if not program.errors:
        report.rules = verify_program(program, chosen, options, progress)
        if not names and options.bounded:
            decls = [a for a in program.analyses if a.pos.file in targets and checked_claims(a)]
            report.rules += verify_analyses(program, decls, options, progress)
    report.seconds = time.perf_counter() - start
    return report
