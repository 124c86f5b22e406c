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

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any

from unity_eq.errors import OptionError
from unity_eq.files import worker_pool
from unity_eq.rulefile.manifest import BASE_FILES, CORE_RULE_FILES, rules_dir
from unity_eq.rulefile.parse import Program, RuleSource, parse_program
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var
from unity_eq.verify._bounded import BoundedResult, prove_bounded
from unity_eq.verify._enumerate import (
    DEFAULT_INPUTS,
    DEFAULT_OPS,
    PARALLEL_OPS,
    SUPPORTED_OPS,
    Enumeration,
    Evaluator,
    InputSpec,
    TermInfo,
    enumerate_terms,
    is_variant,
    list_items,
)
from unity_eq.verify._generalize import ATTEMPTS, RuleCandidate, draft, rule_name
from unity_eq.verify._generic import prove_generic
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._numeric import check_numeric
from unity_eq.verify._prune import Pruner
from unity_eq.verify._verify import Options, decide_rule

__all__ = ["GenerateReport", "GeneratedRule", "check_ops", "generate_rules", "render_report"]

#: the files ``generate-rules`` writes; ``optimize`` loads ``shrinking.egg`` by default (see
#: unity_eq.rulefile.manifest.GENERATED_DEFAULT_FILES), ``unity-eq verify`` checks them all
OUTPUT_FILES = {
    "shrinking": "shrinking.egg",
    "algebra": "algebra.egg",
    "parallel": "parallel.egg",
    "merge": "merge.egg",
    "core-equivalent": "core-equivalent.egg",
    "growing": "growing.egg",
}


@dataclass
class GeneratedRule:
    name: str
    kind: str  # algebra | strategy | redistribution | multi
    ruleset: str
    size: int
    text: str
    level: int
    mode: str
    file: str = ""
    ops: list[str] = field(default_factory=list)
    rediscovers: list[str] = field(default_factory=list)  # core rules it equals or specializes
    core_derivable: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "kind": self.kind,
            "ruleset": self.ruleset,
            "size": self.size,
            "ops": self.ops,
            "guard_level": self.level,
            "generality": self.mode,
            "rediscovers": self.rediscovers,
            "derivable_from_core": self.core_derivable,
            "prove_seconds": round(self.seconds, 3),
            "text": self.text,
        }


@dataclass
class GenerateReport:
    ops: list[str]
    max_size: int
    jobs: int
    inputs: list[dict[str, Any]]
    counts: dict[str, Any] = field(default_factory=dict)
    pruned: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    rules: list[GeneratedRule] = field(default_factory=list)
    refuted: list[dict[str, str]] = field(default_factory=list)
    rediscovered: dict[str, str] = field(default_factory=dict)  # core rule -> generated rule
    not_rediscovered: list[str] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)

    def rules_per_operator(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rule in self.rules:
            for op in rule.ops:
                out[op] = out.get(op, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_json(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for rule in self.rules:
            kinds[rule.kind] = kinds.get(rule.kind, 0) + 1
        return {
            "ops": self.ops,
            "max_size": self.max_size,
            "jobs": self.jobs,
            "inputs": self.inputs,
            "counts": self.counts,
            "pruned": self.pruned,
            "phases_seconds": {k: round(v, 3) for k, v in self.phases.items()},
            "rules_per_operator": self.rules_per_operator(),
            "rules_per_kind": kinds,
            "files": self.files,
            "rediscovered": self.rediscovered,
            "not_rediscovered": self.not_rediscovered,
            "rules": [r.to_json() for r in self.rules],
            "refuted": self.refuted,
        }


# ----------------------------------------------------------------------------------------------------------
# Candidates


def _walk(term: Term) -> Any:
    yield term
    if isinstance(term, App):
        for a in term.args:
            yield from _walk(a)


def _parallel_count(term: Term) -> int:
    return sum(1 for t in _walk(term) if isinstance(t, App) and t.head in PARALLEL_OPS)


def _collectives(term: Term) -> int:
    return sum(1 for t in _walk(term) if isinstance(t, App) and t.head in ("Combine", "Reduce"))


def _potential(term: Term, size: int) -> tuple[int, int, int, int]:
    """What a redistribution rule decreases: collectives, then their depth (collectives move toward the
    outputs, where the next Partition cancels them), then parallel ops, then operators."""
    depth = 0
    stack: list[tuple[Term, int]] = [(term, 0)]
    while stack:
        t, level = stack.pop()
        if isinstance(t, App):
            if t.head in ("Combine", "Reduce"):
                depth += level
            stack.extend((a, level + 1) for a in t.args)
    return (_collectives(term), depth, _parallel_count(term), size)


def _op_heads(term: Term) -> list[str]:
    return [
        t.head
        for t in _walk(term)
        if isinstance(t, App) and t.head not in ("TCons", "TNil", "NoneT") and not is_variant(t)
    ]


def _leaves(term: Term) -> list[str]:
    return sorted(t.name for t in _walk(term) if isinstance(t, Var))


def _is_reordering(a: Term, b: Term) -> bool:
    """Both sides one operator only, over the same inputs: commutativity or associativity."""
    heads = set(_op_heads(a)) | set(_op_heads(b))
    return len(heads) == 1 and _leaves(a) == _leaves(b) and sorted(_op_heads(a)) == sorted(_op_heads(b))


def _has_sharded_input(term: Term, inputs: dict[str, InputSpec]) -> bool:
    return any(isinstance(t, Var) and inputs[t.name].kind != "R" for t in _walk(term))


def _reverse_strategy(a: Term, b: Term, inputs: dict[str, InputSpec]) -> bool:
    """``a`` is a strategy's right-hand side for ``b`` (a collective over a core of input slices)."""
    if _parallel_count(b) or _has_sharded_input(a, inputs):
        return False
    if not (isinstance(a, App) and a.head in ("Combine", "Reduce")):
        return False
    inner = [t for t in _walk(a) if isinstance(t, App) and t.head in PARALLEL_OPS and t is not a]
    return all(is_variant(t) for t in inner)


def _orient(a: TermInfo, b: TermInfo, inputs: dict[str, InputSpec], skipped: dict[str, int]) -> RuleCandidate | None:
    """The candidate ``a → b``, or None (counted in ``skipped`` by reason)."""
    if a.size == 0 or a.core:
        return None
    if not b.vars <= a.vars:
        skipped["unbound right-hand side"] = skipped.get("unbound right-hand side", 0) + 1
        return None
    ta, tb = a.term, b.term
    pa, pb = _parallel_count(ta), _parallel_count(tb)
    size = a.size + b.size
    if pa == 0 and pb == 0:
        if _is_reordering(ta, tb):
            skipped["reordering"] = skipped.get("reordering", 0) + 1
            return None
        return RuleCandidate((ta,), (tb,), "algebra", size, lhs_size=a.size, rhs_size=b.size)
    if pa == 0:
        if isinstance(tb, App) and tb.head in ("Combine", "Reduce") and _collectives(tb) == 1:
            return RuleCandidate((ta,), (tb,), "strategy", size, lhs_size=a.size, rhs_size=b.size)
        skipped["direction"] = skipped.get("direction", 0) + 1
        return None
    if _potential(tb, b.size) < _potential(ta, a.size) and not _reverse_strategy(ta, tb, inputs):
        return RuleCandidate((ta,), (tb,), "redistribution", size, lhs_size=a.size, rhs_size=b.size)
    skipped["direction"] = skipped.get("direction", 0) + 1
    return None


def _multi(enum: Enumeration, t: TermInfo, rep: TermInfo) -> RuleCandidate | None:
    """Both outputs of ``t = Split(M, sizes, axis, i)`` against the representatives they equal."""
    term = t.term
    if not (isinstance(term, App) and term.head == "Split") or t.vars <= rep.vars:
        return None
    ev = enum.evaluator
    assert ev is not None
    sizes = term.args[1].value
    index = int(term.args[3].value)
    if len(sizes) != 2:
        return None
    sibling = App("Split", (*term.args[:3], Lit(1 - index, "i64")))
    info = ev.info(sibling)
    if info is None:
        return None
    other = enum.classes.get(info.fingerprint)
    if other is None or other is rep or other.core or rep.core or rep.size == 0 or other.size == 0:
        return None
    if not (t.vars | info.vars) <= (rep.vars | other.vars) or not rep.vars & other.vars:
        return None
    lhs_nodes = rep.nodes | other.nodes
    if len(lhs_nodes) > enum.max_size:
        return None
    roots = [(rep, t), (other, info)]
    if index == 1:
        roots.reverse()
    return RuleCandidate(
        tuple(r.term for r, _ in roots),
        tuple(s.term for _, s in roots),
        "multi",
        len(lhs_nodes) + t.size,
        lhs_size=len(lhs_nodes),
        rhs_size=t.size,
    )


def _strategies(enum: Enumeration, inputs: dict[str, InputSpec]) -> dict[Term, list[Term]]:
    """Operator over inputs → the strategy terms (one collective over a core of input slices) it equals."""
    out: dict[Term, list[Term]] = {}
    for t, rep in enum.equations:
        cand = _orient(rep, t, inputs, {})
        if cand is not None and cand.kind == "strategy":
            out.setdefault(rep.term, []).append(t.term)
    return out


def _parallel_forms(enum: Enumeration, multi: RuleCandidate, strategies: dict[Term, list[Term]]) -> list[RuleCandidate]:
    """The merge ``op(x, w), op(x, v) → Split(op(x, Concat(w, v)))`` under each parallel strategy of ``op``:
    both roots and the merged op take the same strategy (rows, columns, the contracted dim: one collective
    for both outputs where the roots need two). A form whose pieces do not divide is not valid and skipped;
    one whose roots and outputs do not fingerprint equal is not kept."""
    ev = enum.evaluator
    assert ev is not None
    r0, r1 = multi.lhs
    s0 = multi.rhs[0]
    if not (isinstance(r0, App) and isinstance(r1, App) and isinstance(s0, App) and s0.head == "Split"):
        return []
    merged = s0.args[0]
    if not (isinstance(merged, App) and merged.head == r0.head == r1.head and len(r0.args) == 2):
        return []
    if r0.args[0] != r1.args[0] or merged.args[0] != r0.args[0]:
        return []  # only the merge over a shared first operand
    w, v, c = r0.args[1], r1.args[1], merged.args[1]
    if not (isinstance(w, Var) and isinstance(v, Var)):
        return []
    out = []
    for strategy in strategies.get(r0, []):
        lhs = (strategy, _replace(strategy, w, v))
        inner = _replace(strategy, w, c)
        rhs = tuple(App("Split", (inner, *s.args[1:])) for s in multi.rhs if isinstance(s, App))
        infos = [ev.info(t) for t in (*lhs, *rhs)]
        if any(i is None for i in infos):
            continue
        l0, l1, o0, o1 = infos
        assert l0 is not None and l1 is not None and o0 is not None and o1 is not None
        if l0.fingerprint != o0.fingerprint or l1.fingerprint != o1.fingerprint:
            continue
        lhs_size, rhs_size = len(l0.nodes | l1.nodes), len(o0.nodes | o1.nodes)
        out.append(RuleCandidate(lhs, rhs, "multi", lhs_size + rhs_size, lhs_size=lhs_size, rhs_size=rhs_size))
    return out


def build_candidates(enum: Enumeration, skipped: dict[str, int]) -> list[RuleCandidate]:
    inputs = {spec.name: spec for spec in enum.inputs}
    ev = enum.evaluator
    assert ev is not None
    out: list[RuleCandidate] = []
    strategies = _strategies(enum, inputs)
    for t, rep in enum.equations:
        for a, b in ((t, rep), (rep, t)):
            cand = _orient(a, b, inputs, skipped)
            if cand is not None:
                out.append(cand)
        multi = _multi(enum, t, rep)
        if multi is not None:
            out.append(multi)
            out.extend(_parallel_forms(enum, multi, strategies))
    kept = []
    for cand in out:
        forms = [(cand.lhs, cand.rhs)]
        if len(cand.lhs) == 1:
            general = _abstract_opaque(cand.lhs, cand.rhs, ev, inputs)
            if general is not None:
                if len(general[0]) == 1 and _is_reordering(general[0][0], general[1][0]):
                    skipped["reordering"] = skipped.get("reordering", 0) + 1
                    continue
                forms.insert(0, general)
        for lhs, rhs in forms:
            for mode, level in ATTEMPTS:
                d = draft(lhs, rhs, ev, inputs, level, mode)
                if d is not None and all(d.key != x.key for x in cand.drafts):
                    cand.drafts.append(d)
        if cand.drafts:
            kept.append(cand)
    return kept


def _occurrences(roots: Sequence[Term], target: Term) -> int:
    return sum(1 for root in roots for t in _walk(root) if t == target)


def _replace(term: Term, target: Term, by: Term) -> Term:
    if term == target:
        return by
    if isinstance(term, App):
        return App(term.head, tuple(_replace(a, target, by) for a in term.args))
    return term


def _abstract_opaque(
    lhs: tuple[Term, ...], rhs: tuple[Term, ...], ev: Evaluator, inputs: dict[str, InputSpec]
) -> tuple[tuple[Term, ...], tuple[Term, ...]] | None:
    """The rule with every *opaque* subterm of its left-hand side replaced by a fresh input, or None when
    there is none. A subterm is opaque when, replaced on both sides, the right-hand side still only uses
    inputs the left-hand side binds: the rule does not look into it. ``Concat(Concat(a, MatMul(b, c)), d)``
    is then the associativity of Concat, not a new rule; a generalization that does not hold is refuted, and
    the concrete drafts follow it."""
    new_lhs, new_rhs = list(lhs), list(rhs)
    changed = False

    def bound(left: list[Term], right: list[Term]) -> bool:
        have = {t.name for root in left for t in _walk(root) if isinstance(t, Var)}
        return all(t.name in have for root in right for t in _walk(root) if isinstance(t, Var))

    def candidates(term: Term, top: bool) -> list[Term]:
        if not isinstance(term, App):
            return []
        own = [] if top or term.head in ("TCons", "TNil", "NoneT") or is_variant(term) else [term]
        return own + [c for a in term.args for c in candidates(a, False)]

    for term in [c for root in lhs for c in candidates(root, True)]:
        if not any(term == t for root in new_lhs for t in _walk(root)):
            continue  # inside a subterm abstracted already
        info = ev.info(term)
        if info is None or info.core:
            continue
        name = f"u{len(inputs)}"
        left = [_replace(t, term, Var(name)) for t in new_lhs]
        right = [_replace(t, term, Var(name)) for t in new_rhs]
        if not bound(left, right):
            continue
        inputs[name] = InputSpec(name, info.shape, info.state[0] if info.state[0] in ("S", "P") else "R", info.state[1])
        ev.infos[Var(name)] = TermInfo(
            Var(name), info.shape, info.state, info.glob, info.pieces, False, frozenset(), frozenset({name})
        )
        new_lhs, new_rhs, changed = left, right, True
    if not changed:
        return None
    return tuple(new_lhs), tuple(new_rhs)


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
    """The status ``unity-eq verify`` gives ``rule`` under ``options`` (generic proof, cross-check of the
    first ``options.cross_check`` cases, every case without a generic proof, numeric back-up; see
    :func:`unity_eq.verify._verify._proofs`), and its message, decided in the cheapest order:

    * the generic proof first (z3, fast). When it fails, the decision is the exhaustive bounded check
      (refuted when some case refutes, unknown when some case is, else proven), whatever the order of the
      cases: they are checked as they are generated (lazily), so a refuted draft stops at its first
      counterexample instead of enumerating every case first.
    * When it holds (from premises a bounded case witnesses), the cross-check sample is exactly verify's:
      the smallest ``cross_check`` cases.
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


# ----------------------------------------------------------------------------------------------------------
# Rediscovery


def _match(pattern: Term, term: Term, subst: dict[str, Term]) -> bool:
    if isinstance(pattern, Var):
        got = subst.get(pattern.name)
        if got is None:
            subst[pattern.name] = term
            return True
        return got == term
    if isinstance(pattern, Lit):
        return isinstance(term, Lit) and _lit_eq(pattern, term)
    return (
        isinstance(term, App)
        and term.head == pattern.head
        and len(term.args) == len(pattern.args)
        and all(_match(p, t, subst) for p, t in zip(pattern.args, term.args, strict=True))
    )


def _lit_eq(a: Lit, b: Lit) -> bool:
    return a.value == b.value or (a.sort == "f64" and b.sort == "f64" and float(a.value) == float(b.value))


def _match_rhs(pattern: Term, term: Term, subst: dict[str, Term]) -> bool:
    """``_match``, where ``(PList l d ax)`` matches the list of ``(Partition item d ax)``."""
    if isinstance(pattern, App) and pattern.head == "PList":
        items, parts = list_items(term), []
        for item in items:
            if not (isinstance(item, App) and item.head == "Partition"):
                return False
            parts.append(item)
        if not parts and not (isinstance(term, App) and term.head == "TNil"):
            return False
        inner = App("TNil")
        for part in reversed(parts):
            inner = App("TCons", (part.args[0], inner))
        return all(
            _match(pattern.args[1], p.args[1], subst) and _match(pattern.args[2], p.args[2], subst) for p in parts
        ) and _match(pattern.args[0], inner, subst)
    if isinstance(pattern, App) and isinstance(term, App):
        return (
            term.head == pattern.head
            and len(term.args) == len(pattern.args)
            and all(_match_rhs(p, t, subst) for p, t in zip(pattern.args, term.args, strict=True))
        )
    return _match(pattern, term, subst)


def _same_rule(general: Rule, special: Rule) -> bool:
    """``special`` is ``general`` with its variables instantiated (equal when both ways): the same rewrite,
    maybe with literal dims where ``general`` has guarded variables."""
    subst: dict[str, Term] = {}
    return _match(general.lhs, special.lhs, subst) and _match_rhs(general.rhs, special.rhs, subst)


def rediscoveries(generated: Sequence[tuple[str, Rule]], core: Sequence[Rule]) -> dict[str, list[str]]:
    """Core rule name -> generated rules that equal it, specialize it or generalize it."""
    out: dict[str, list[str]] = {}
    for c in core:
        for name, g in generated:
            if _same_rule(c, g) or _same_rule(g, c):
                out.setdefault(c.name, []).append(name)
    return out


def _constructors(rule: Rule) -> set[str]:
    return {
        t.head
        for side in (rule.lhs, rule.rhs)
        for t in _walk(side)
        if isinstance(t, App) and t.head[:1].isupper() and t.head not in ("R", "D", "P", "S")
    }


def core_rules() -> list[Rule]:
    """The hand-written rewrites of the manifest (what the generator should rediscover)."""
    base = _base()
    return [r for r in base.program.rules if r.file in CORE_RULE_FILES]


# ----------------------------------------------------------------------------------------------------------
# The generator


def check_ops(text: str | Sequence[str]) -> list[str]:
    """The operator names of ``--ops`` (comma-separated), or an :class:`OptionError` naming the unknown ones."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [n.strip() for n in text]
    names = [n for n in names if n]
    if not names:
        raise OptionError(f"`--ops`: expected a comma-separated list of operators, got {text!r}.")
    known = {op.lower(): op for op in SUPPORTED_OPS}
    unknown = [n for n in names if n not in SUPPORTED_OPS and n.lower() not in known]
    if unknown:
        raise OptionError(
            f"`--ops`: unknown operator(s) {', '.join(unknown)}; the generator knows {', '.join(SUPPORTED_OPS)}."
        )
    out: list[str] = []
    for n in names:
        op = n if n in SUPPORTED_OPS else known[n.lower()]
        if op not in out:
            out.append(op)
    return out


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
    relevant = [c for c in core if _constructors(c) <= allowed]
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


_HEADER = """\
; GENERATED by `unity-eq generate-rules --ops {ops} --max-size {size}`: do not edit; regenerate.
; {what}
; Every rule was found by enumeration and exact fingerprints, proven by the verifier (`unity-eq verify`), and
; kept only if smaller rules do not already derive it. See docs/generate.md.
"""

_WHAT = {
    "shrinking.egg": "Algebraic rules whose right-hand side has fewer operators: loaded by `optimize` by default "
    "(`--no-generated-rules` turns them off).",
    "algebra.egg": "Other algebraic rules (no parallel ops, as many operators on both sides): verified in CI, not "
    "loaded by default (pass them with `--rules`).",
    "parallel.egg": "Parallelization and redistribution rules (`parallel` ruleset): verified in CI, not loaded by "
    "default (pass them with `--rules`).",
    "merge.egg": "Multi-output rules: two terms sharing an input become both outputs of one Split. Loaded by "
    "`optimize`: each concatenates model-weight spans in initializer order only (`merge-operand`), so a merged "
    "MatMul never merges with its own parts again.",
    "core-equivalent.egg": "Rules the hand-written core rules already derive (rediscovered): verified in CI, "
    "not loaded by `optimize`.",
    "growing.egg": "Algebraic rules whose right-hand side has more operators (expansions): verified in CI, not "
    "loaded by `optimize` (each application grows the e-graph).",
}


def write_rules(report: GenerateReport, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    by_file: dict[str, list[GeneratedRule]] = {name: [] for name in OUTPUT_FILES.values()}
    for rule in report.rules:
        by_file[rule.file].append(rule)
    for name, rules in by_file.items():
        lines = [_HEADER.format(ops=",".join(report.ops), size=report.max_size, what=_WHAT[name])]
        for rule in sorted(rules, key=lambda r: (r.size, r.name)):
            note = f"; {rule.kind}, size {rule.size}"
            if rule.rediscovers:
                note += f"; rediscovers {', '.join(rule.rediscovers)}"
            lines.append(f"{note}\n{rule.text}\n")
        (out_dir / name).write_text("\n".join(lines), encoding="utf-8")
        report.files[name] = len(rules)


def write_report(report: GenerateReport, out_dir: Path) -> None:
    (out_dir / "report.json").write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    (out_dir / "report.md").write_text(render_report(report) + "\n", encoding="utf-8")


def render_report(report: GenerateReport) -> str:
    """The readable report (Markdown)."""
    c, p = report.counts, report.pruned
    lines = [
        f"# generate-rules: --ops {','.join(report.ops)} --max-size {report.max_size} (jobs {report.jobs})",
        "",
        "| phase | seconds |",
        "|---|---:|",
        *(f"| {k} | {v:.1f} |" for k, v in report.phases.items()),
        "",
        f"- terms evaluated: {c.get('terms_evaluated', 0)} ({c.get('terms_invalid', 0)} invalid), "
        f"fingerprint classes: {c.get('classes', 0)}, equations: {c.get('equations', 0)}",
        f"- candidate rules: {c.get('candidates', 0)}; pruned: " + ", ".join(f"{n} {k}" for k, n in p.items()),
        f"- proven: {c.get('proven', 0)}, refuted: {c.get('refuted', 0)}, unknown: {c.get('unknown', 0)}",
        "- written: " + ", ".join(f"{n} in {f}" for f, n in report.files.items()),
        "",
        "Rules per operator: " + ", ".join(f"{op} {n}" for op, n in report.rules_per_operator().items()),
        "",
        "## Rediscovered core rules",
        "",
        *(f"- {core} = {gen}" for core, gen in sorted(report.rediscovered.items())),
        "",
        f"Not rediscovered ({len(report.not_rediscovered)}): {', '.join(report.not_rediscovered)}",
        "",
        "## Multi-output rules",
        "",
        *(f"- {r.name} ({r.file})" for r in report.rules if r.kind == "multi"),
    ]
    return "\n".join(lines)
