"""The size sweep: a rule proven bounded that reads sizes, evaluated with numpy at sizes its proof never took.

A bounded proof covers dims 1-4, and the engine fires the rule at every size on an argument
(docs/verify.md, "Dims and mesh sizes"): the shipped guard relations see sizes only as "is it 1", "does it
divide the axis" and "are two equal", which dims 1-4 answer every way. A rule that reads sizes itself
(:func:`unity_eq.rulefile.domain.size_readers`: a guard on a dim's value, Split's sizes, a Reshape target)
can ask other questions: "is it even" (never false at rank 4, whose dims are 1, 2 and 4), "is it at least
twice the axis", "are there no more keys than queries". Issue 21's sixth adversary wrote four such rules
that the proof's sizes could not refute.

So such a rule is also evaluated, both sides and every piece, on random inputs at the sweep's sizes: dims
1, 2, 3, 5 and 6 at every rank up to 4 (odd, prime and composite sizes, and a 6 that 2 and 3 divide but 4
does not), axes of 2-4 devices, the sizes families keep small for z3 (a three-operand Concat's operands,
Attention's sequence lengths) widened too. The smallest case of each of the first :data:`SWEEP_SIGNATURES`
signatures (every value of every guard variable is a signature of its own) is checked. A mismatch refutes
the rule with a concrete counterexample; passing is evidence, not a proof, and the report says the sizes
read are trusted beyond the ones checked.
"""

from __future__ import annotations

from typing import Any

from unity_eq.rulefile.domain import size_readers
from unity_eq.rulefile.terms import Rule
from unity_eq.verify._gen import GenConfig
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._numeric import NumericResult, check_numeric
from unity_eq.verify._rule_report import RuleReport

__all__ = ["SIZE_SWEEP_CONFIG", "SWEEP_SIGNATURES", "refute_by_sweep", "sweep_sizes"]

#: instances per operator at the sweep's sizes (a seeded shuffle of all of them: tens of thousands for
#: Concat, Slice or the reductions)
SWEEP_INSTANCES = 20_000

#: the sizes of the sweep (the proof's are 1-4, rank 4's only 1, 2 and 4)
SIZE_SWEEP_CONFIG = GenConfig(
    dims=(1, 2, 3, 4, 5, 6), max_rank=4, other_rank=3, rank4_dims=(1, 2, 3, 4, 6), wide=True, cap=SWEEP_INSTANCES
)
#: signatures checked per rule (each a numpy evaluation of both sides: milliseconds)
SWEEP_SIGNATURES = 400
#: left-hand sides (and cases) per mesh the signatures are taken from (a left-hand side of several operators
#: multiplies their instances: the first of a seeded shuffle stand for them)
SWEEP_CASES = 5_000


def sweep_sizes(rule: Rule, facts: DerivedFacts, cache: dict[Any, Any] | None = None) -> NumericResult | None:
    """The sweep's verdict on ``rule`` (``failed`` with a counterexample, ``passed``, or ``skipped`` when no
    case at the sweep's sizes fits the guards), or None when the rule reads no sizes (its proof's sizes stand
    for the others on the argument above)."""
    if not size_readers(rule):
        return None
    return check_numeric(
        rule,
        facts,
        cases=SWEEP_SIGNATURES,
        cache=cache,
        config=SIZE_SWEEP_CONFIG,
        largest_first=False,
        limit=SWEEP_CASES,
    )


def refute_by_sweep(rule: Rule, facts: DerivedFacts, cache: dict[Any, Any], report: RuleReport) -> None:
    """``report`` of a rule proven bounded: the sweep's result recorded, and the rule refuted when the sweep
    finds a mismatch (its proof's sizes did not stand for the others)."""
    sweep = sweep_sizes(rule, facts, cache)
    report.sweep = sweep
    if sweep is None or sweep.status != "failed":
        return
    report.status, report.kind = "refuted", "numeric"
    report.numeric, report.domain = sweep, None
    cex = sweep.counterexample
    report.message = (
        f"at sizes the bounded proof (dims 1-4) did not take: {cex.message if cex else 'a mismatch'}; the rule "
        f"reads sizes ({', '.join(report.size_readers)}), so its proof's sizes do not stand for the others"
    )
