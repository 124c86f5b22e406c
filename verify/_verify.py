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

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any

from unity_eq.files import worker_pool
from unity_eq.ops.dtypes import INTEGER_SENSITIVE
from unity_eq.ops.elementwise import INTERPRETED
from unity_eq.ops.registry import OPS
from unity_eq.ops.spec import Family
from unity_eq.rulefile.domain import describe_domain, domain_components, size_readers
from unity_eq.rulefile.load import load_program, shipped_rule_files
from unity_eq.rulefile.parse import Program
from unity_eq.rulefile.terms import AnalysisDecl, App, Rule, Term, walk
from unity_eq.verify._analysis import AnalysisOutcome, check_analysis_decl, checked_claims
from unity_eq.verify._bounded import (
    BoundedResult,
    Counterexample,
    bounded_token,
    enumeration_key,
    prove_bounded,
)
from unity_eq.verify._generic import GenericResult, prove_generic
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._numeric import NumericResult, check_numeric
from unity_eq.verify._types import check_types, describe_dtypes, integer_assignments

__all__ = [
    "Options",
    "Report",
    "RuleReport",
    "load_program",
    "shipped_rule_files",
    "verify_analyses",
    "verify_program",
    "verify_rules",
]


@dataclass(frozen=True)
class Options:
    """How hard to try. ``budget``: at most this many bounded cases per rule (``None``: every case of the
    ranges, the only setting that proves; a budget that stops early makes the rule ``partial``);
    ``cross_check``: when the generic proof holds, the bounded check runs on at most this many cases, the
    smallest first, as a check of the axioms (``None``: every case, as for a rule without a generic proof);
    ``timeout_ms``: z3 per case; ``jobs``: worker processes (0: one per CPU)."""

    generic: bool = True
    bounded: bool = True
    numeric: bool = True
    budget: int | None = None
    cross_check: int | None = 1000
    sizes: tuple[int, ...] = (1, 2, 3, 4)
    timeout_ms: int = 2000
    generic_timeout_ms: int = 500
    numeric_cases: int = 6
    jobs: int = 0


@dataclass
class RuleReport:
    """The verdict on one rule."""

    name: str
    file: str
    line: int
    status: str  # proven | refuted | partial | unknown
    kind: str  # generic | bounded | numeric | none
    seconds: float
    generic: GenericResult | None = None
    bounded: BoundedResult | None = None
    numeric: NumericResult | None = None
    annotation: str | None = None
    message: str = ""
    direction: str = ""
    integer: list[tuple[str, str]] = field(default_factory=list)  # (dtypes, status) of the integer checks
    digest: str = ""
    #: an analysis declaration checked against its relations' meaning (verify._analysis): it derives facts and
    #: rewrites nothing, so it has no certificate entry (the engine guards rewrites only)
    analysis: bool = False
    domain: dict[str, Any] | None = None  # what a bounded proof covered (certificate_entry)
    size_readers: list[str] = field(default_factory=list)  # what reads sizes a domain does not bound

    def certificate_entry(self) -> dict[str, Any] | None:
        """The rule's entry in a proof certificate (unity_eq.rulefile.certificate), or None when nothing
        lets it fire (refuted, or unknown or partial without a reviewed annotation)."""
        if self.status == "proven" and self.kind == "generic":
            return {"digest": self.digest, "proof": "generic"}
        if self.status == "proven" and self.kind == "bounded" and self.domain is not None:
            return {"digest": self.digest, "proof": "bounded", **self.domain}
        if self.ok:
            return {"digest": self.digest, "proof": "accepted", "reason": self.annotation or ""}
        return None

    @property
    def covers(self) -> str:
        """``for all`` (generic), ``within <domain>`` (bounded), or what else lets the rule fire."""
        entry = self.certificate_entry()
        if entry is None or self.analysis:  # an analysis declaration rewrites nothing: no certificate entry
            return ""
        if entry["proof"] == "generic":
            return "for all"
        if entry["proof"] == "bounded":
            sizes = f"; sizes read by: {', '.join(self.size_readers)}" if self.size_readers else ""
            return "within " + describe_domain(entry) + sizes
        return "accepted after review"

    @property
    def ok(self) -> bool:
        return self.status == "proven" or (self.status in ("unknown", "partial") and bool(self.annotation))

    @property
    def counterexample(self) -> Counterexample | None:
        if self.bounded and self.bounded.counterexample:
            return self.bounded.counterexample
        if self.numeric and self.numeric.counterexample and self.numeric.status == "failed":
            return self.numeric.counterexample
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "status": self.status,
            "kind": self.kind,
            "ok": self.ok,
            "seconds": round(self.seconds, 4),
        }
        if self.message:
            out["message"] = self.message
        if self.annotation:
            out["annotation"] = self.annotation
        if self.covers:
            out["covers"] = self.covers
        if self.generic is not None:
            out["generic"] = {
                "status": self.generic.status,
                "premises": self.generic.premises,
                "proven": self.generic.proven,
                "goals": self.generic.goals,
                "reason": self.generic.reason,
                "seconds": round(self.generic.seconds, 4),
            }
        if self.bounded is not None:
            b = self.bounded
            out["bounded"] = {
                "status": b.status,
                "cases_enumerated": b.enumerated,
                "classes": b.classes,
                "cases_checked": b.checked,
                "reason": b.reason,
                "seconds": round(b.seconds, 4),
            }
        if self.numeric is not None:
            out["numeric"] = {
                "status": self.numeric.status,
                "cases": self.numeric.cases,
                "max_relative_error": self.numeric.max_error,
                "float32_evaluations": self.numeric.float32,
                "seconds": round(self.numeric.seconds, 4),
            }
        if self.integer:
            out["integer"] = [{"dtypes": d, "status": st} for d, st in self.integer]
        cex = self.counterexample
        if cex is not None:
            out["counterexample"] = cex.to_json()
        return out


@dataclass
class Report:
    rules: list[RuleReport] = field(default_factory=list)
    analyses: int = 0
    files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.ok for r in self.rules)

    def count(self, status: str) -> int:
        return sum(1 for r in self.rules if r.status == status)

    def median_seconds(self) -> float:
        return statistics.median(r.seconds for r in self.rules) if self.rules else 0.0

    def to_json(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for r in self.rules:
            if r.status == "proven":
                kinds[r.kind] = kinds.get(r.kind, 0) + 1
        return {
            "ok": self.ok,
            "files": self.files,
            "errors": self.errors,
            "rules": [r.to_json() for r in self.rules],
            "summary": {
                "rules": len(self.rules),
                "proven": self.count("proven"),
                "proven_by_kind": kinds,
                "refuted": self.count("refuted"),
                "partial": self.count("partial"),
                "unknown": self.count("unknown"),
                "analysis_declarations": self.analyses,
                "seconds": round(self.seconds, 3),
                "median_seconds_per_rule": round(self.median_seconds(), 4),
                "assumes": "values are reals; inputs are NaN-free and finite (docs/verify.md)",
            },
        }


# ----------------------------------------------------------------------------------------------------------
# Loading


# ----------------------------------------------------------------------------------------------------------
# Instances of a rule over uninterpreted functions

# elementwise ops the verifier models as an uninterpreted scalar function (unity_eq/ops/elementwise.py): a rule proven
# with them holds for every function, so for every elementwise op put in their place
_ELEMENTWISE = (Family.UNARY, Family.BROADCAST)
_INTERPRETED = INTERPRETED


def _elementwise(head: str) -> bool:
    spec = OPS.get(head)
    return spec is not None and spec.family in _ELEMENTWISE


def _uninterpreted(head: str) -> bool:
    return _elementwise(head) and head not in _INTERPRETED


def instance_key(rule: Rule, facts: DerivedFacts) -> Any:
    """Rules with equal keys differ only in which elementwise ops of one argument layout they apply, with
    the same pattern of equal and distinct ops. A rule of the key whose elementwise ops are all
    uninterpreted (Relu, Pow…) and is proven bounded proves every other rule of the key over the same cases:
    each of them is an instance of it (substitute each uninterpreted function by the op in its place; the
    ranges, guards and shapes are the same, since ops of one layout share them).

    The key holds everything the proof depended on besides the rule's text: the analysis declarations that
    mention each of its elementwise ops (renamed by position), since guards read the facts they derive (a
    file that derives a relation for Pow but not for Sub makes a Pow rule's proof say nothing of the Sub
    rule: issue 21)."""
    order: dict[str, int] = {}

    def canon(term: Term) -> Any:
        if isinstance(term, App):
            head: Any = term.head
            if _elementwise(term.head):
                head = (bounded_token(term.head), order.setdefault(term.head, len(order)))
            return (head, tuple(canon(a) for a in term.args))
        return term

    own = rule.name if any(isinstance(t, App) and t.head == "dtype" for g in rule.guards for t in walk(g)) else ""
    # a guard on dtypes may tell ops apart (a comparison yields bool): such a rule is its own class
    key = (canon(rule.lhs), canon(rule.rhs), tuple(canon(g) for g in rule.guards), rule.sorts, own)
    derived = tuple(facts.mentions(head, f"#op{i}") for head, i in sorted(order.items(), key=lambda kv: kv[1]))
    return (*key, derived)


def _is_template(rule: Rule) -> bool:
    heads = [t.head for term in (rule.lhs, rule.rhs, *rule.guards) for t in walk(term) if isinstance(t, App)]
    return any(_elementwise(h) for h in heads) and all(_uninterpreted(h) for h in heads if _elementwise(h))


def _templates_first(rules: Sequence[Rule]) -> list[int]:
    """Rule indices with the uninterpreted templates first (their proofs then serve the other rules)."""
    return sorted(range(len(rules)), key=lambda i: not _is_template(rules[i]))


# ----------------------------------------------------------------------------------------------------------
# Deciding


def _decide(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> RuleReport:
    start = time.perf_counter()
    typed = _type_refutation(rule)
    if typed is not None:
        assert typed.counterexample is not None
        report = RuleReport(rule.name, rule.file, rule.line, "refuted", "types", 0.0, bounded=typed)
        report.message = typed.counterexample.message
        report.seconds = time.perf_counter() - start
        return report
    covered = _integer_generic(rule, facts, options)
    early = _integer_counterexample(rule, facts, options, cache) if options.bounded and not covered else None
    if early is not None:
        report = RuleReport(rule.name, rule.file, rule.line, "refuted", "bounded", 0.0, bounded=early[1])
        cex = early[1].counterexample
        report.message = f"on integer tensors ({early[0]}): " + (cex.message if cex else "refuted")
        report.integer.append((early[0], "refuted"))
        report.seconds = time.perf_counter() - start
        return report
    report = _decide_values(rule, facts, options, cache)
    if options.bounded and report.status != "refuted":
        if covered and report.status == "proven":
            report.integer.append(("integers", "proven (generic, without the axioms of the reals)"))
        else:
            _integer_checks(rule, facts, options, cache, report)
    report.seconds = time.perf_counter() - start
    return report


def _type_refutation(rule: Rule) -> BoundedResult | None:
    """A refutation when the right-hand side is ill-typed for some dtypes the left-hand side accepts
    (verify/_types.py): onnxruntime would refuse the graph the rule builds, whatever the values."""
    check = check_types(rule)
    if not check.problem:
        return None
    cex = Counterexample(
        f"dtypes {describe_dtypes(check.dtypes)}" if check.dtypes else "every dtype", "type", check.problem
    )
    return BoundedResult("refuted", counterexample=cex, reason=check.problem)


def _integer_generic(rule: Rule, facts: DerivedFacts, options: Options) -> bool:
    """Whether a generic proof without the axioms that hold on the reals only covers the rule's integer
    tensors (tried first: it costs a second where a bounded check on integers costs many). It counts only
    when the value proofs prove the rule too (their bounded cases witness the premises)."""
    if not (options.generic and integer_assignments(rule, check_types(rule))):
        return False
    return prove_generic(rule, facts, options.generic_timeout_ms, True, integer=True).proven


def _integer_counterexample(
    rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]
) -> tuple[str, BoundedResult] | None:
    """A counterexample on integer tensors among the smallest cases (as many as the generic proof's cross-check
    takes), looked for before the value proofs: a rule wrong on integers only (a mean of means) is refuted
    without first checking every case over the reals. Rules whose only such op is elementwise (``Div``) are
    left to :func:`_integer_checks`: their proofs over uninterpreted functions usually cover integers."""
    heads = {t.head for term in (rule.lhs, rule.rhs) for t in walk(term) if isinstance(t, App)}
    if all(_elementwise(h) for h in heads & INTEGER_SENSITIVE):
        return None
    budget = options.cross_check or 1000
    timeout_ms = min(options.timeout_ms, _SEARCH_TIMEOUT_MS)
    for dtypes in integer_assignments(rule, check_types(rule))[:_MAX_INTEGER_CHECKS]:
        result = prove_bounded(
            rule, facts, budget=budget, sizes=options.sizes, timeout_ms=timeout_ms, cache=cache, dtypes=dtypes
        )
        if result.status == "refuted":
            return describe_dtypes(dtypes), result
    return None


def _integer_checks(
    rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any], report: RuleReport
) -> None:
    """A rule holding ``Div`` or ``ReduceMean`` that may apply to integer tensors is also checked on every case
    with integer semantics (truncating division), once per integer dtype assignment its left-hand side
    accepts; a rule restricted to floats by a dtype guard has none. The value proofs above are over the
    reals, which integer tensors are not closed under division."""
    assignments = integer_assignments(rule, check_types(rule))
    if not assignments:
        return
    if _integer_by_template(rule, report):
        report.integer.append(("integers", "proven (an instance of the uninterpreted template)"))
        return
    if len(assignments) > _MAX_INTEGER_CHECKS:
        if report.status == "proven":
            report.status = "unknown"
            report.message = (
                f"{len(assignments)} integer dtype assignments to check (more than {_MAX_INTEGER_CHECKS}): "
                "restrict the rule with `(float-dtype (dtype x))` guards"
            )
        return
    for dtypes in assignments:
        result = prove_bounded(
            rule,
            facts,
            budget=options.budget,
            sizes=options.sizes,
            timeout_ms=options.timeout_ms,
            cache=cache,
            dtypes=dtypes,
        )
        shown = describe_dtypes(dtypes)
        report.integer.append((shown, result.status))
        if result.status == "proven":
            continue
        if result.status == "refuted":
            report.status, report.kind, report.bounded = "refuted", "bounded", result
            cex = result.counterexample
            report.message = f"on integer tensors ({shown}): " + (cex.message if cex else "refuted")
            return
        if report.status == "proven":
            report.status = "partial" if result.status == "partial" else "unknown"
            report.message = f"on integer tensors ({shown}): {result.reason or result.status}"


_MAX_INTEGER_CHECKS = 8

#: z3's time per case in the early search for an integer counterexample. The search only refutes (a case z3
#: cannot decide in time is no refutation, and the value proofs and :func:`_integer_checks` still decide the
#: rule with ``Options.timeout_ms``), and z3 rarely proves integer means equal in time (truncating division):
#: at 2 s a case, a mean of means wrong on integers took 509 s to refute at its 253rd case, at 50 ms 27 s (load 7).
_SEARCH_TIMEOUT_MS = 50


def _integer_by_template(rule: Rule, report: RuleReport) -> bool:
    """True when the rule's values were proven as an instance of an uninterpreted template and its only
    integer-sensitive ops are elementwise (``Div``): integer division is a function of its operands too, so
    the template's proof for every function covers it (on integer inputs, a subset of the reals)."""
    heads = {t.head for term in (rule.lhs, rule.rhs) for t in walk(term) if isinstance(t, App)}
    sensitive = heads & INTEGER_SENSITIVE
    by_template = bool(report.bounded and report.bounded.reason.startswith("an instance of"))
    return by_template and report.status == "proven" and all(_elementwise(h) for h in sensitive)


def _decide_values(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> RuleReport:
    start = time.perf_counter()
    bounded, generic = _proofs(rule, facts, options, cache)
    numeric = check_numeric(rule, facts, cases=options.numeric_cases, cache=cache) if options.numeric else None
    report = RuleReport(
        rule.name, rule.file, rule.line, "unknown", "none", 0.0, generic, bounded, numeric, rule.annotation
    )
    report.digest = rule.digest
    generic_ok = bool(generic and generic.proven)
    if bounded and bounded.status == "refuted":
        report.status = "refuted"
        report.kind = "bounded"
        report.message = bounded.counterexample.message if bounded.counterexample else "refuted"
        if generic_ok:
            report.message += " (a generic proof claims the opposite: an axiom of unity_eq.verify is wrong)"
    elif numeric and numeric.status == "failed":
        report.status = "refuted"
        report.kind = "numeric"
        report.message = numeric.counterexample.message if numeric.counterexample else "numeric mismatch"
    elif generic_ok:
        report.status, report.kind = "proven", "generic"
        if not (bounded and bounded.checked):
            report.message = (
                "generic proof only: no bounded case satisfies the guards, so z3 showed the premises (guards "
                "and axioms) satisfiable"
            )
    elif bounded and bounded.status == "proven":
        report.status, report.kind = "proven", "bounded"
        report.domain = _domain(rule, bounded)
        report.size_readers = size_readers(rule)
    elif bounded and bounded.status == "partial":
        report.status, report.kind, report.message = "partial", "bounded", bounded.reason
    else:
        report.kind = "numeric" if numeric and numeric.status == "passed" else "none"
        reasons = [r for r in (bounded.reason if bounded else "", generic.reason if generic else "") if r]
        report.message = "; ".join(reasons) or "no proof found"
    report.seconds = time.perf_counter() - start
    return report


def _domain(rule: Rule, bounded: BoundedResult) -> dict[str, Any]:
    """A bounded proof's domain, as the certificate stores it (rows sorted: a stable file)."""
    components = domain_components(rule)
    rows = sorted(bounded.rows, key=lambda row: json.dumps(row))
    return {
        "components": [list(c) for c in components],
        "rows": [list(row) for row in rows],
        "mesh_sizes": sorted({n for sizes in bounded.mesh_sizes for n in sizes}),
    }


def _proofs(
    rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]
) -> tuple[BoundedResult | None, GenericResult | None]:
    """The bounded and the generic proof of ``rule``.

    A generic proof holds for every shape, so when it succeeds the bounded check is only a check of the
    axioms it rests on: it runs on the first ``options.cross_check`` cases (smallest first) instead of every
    case. Only a rule the generic proof does not prove needs the exhaustive bounded check, the only other
    way to be proven. A generic proof counts only from satisfiable premises: a bounded case that satisfies
    the guards is a model of them (the axioms hold for real tensors); without one, z3 must find a model."""
    if not options.generic:
        return (_bounded(rule, facts, options, cache) if options.bounded else None), None
    cross = options.cross_check
    if not options.bounded or options.budget is not None or cross is None:
        bounded = _bounded(rule, facts, options, cache) if options.bounded else None
        return bounded, prove_generic(rule, facts, options.generic_timeout_ms, bool(bounded and bounded.checked))
    sample = _bounded(rule, facts, replace(options, budget=cross), cache)
    generic = prove_generic(rule, facts, options.generic_timeout_ms, sample.checked > 0)
    if sample.status in ("refuted", "proven"):  # a counterexample, or every case fit in the sample
        return sample, generic
    if generic.proven and sample.status == "partial" and sample.checked > 0:
        checked = f"the generic proof's axioms cross-checked on the first {sample.checked} of {sample.classes} cases"
        return replace(sample, status="cross-checked", reason=checked), generic
    # no generic proof, or a sample that checked nothing or met a z3 timeout: every case decides
    full = _bounded(rule, facts, options, cache)
    if not sample.checked and full.checked:  # a case now witnesses the premises: the generic proof may count
        generic = prove_generic(rule, facts, options.generic_timeout_ms, True)
    return full, generic


def _bounded(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> BoundedResult:
    """The bounded proof, or the proof of an uninterpreted template this rule is an instance of."""
    key = ("template", instance_key(rule, facts), options.budget, options.sizes)
    template = cache.get(key)
    if template is not None and not _is_template(rule):
        name, proof = template
        return replace(proof, reason=f"an instance of {name}, proven bounded with uninterpreted functions", seconds=0.0)
    result = prove_bounded(
        rule, facts, budget=options.budget, sizes=options.sizes, timeout_ms=options.timeout_ms, cache=cache
    )
    if result.status == "proven" and _is_template(rule):
        cache.setdefault(key, (rule.name, result))
    return result


def _worker(args: tuple[list[Rule], Program, Options]) -> list[RuleReport]:
    rules, program, options = args
    facts = DerivedFacts(program.analyses)
    cache: dict[Any, Any] = {}
    out: dict[int, RuleReport] = {}
    for i in _templates_first(rules):
        out[i] = decide_rule(rules[i], facts, options, cache)
    return [out[i] for i in range(len(rules))]


def decide_rule(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> RuleReport:
    """The verdict on ``rule`` (both directions of a birewrite). An exception of the verifier itself on an odd
    rule becomes a failing *unknown* verdict that names it (never accepted by an annotation), so that one
    rule cannot end ``unity-eq verify`` with a traceback and hide the verdicts on the others."""
    try:
        return _decide_both(rule, facts, options, cache)
    except Exception as exc:  # reported as the rule's verdict, with the exception: not swallowed
        message = f"the verifier failed on this rule ({type(exc).__name__}: {exc}): a bug of unity_eq.verify"
        return RuleReport(rule.name, rule.file, rule.line, "unknown", "none", 0.0, message=message)


def _decide_both(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> RuleReport:
    report = _decide(rule, facts, options, cache)
    if rule.bidirectional:
        back = _decide(rule.reversed(), facts, options, cache)
        back.name, back.direction = rule.name, "right to left"
        order = {"refuted": 0, "unknown": 1, "partial": 2, "proven": 3}
        if order[back.status] < order[report.status]:
            back.seconds += report.seconds
            return back
        report.seconds += back.seconds
        if "bounded" in (report.kind, back.kind) and report.status == "proven":
            # a certificate holds one domain per rule: a birewrite proven bounded has none, and does not fire
            report.kind, report.domain = "bounded", None
            report.message = (
                "a birewrite proven bounded has no certificate (one domain per direction): write two rewrites"
            )
    return report


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
        relations = " ".join(dict.fromkeys("shape" if c.head == "=" else c.head for c in checked_claims(decl)))
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
