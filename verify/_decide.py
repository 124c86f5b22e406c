"""The verdict on one rule: types, the generic, bounded and numeric proofs combined (the rules are stated in
:mod:`unity_eq.verify._verify`), and the instances of a rule over uninterpreted functions that share a proof."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import replace
from typing import Any

import z3

from unity_eq.ops.dtypes import INTEGER_SENSITIVE
from unity_eq.ops.elementwise import INTERPRETED
from unity_eq.ops.registry import OPS
from unity_eq.ops.spec import Family
from unity_eq.rulefile.domain import domain_components, size_readers
from unity_eq.rulefile.terms import App, Rule, Term, walk
from unity_eq.verify._bounded import (
    BoundedResult,
    Counterexample,
    bounded_token,
    prove_bounded,
)
from unity_eq.verify._float32_exact import refute_in_float32
from unity_eq.verify._generic import GenericResult, prove_generic
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._numeric import check_numeric
from unity_eq.verify._rule_report import Options, RuleReport
from unity_eq.verify._sizes import refute_by_sweep
from unity_eq.verify._types import check_types, describe_dtypes, integer_assignments

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


def is_template(rule: Rule) -> bool:
    heads = [t.head for term in (rule.lhs, rule.rhs, *rule.guards) for t in walk(term) if isinstance(t, App)]
    return any(_elementwise(h) for h in heads) and all(_uninterpreted(h) for h in heads if _elementwise(h))


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
    """A counterexample on integer tensors among the smallest case of each signature (as many as the generic
    proof's cross-check takes, at most 1000), looked for before the value proofs: a rule wrong on integers
    only (a mean of means) is refuted without first checking every case over the reals. Rules whose only such
    op is elementwise (``Div``) are left to :func:`_integer_checks`: their proofs over uninterpreted
    functions usually cover integers."""
    heads = {t.head for term in (rule.lhs, rule.rhs) for t in walk(term) if isinstance(t, App)}
    if all(_elementwise(h) for h in heads & INTEGER_SENSITIVE):
        return None
    budget = min(options.cross_check or _INTEGER_SEARCH_CASES, _INTEGER_SEARCH_CASES)  # a quick search only
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
#: signatures the early integer search takes at most (``_integer_checks`` then checks every case)
_INTEGER_SEARCH_CASES = 1000

#: z3's time per case in the early search for an integer counterexample. The search only refutes (a case z3
#: cannot decide in time is no refutation, and the value proofs and :func:`_integer_checks` still decide the
#: rule with ``Options.timeout_ms``), and z3 rarely proves integer means equal in time (truncating division):
#: at 2 s a case, a mean of means wrong on integers took 509 s to refute at its 253rd case, at 50 ms 27 s.
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
        if options.numeric:
            refute_by_sweep(rule, facts, cache, report)
    elif bounded and bounded.status == "partial":
        report.status, report.kind, report.message = "partial", "bounded", bounded.reason
    else:
        report.kind = "numeric" if numeric and numeric.status == "passed" else "none"
        reasons = [r for r in (bounded.reason if bounded else "", generic.reason if generic else "") if r]
        report.message = "; ".join(reasons) or "no proof found"
    if report.status == "proven":
        refute_in_float32(rule, report)
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
    axioms it rests on: it runs on the smallest case of each signature (every rank, attribute value, size-1
    and divisibility pattern; at most ``options.cross_check`` of them, every primary class once) instead of
    every case. Only a rule the generic proof does not prove needs the exhaustive bounded check, the only other
    way to be proven. A generic proof counts only from satisfiable premises: a bounded case that satisfies
    the guards is a model of them (the axioms hold for real tensors); without one, z3 must find a model."""
    if not options.generic:
        return (_bounded(rule, facts, options, cache) if options.bounded else None), None
    cross = options.cross_check
    if not options.bounded or options.budget is not None or cross is None:
        bounded = _bounded(rule, facts, options, cache) if options.bounded else None
        return bounded, prove_generic(rule, facts, options.generic_timeout_ms, bool(bounded and bounded.checked))
    timeout = options.generic_timeout_ms
    # first as if a bounded case witnessed the premises (a proof that fails so fails without that too); a rule
    # without a generic proof then goes straight to every case, with no sample checked twice
    generic = prove_generic(rule, facts, timeout, True)
    if generic.proven:
        sample = _bounded(rule, facts, replace(options, budget=cross), cache)
        # a counterexample, or every case fit in the sample (a proven check has checked a case: _no_case)
        if sample.status in ("refuted", "proven"):
            return sample, generic
        if sample.status == "partial" and sample.checked > 0:
            checked = (
                f"the generic proof's axioms cross-checked on {sample.checked} of {sample.classes} cases"
                " (the smallest of each signature)"
            )
            return replace(sample, status="cross-checked", reason=checked), generic
    # no generic proof, or a sample that checked nothing or met a z3 timeout: every case decides (and a case
    # outside the sample may be the witness of the premises)
    full = _bounded(rule, facts, options, cache)
    if generic.proven and not full.checked:  # no case witnesses the premises: z3 must find a model
        generic = prove_generic(rule, facts, timeout, False)
    return full, generic


def _bounded(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> BoundedResult:
    """The bounded proof, or the proof of an uninterpreted template this rule is an instance of."""
    key = ("template", instance_key(rule, facts), options.budget, options.sizes)
    template = cache.get(key)
    if template is not None and not is_template(rule):
        name, proof = template
        return replace(proof, reason=f"an instance of {name}, proven bounded with uninterpreted functions", seconds=0.0)
    result = prove_bounded(
        rule, facts, budget=options.budget, sizes=options.sizes, timeout_ms=options.timeout_ms, cache=cache
    )
    if result.status == "proven" and is_template(rule):
        cache.setdefault(key, (rule.name, result))
    return result


def decide_rule(rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any]) -> RuleReport:
    """The verdict on ``rule`` (both directions of a birewrite). An exception of the verifier itself on an odd
    rule becomes a failing *unknown* verdict that names it (never accepted by an annotation), so that one
    rule cannot end ``unity-eq verify`` with a traceback and hide the verdicts on the others."""
    try:
        return _decide_both(rule, facts, options, cache)
    except (MemoryError, z3.Z3Exception) as exc:  # the memory cap of a verify run (verify/_memory.py)
        if not isinstance(exc, MemoryError) and "out of memory" not in str(exc):
            message = f"the verifier failed on this rule (Z3Exception: {exc}): a bug of unity_eq.verify"
            return RuleReport(rule.name, rule.file, rule.line, "unknown", "none", 0.0, message=message)
    except Exception as exc:  # reported as the rule's verdict, with the exception: not swallowed
        message = f"the verifier failed on this rule ({type(exc).__name__}: {exc}): a bug of unity_eq.verify"
        return RuleReport(rule.name, rule.file, rule.line, "unknown", "none", 0.0, message=message)
    # out of memory: built here, out of the handler, once the exception's frames (and the cases they held) are
    # released; building it inside could run out of memory again
    cache.clear()
    gc.collect()
    message = (
        "ran out of memory enumerating its cases (the verify process's cap: 80 % of the memory available "
        "over --jobs): its left-hand side nests more ops than a bounded check can enumerate; split it into "
        "smaller rules, or give it guards that fix its shapes"
    )
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
