"""The generator's pruning by the guards' rank facts (verify/_rank_facts.py) drops no case.

For shipped rules whose guards tie ranks together, and for small rules that exercise each form a rank fact
takes, the cases of a bounded proof (every guard-passing binding, with its identity, in the generator's
order) are the same with the pruning as without it, while the generator builds fewer left-hand sides. The
attention rules run on a smaller configuration (dims 1-2, rank-4 shapes all ones): their full enumeration
without the pruning is 3.7 million left-hand sides (minutes).
"""

from __future__ import annotations

from typing import Any

import pytest

from unity_eq.rulefile.manifest import rules_dir
from unity_eq.rulefile.parse import RuleSource, parse_program
from unity_eq.rulefile.terms import Rule
from unity_eq.verify import load_program
from unity_eq.verify._bounded_cases import enumerate_cases, iter_cases
from unity_eq.verify._gen import GenConfig, generate_lhs, rank_facts
from unity_eq.verify._guards import DerivedFacts

SHIPPED, _TARGETS = load_program()
FACTS = DerivedFacts(SHIPPED.analyses)
BY_NAME = {r.name: r for r in SHIPPED.rules}
SMALL = GenConfig(dims=(1, 2), rank4_dims=(1,))


def _cases(rule: Rule, cfg: GenConfig, sizes: tuple[int, ...], prune: bool) -> list[Any]:
    count = [0]
    return [(c.mesh, c.binding, c.placed, i) for c, i in iter_cases(rule, FACTS, cfg, sizes, count, None, prune)]


def _instances(rule: Rule, cfg: GenConfig, prune: bool) -> int:
    facts = rank_facts(rule.guards, rule.lhs, rule.var_sorts) if prune else None
    return sum(1 for _ in generate_lhs(rule.lhs, rule.var_sorts, ("x",), cfg, facts))


def _assert_same_cases(rule: Rule, cfg: GenConfig, sizes: tuple[int, ...], prunes: bool = True) -> None:
    """The same cases in the same order; ``prunes``: and fewer left-hand sides built (else as many)."""
    pruned, full = _cases(rule, cfg, sizes, True), _cases(rule, cfg, sizes, False)
    assert pruned == full, (rule.name, len(pruned), len(full))
    assert full, f"{rule.name}: no case at all (the comparison would say nothing)"
    built, every = _instances(rule, cfg, True), _instances(rule, cfg, False)
    assert (built < every) if prunes else (built == every), (rule.name, built, every)


@pytest.mark.parametrize(
    ("name", "small", "prunes"),
    [
        # r = rank q = rank kt = rank v, r > 1, the Softmax axis r - 1, rank m <= r: 4 free tensors
        ("attention-fuse-mask", True, True),
        # literal ranks 4 of q, kt and v, v bound after five nested ops
        ("attention-fuse-mask-nan-fill", True, True),
        # `(= sm (shape m)) (= 4 (vec-length sm))`, with can-split and placed guards on meshes of 2
        ("attention-split-batch-shared-mask", False, True),
        # `(= r (vec-length (shape a)))` with `(!= (- d r) axis)`, d bound by can-split: never known early, so
        # nothing is pruned (and nothing may be)
        ("softmax-split", False, False),
        # literal ranks of both operands and a Split's sizes' length (generated rules)
        ("gen-add-split-394670", False, True),
    ],
)
def test_pruned_generator_gives_the_same_cases(name: str, small: bool, prunes: bool) -> None:
    rule = BY_NAME[name]
    assert rank_facts(rule.guards, rule.lhs, rule.var_sorts), f"{name}: no rank fact read from its guards"
    _assert_same_cases(rule, SMALL if small else GenConfig(), (1, 2), prunes)


def test_enumerated_cases_are_the_same_sorted_and_counted() -> None:
    """What the prover reads (:func:`enumerate_cases`): the same cases, smallest first, and the same count of
    guard solutions (reports print both)."""
    rule = BY_NAME["attention-fuse-mask"]
    pruned = enumerate_cases(rule, FACTS, SMALL, (1,), prune=True)
    full = enumerate_cases(rule, FACTS, SMALL, (1,), prune=False)
    assert (pruned.enumerated, pruned.classes, pruned.error) == (full.enumerated, full.classes, full.error)
    assert [(c.mesh, c.binding, c.placed) for c in pruned.cases] == [(c.mesh, c.binding, c.placed) for c in full.cases]


def _rule(text: str) -> Rule:
    program = parse_program(
        [RuleSource("ranks.egg", text)],
        [RuleSource(f"rules/{n}", (rules_dir() / n).read_text()) for n in ("schema.egg", "analysis.egg")],
    )
    assert program.errors == []
    return program.rules[-1]


@pytest.mark.parametrize(
    "guards",
    [
        # two tensors of one rank, no guard variable; a strict order between ranks
        "(= (vec-length (shape d)) (vec-length (shape e))) (< (vec-length (shape c)) (vec-length (shape d)))",
        # a guard variable defined late, read early; arithmetic, min and max
        "(> (+ r 1) 2) (= (max (vec-length (shape c)) 1) (min r 3)) (= r (vec-length (shape e)))",
        # != and a division by a rank (an absent c, rank 0, makes the guard fail: left to the guards)
        "(!= (vec-length (shape d)) 2) (= 1 (/ (vec-length (shape e)) (vec-length (shape c))))",
    ],
)
def test_each_form_of_rank_fact_keeps_the_cases(guards: str) -> None:
    """A Gemm with an optional bias ``c`` (absent: NoneT, rank 0 in the guards) beside a MatMul of operands
    of rank 1-4, bound at two depths under an Add: each form of fact prunes without losing or reordering a
    case."""
    rule = _rule(f"(rewrite (Add (Gemm a b c 1.0 1.0 0 0) (MatMul d e)) (Add (MatMul d e) (Gemm a b c 1.0 1.0 0 0))"
                 f" :when ({guards}))")  # fmt: skip
    _assert_same_cases(rule, SMALL, (1,))


def test_rank_facts_beside_a_derived_relation_keep_the_cases() -> None:
    """A rule whose guards also read a relation derived by analysis.egg's declarations (``bc-dim``) and split
    on a mesh axis: the guards see the declarations' facts either way (the rank facts are the generator's
    own), and an equal-rank fact between Mul's operands prunes the broadcast patterns of unequal ranks."""
    rule = _rule("(rewrite (Mul a b) (Combine (Mul (Partition a da ax) (Partition b db ax)) d ax)"
                 " :when ((bc-dim a (Mul a b) d da) (bc-dim b (Mul a b) d db) (can-split a da ax)"
                 " (can-split b db ax) (= (vec-length (shape a)) (vec-length (shape b)))))")  # fmt: skip
    _assert_same_cases(rule, SMALL, (1, 2))
