"""The sample a budget or a generic proof's cross-check checks (verify/_signatures.py): the smallest case of
each signature, not the smallest cases.

A double Transpose is the identity only for involutive perms. With a budget as large as the number of
signatures, the sample holds a case of every rank and every perm value (each perm is a signature of its own),
about a third of the cases, and the rank-3 cycles among them refute the rule.
"""

from __future__ import annotations

from pathlib import Path

from unity_eq.rulefile.terms import Rule
from unity_eq.verify import load_program
from unity_eq.verify._bounded import prove_bounded
from unity_eq.verify._bounded_cases import enumerate_cases
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._signatures import by_signature

TWICE = '(rewrite (Transpose (Transpose a p) p) a :ruleset algebra :name "transpose-twice")\n'
SPLIT_RELU = (
    "(rewrite (Relu (Combine (Partition a d ax) d ax)) (Combine (Relu (Partition a d ax)) d ax)"
    ' :ruleset parallel :name "relu-through-partition")\n'
)


def _load(tmp_path: Path, text: str, name: str) -> tuple[Rule, DerivedFacts]:
    path = tmp_path / "mine.egg"
    path.write_text(text)
    program, _ = load_program([path])
    assert program.errors == []
    return next(r for r in program.rules if r.name == name), DerivedFacts(program.analyses)


def _rank(case: object) -> int:
    return len(case.binding["a"].shape)  # type: ignore[attr-defined]


def test_one_case_of_each_signature_reaches_every_rank_and_refutes(tmp_path: Path) -> None:
    rule, facts = _load(tmp_path, TWICE, "transpose-twice")
    every = enumerate_cases(rule, facts)
    chosen, signatures = by_signature(every.cases, rule, 10**6)
    assert len(chosen) == signatures < len(every.cases)
    assert {_rank(c) for c in chosen} == {_rank(c) for c in every.cases}
    assert {c.binding["p"] for c in chosen} == {c.binding["p"] for c in every.cases}  # every perm value
    result = prove_bounded(rule, facts, budget=signatures)
    assert result.status == "refuted", result
    assert result.checked <= signatures


def test_a_budget_below_the_signatures_still_takes_every_primary_class(tmp_path: Path) -> None:
    """Primary classes (axis sizes here) each keep a case when the budget is smaller than their number; a
    budgeted check that leaves cases out is partial."""
    rule, facts = _load(tmp_path, SPLIT_RELU, "relu-through-partition")
    every = enumerate_cases(rule, facts)
    chosen, signatures = by_signature(every.cases, rule, 1)
    assert signatures > len(chosen) > 1
    assert {c.mesh.sizes for c in chosen} == {c.mesh.sizes for c in every.cases}
    assert [c.elements() for c in chosen] == sorted(c.elements() for c in chosen)  # smallest first
    result = prove_bounded(rule, facts, budget=1)
    assert result.status == "partial" and "smallest of each signature" in result.reason
