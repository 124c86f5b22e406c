"""``unity-eq generate-rules``: enumerate, fingerprint, prove, prune and write rewrite rules (TASO's generator,
with the parallel ops of a PCG in the operator set).

Phases (each timed in the report):

1. **enumerate** (:mod:`unity_eq.verify._enumerate`): every term of up to ``max_size`` operators over the
   operator set and a few input tensors, built over fingerprint-class representatives; a term whose exact
   fingerprint (shape, placement, global value on random inputs) is known is an equation with that class's
   representative. Two-output graphs are both outputs of one ``Split`` against pairs of representatives that
   share an input: that is how the merge of two MatMuls into one over concatenated weights appears.
2. **candidates**: each equation, oriented (below), becomes a candidate rule with drafts from the most general
   to the most guarded (:mod:`unity_eq.verify._generalize`); drafts equal up to renaming are one candidate.
3. **prune** (:mod:`unity_eq.verify._prune`), smallest candidates first: a candidate whose two sides the rules
   accepted so far already connect (egglog, on its concrete case) follows from smaller rules.
4. **prove** (:mod:`unity_eq.verify._verify`, the same prover as ``unity-eq verify``): the first draft that is
   proven is the rule; a candidate with no proven draft is refuted (or unknown).
5. **write**: accepted rules that the hand-written core rules (and smaller generated ones) already derive are
   *rediscovered* and go to ``core-equivalent.egg`` (verified, not loaded by ``optimize``); the others to
   ``shrinking.egg`` and ``merge.egg`` (loaded by ``optimize``), ``algebra.egg``, ``parallel.egg`` and
   ``growing.egg`` (verified, loaded with ``--rules``), with the report.

Orientation: ``lhs → rhs`` needs every right-hand side input bound by the left-hand side, and a left-hand side
whose placement its own structure determines. Between terms without parallel ops (**algebra**) both
directions are candidates, except reorderings of a single operator (commutativity, associativity: DESIGN.md
forbids raw commutativity rules). From a term without parallel ops to one with them (**strategy**), the
right-hand side must end in one collective. Between parallel forms (**redistribution**), the right-hand side
must have fewer collectives (then fewer parallel ops, then fewer ops); the reverse of a strategy is not kept.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any

from unity_eq.errors import OptionError
from unity_eq.files import worker_pool
from unity_eq.rulefile.manifest import BASE_FILES, CORE_RULE_FILES, rules_dir
from unity_eq.rulefile.parse import Program, RuleSource, parse_program
from unity_eq.rulefile.terms import Rule
from unity_eq.verify._bounded import BoundedResult, prove_bounded
from unity_eq.verify._candidates import build_candidates
from unity_eq.verify._enumerate import (
    DEFAULT_INPUTS,
    DEFAULT_OPS,
    InputSpec,
    check_ops,
    enumerate_terms,
)
from unity_eq.verify._generalize import RuleCandidate, rule_name
from unity_eq.verify._generate_report import (
    OUTPUT_FILES,
    GeneratedRule,
    GenerateReport,
    render_report,
    write_report,
    write_rules,
)
from unity_eq.verify._generic import prove_generic
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._numeric import check_numeric
from unity_eq.verify._prune import Pruner
from unity_eq.verify._rediscover import constructors, rediscoveries
from unity_eq.verify._verify import Options, decide_rule

__all__ = ["GenerateReport", "GeneratedRule", "check_ops", "generate_rules", "render_report"]

# ----------------------------------------------------------------------------------------------------------
# Proving (in worker processes)


@dataclass
class _Base:
    program: Program
    facts: DerivedFacts


_BASE: _Base | None = None


def _base_sources() -> list[RuleSource]:
    root = rules_dir()
    names = [*BASE_FILES, *CORE_RULE_FILES]
    return [RuleSource(name, (root / name).read_text(encoding="utf-8")) for name in names]


def _base() -> _Base:
    global _BASE
    if _BASE is None:
        program = parse_program([], _base_sources())
        _BASE = _Base(program, DerivedFacts(program.analyses))
    return _BASE


def parse_one(text: str) -> tuple[Rule | None, str]:
    base = _base()
    program = parse_program([RuleSource("<generated>", text)], (), env=base.program.env)
    if program.errors or not program.rules:
        return None, "; ".join(program.errors) or "no rule"
    return program.rules[0], ""


@dataclass
class _Outcome:
    status: str  # proven | refuted | unknown
    draft: int = -1
    message: str = ""
    seconds: float = 0.0


def _prove(job: tuple[list[tuple[str, str]], Options]) -> _Outcome:
    drafts, options = job
    base = _base()
    start = time.perf_counter()
    cache: dict[Any, Any] = {}
    instances: dict[Any, Any] = {}  # the drafts of one candidate share their left-hand sides
    status, message = "refuted", ""
    for i, (_name, text) in enumerate(drafts):
        rule, error = parse_one(text)
        if rule is None:
            status, message = "unknown", f"does not load: {error}"
            continue
        try:
            if rule.bidirectional or not options.generic or not options.bounded or options.budget is not None:
                report = decide_rule(rule, base.facts, options, cache)
                verdict, why = report.status, report.message
            else:
                verdict, why = decide_draft(rule, base.facts, options, cache, instances)
        except Exception as exc:  # a prover bug on one draft must not end the run: report it
            status, message = "unknown", f"the prover failed: {type(exc).__name__}: {exc}"
            continue
        if verdict == "proven":
            return _Outcome("proven", i, "", time.perf_counter() - start)
        if verdict == "unknown" and status != "refuted":
            status = "unknown"
        message = why
    return _Outcome(status, -1, message, time.perf_counter() - start)


def decide_draft(
    rule: Rule, facts: DerivedFacts, options: Options, cache: dict[Any, Any], instances: dict[Any, Any]
) -> tuple[str, str]:
    """The status ``unity-eq verify`` gives ``rule`` under ``options`` (generic proof, cross-check on the
    smallest case of each signature, at most ``options.cross_check`` of them, every case without a generic
    proof, numeric back-up; see
    :func:`unity_eq.verify._verify._proofs`), and its message, decided in the cheapest order:

    * the generic proof first (z3, fast). When it fails, the decision is the exhaustive bounded check
      (refuted when some case refutes, unknown when some case is, else proven), whatever the order of the
      cases: they are checked as they are generated (lazily), so a refuted draft stops at its first
      counterexample instead of enumerating every case first.
    * When it holds (from premises a bounded case witnesses), the cross-check sample is exactly verify's:
      the smallest case of each signature, at most ``cross_check`` of them.
    * The numeric back-up runs only on a draft the proofs do not refute (it can only refute).

    Never weaker than verify: a draft this calls proven, verify proves. Not always as strong on failure:
    a draft is refuted by a case outside verify's sample too (verify would then report the generic proof's
    axioms as wrong)."""
    timeout = options.generic_timeout_ms
    generic = prove_generic(rule, facts, timeout, True)  # witnessed by a bounded case: confirmed below
    cross = options.cross_check
    bounded: BoundedResult | None = None
    if generic.proven and cross is not None:
        sample = prove_bounded(
            rule,
            facts,
            budget=cross,
            sizes=options.sizes,
            timeout_ms=options.timeout_ms,
            cache=cache,
            instances=instances,
        )
        if sample.status in ("refuted", "proven") or (sample.status == "partial" and sample.checked > 0):
            bounded = sample
    if bounded is None:  # no generic proof, or a sample that decides nothing: every case decides
        bounded = prove_bounded(
            rule, facts, sizes=options.sizes, timeout_ms=options.timeout_ms, lazy=True, instances=instances
        )
        if generic.proven and not bounded.checked:  # no case witnesses the premises: z3 must find a model
            generic = prove_generic(rule, facts, timeout, False)
    if bounded.status == "refuted":
        return "refuted", bounded.counterexample.message if bounded.counterexample else "refuted"
    if not (generic.proven or bounded.status == "proven"):
        reasons = [r for r in (bounded.reason, generic.reason) if r]
        return ("partial" if bounded.status == "partial" else "unknown"), "; ".join(reasons) or "no proof found"
    if options.numeric:
        numeric = check_numeric(rule, facts, cases=options.numeric_cases, cache=cache)
        if numeric.status == "failed":
            return "refuted", numeric.counterexample.message if numeric.counterexample else "numeric mismatch"
    return "proven", ""


def _prove_all(
    jobs: list[list[tuple[str, str]]], options: Options, workers: int, tick: Callable[[], None]
) -> list[_Outcome]:
    if workers <= 1 or len(jobs) < 4:
        out = []
        for job in jobs:
            out.append(_prove((job, options)))
            tick()
        return out
    _base()  # parsed once here, inherited by forked workers
    method = "fork" if "fork" in get_all_start_methods() and threading.active_count() == 1 else "spawn"
    with worker_pool(workers, get_context(method)) as pool:  # an interrupt stops the workers at once
        futures = [pool.submit(_prove, (job, options)) for job in jobs]
        results = []
        for future in futures:
            results.append(future.result())
            tick()
        return results


def core_rules() -> list[Rule]:
    """The hand-written rewrites of the manifest (what the generator should rediscover)."""
    base = _base()
    return [r for r in base.program.rules if r.file in CORE_RULE_FILES]


# ----------------------------------------------------------------------------------------------------------
# The generator


def generate_rules(
    ops: Sequence[str] = DEFAULT_OPS,
    max_size: int = 3,
    out_dir: Path | None = None,
    jobs: int = 0,
    seed: int = 0,
    inputs: Sequence[InputSpec] = DEFAULT_INPUTS,
    options: Options | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> GenerateReport:
    """Generate, prove and prune rules; write them (and the report) to ``out_dir`` when given."""
    ops = check_ops(ops)
    if max_size < 1:
        raise OptionError(f"`--max-size`: expected 1 or more, got {max_size}.")
    options = options or Options(jobs=1)  # decided as `unity-eq verify` decides by default
    workers = jobs or (os.cpu_count() or 1)
    report = GenerateReport(
        list(ops),
        max_size,
        workers,
        [{"name": s.name, "shape": list(s.shape), "kind": s.kind, "dim": s.dim} for s in inputs],
    )
    say = progress or (lambda _phase, _done, _total: None)
    total_start = time.perf_counter()

    start = time.perf_counter()
    enum = enumerate_terms(ops, max_size, inputs, seed, progress=lambda k, new, n: say("enumerate", k, max_size))
    report.phases["enumerate"] = time.perf_counter() - start
    report.counts.update(
        terms_evaluated=enum.evaluated,
        terms_invalid=enum.invalid,
        classes=len(enum.reps),
        equations=len(enum.equations),
    )

    start = time.perf_counter()
    skipped: dict[str, int] = {}
    candidates = build_candidates(enum, skipped)
    report.counts["candidates"] = len(candidates)
    report.pruned.update(skipped)
    unique: dict[str, RuleCandidate] = {}
    renamings = 0
    for cand in sorted(candidates, key=lambda c: (c.size, len(c.drafts[0].key))):
        key = cand.drafts[0].key
        if key in unique:
            renamings += 1
        else:
            unique[key] = cand
    report.pruned["renaming"] = renamings
    report.phases["candidates"] = time.perf_counter() - start

    base_texts = [(src.text, src.display) for src in _base_sources()[: len(BASE_FILES)]]
    pruner = Pruner(base_texts, inputs)
    tiers: dict[int, list[RuleCandidate]] = {}
    for cand in unique.values():
        tiers.setdefault(cand.size, []).append(cand)
    accepted: list[tuple[RuleCandidate, GeneratedRule]] = []
    derivable = 0
    prune_s = prove_s = 0.0
    done, total = 0, len(unique)
    for size in sorted(tiers):
        start = time.perf_counter()
        todo = []
        for cand in tiers[size]:
            if pruner.derivable(cand.lhs, cand.rhs):
                derivable += 1
                done += 1
            else:
                todo.append(cand)
        prune_s += time.perf_counter() - start
        say("rules", done, total)
        start = time.perf_counter()
        named = [[(rule_name(c, d.key), d.with_name(rule_name(c, d.key))) for d in c.drafts] for c in todo]

        def tick() -> None:
            nonlocal done
            done += 1
            say("rules", done, total)

        outcomes = _prove_all(named, options, workers, tick)
        prove_s += time.perf_counter() - start
        start = time.perf_counter()
        for cand, names, outcome in zip(todo, named, outcomes, strict=True):
            if outcome.status != "proven":
                report.refuted.append(
                    {
                        "status": outcome.status,
                        "rule": names[-1][1],
                        "reason": outcome.message[:300],
                    }
                )
                continue
            name, text = names[outcome.draft]
            d = cand.drafts[outcome.draft]
            rule = GeneratedRule(name, cand.kind, d.ruleset, cand.size, text, d.level, d.mode, ops=cand.ops)
            rule.seconds = outcome.seconds
            if pruner.derivable(cand.lhs, cand.rhs):  # a rule of this tier, accepted meanwhile, covers it
                derivable += 1
                continue
            pruner.accept(text)
            accepted.append((cand, rule))
        prune_s += time.perf_counter() - start
    report.pruned["derivable from smaller rules"] = derivable
    report.phases["prune"] = prune_s
    report.phases["prove"] = prove_s
    report.counts["proven"] = len(accepted)
    report.counts["refuted"] = sum(1 for r in report.refuted if r["status"] == "refuted")
    report.counts["unknown"] = sum(1 for r in report.refuted if r["status"] == "unknown")

    start = time.perf_counter()
    _classify(accepted, inputs, report)
    report.phases["classify"] = time.perf_counter() - start
    if out_dir is not None:
        start = time.perf_counter()
        write_rules(report, out_dir)
        report.phases["write"] = time.perf_counter() - start
    report.phases["total"] = time.perf_counter() - total_start
    if out_dir is not None:
        write_report(report, out_dir)
    return report


def _classify(
    accepted: list[tuple[RuleCandidate, GeneratedRule]], inputs: Sequence[InputSpec], report: GenerateReport
) -> None:
    """Rediscovered core rules; which accepted rules the core rules (with smaller generated ones) derive."""
    core = core_rules()
    parsed = []
    for _cand, rule in accepted:
        got, _error = parse_one(rule.text)
        if got is not None:
            parsed.append((rule.name, got))
    found = rediscoveries(parsed, core)
    by_name = {rule.name: rule for _c, rule in accepted}
    for core_name, names in found.items():
        report.rediscovered[core_name] = names[0]
        for name in names:
            by_name[name].rediscovers.append(core_name)
    allowed = set(report.ops) | {"TCons", "TNil", "PList", "NoneT"}
    relevant = [c for c in core if constructors(c) <= allowed]
    report.counts["core_rules_over_ops"] = len(relevant)
    report.not_rediscovered = [c.name for c in relevant if c.name not in found]
    root = rules_dir()
    base = [(root / name).read_text(encoding="utf-8") for name in BASE_FILES]
    core_texts = [(root / name).read_text(encoding="utf-8") for name in CORE_RULE_FILES]
    pruner = Pruner([*zip(base, BASE_FILES, strict=True), *zip(core_texts, CORE_RULE_FILES, strict=True)], inputs)
    pruner.accepted = 1  # the core rules count as accepted
    for cand, rule in accepted:
        rule.core_derivable = bool(rule.rediscovers) or pruner.derivable(cand.lhs, cand.rhs)
        if rule.core_derivable:
            rule.file = OUTPUT_FILES["core-equivalent"]
        elif cand.kind == "algebra" and cand.growing:
            rule.file = OUTPUT_FILES["growing"]  # would grow the e-graph at every application: not loaded
        elif cand.kind == "algebra" and cand.rhs_size < cand.lhs_size:
            pruner.accept(rule.text)
            rule.file = OUTPUT_FILES["shrinking"]  # fewer operators: cannot loop, loaded by `optimize`
        else:
            pruner.accept(rule.text)
            rule.file = OUTPUT_FILES["merge" if cand.kind == "multi" else rule.ruleset]
        report.rules.append(rule)
