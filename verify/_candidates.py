"""Candidate rules from the enumeration's equations: each oriented, with drafts from general to guarded.

Phase 2 of :mod:`unity_eq.verify._generate`; the orientation rules are stated there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._enumerate import (
    PARALLEL_OPS,
    Enumeration,
    Evaluator,
    InputSpec,
    TermInfo,
    is_variant,
)
from unity_eq.verify._generalize import ATTEMPTS, RuleCandidate, draft

# ----------------------------------------------------------------------------------------------------------
# Candidates


def subterms(term: Term) -> Any:
    yield term
    if isinstance(term, App):
        for a in term.args:
            yield from subterms(a)


def _parallel_count(term: Term) -> int:
    return sum(1 for t in subterms(term) if isinstance(t, App) and t.head in PARALLEL_OPS)


def _collectives(term: Term) -> int:
    return sum(1 for t in subterms(term) if isinstance(t, App) and t.head in ("Combine", "Reduce"))


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
        for t in subterms(term)
        if isinstance(t, App) and t.head not in ("TCons", "TNil", "NoneT") and not is_variant(t)
    ]


def _leaves(term: Term) -> list[str]:
    return sorted(t.name for t in subterms(term) if isinstance(t, Var))


def _is_reordering(a: Term, b: Term) -> bool:
    """Both sides one operator only, over the same inputs: commutativity or associativity."""
    heads = set(_op_heads(a)) | set(_op_heads(b))
    return len(heads) == 1 and _leaves(a) == _leaves(b) and sorted(_op_heads(a)) == sorted(_op_heads(b))


def _has_sharded_input(term: Term, inputs: dict[str, InputSpec]) -> bool:
    return any(isinstance(t, Var) and inputs[t.name].kind != "R" for t in subterms(term))


def _reverse_strategy(a: Term, b: Term, inputs: dict[str, InputSpec]) -> bool:
    """``a`` is a strategy's right-hand side for ``b`` (a collective over a core of input slices)."""
    if _parallel_count(b) or _has_sharded_input(a, inputs):
        return False
    if not (isinstance(a, App) and a.head in ("Combine", "Reduce")):
        return False
    inner = [t for t in subterms(a) if isinstance(t, App) and t.head in PARALLEL_OPS and t is not a]
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
    return sum(1 for root in roots for t in subterms(root) if t == target)


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
        have = {t.name for root in left for t in subterms(root) if isinstance(t, Var)}
        return all(t.name in have for root in right for t in subterms(root) if isinstance(t, Var))

    def candidates(term: Term, top: bool) -> list[Term]:
        if not isinstance(term, App):
            return []
        own = [] if top or term.head in ("TCons", "TNil", "NoneT") or is_variant(term) else [term]
        return own + [c for a in term.args for c in candidates(a, False)]

    for term in [c for root in lhs for c in candidates(root, True)]:
        if not any(term == t for root in new_lhs for t in subterms(root)):
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
