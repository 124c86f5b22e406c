"""An adversary's corpus against `unity-eq verify` (issue 21, item 7).

``tests/data/adversary_corpus.egg`` holds plausible unsound rules (``adv-*``) written without looking at the
verifier's instance generators, and sound look-alikes (``adv-ok-*``). For every unsound rule:

* ``test_counterexample_is_real``: its counterexample (``tests/adversary_numeric.py``) is evaluated by
  onnxruntime, independently of the verifier: the two sides differ (shape, value, or a right-hand side that
  onnxruntime refuses), so the rule IS wrong;
* ``test_unsound_rule_is_refuted``: ``unity-eq verify`` (``verify_program``, real z3) refutes it.

Every look-alike must be proven (``test_look_alike_is_proven``). ``ESCAPES`` are the unsound rules today's
verifier does not refute, each with the mechanism as far as it can be told from outside; ``GAPS`` the sound
look-alikes it cannot prove. Both are strict xfails: the moment the verifier is fixed the test passes,
pytest reports XPASS(strict) as a failure, and the entry must go.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from unity_eq.verify import Options, RuleReport, load_program, verify_program

from adversary_numeric import COUNTEREXAMPLES, differ
from unity_eq.rulefile.parse import Program
from unity_eq.rulefile.terms import Rule

CORPUS = Path(__file__).parent / "data" / "adversary_corpus.egg"
NAMES = re.findall(r':name "([^"]+)"', CORPUS.read_text())
UNSOUND = [n for n in NAMES if n.startswith("adv-") and not n.startswith("adv-ok-")]
LOOK_ALIKES = [n for n in NAMES if n.startswith("adv-ok-")]
# analysis declarations (``(rule ...)`` that only add facts): `unity-eq verify` counts them, proves nothing
ANALYSIS = re.findall(r':ruleset analysis :name "([^"]+)"', CORPUS.read_text())

ort.set_default_logger_severity(3)  # the right-hand sides onnxruntime refuses are expected: no error log

_NO_CASE = "unknown: no bounded case satisfies the guards"
# Unsound rules the verifier does not refute today, and why (what its cases or axioms miss).
ESCAPES: dict[str, str] = {}
# Sound look-alikes the verifier does not prove today.
GAPS: dict[str, str] = {}
# Rules whose verification takes more than ~20 s on one idle core.
SLOW: set[str] = set()


def _params(names: list[str], xfails: dict[str, str]) -> list[Any]:
    out = []
    for n in names:
        marks = [pytest.mark.slow] if n in SLOW else []
        if n in xfails:
            marks.append(pytest.mark.xfail(strict=True, reason=xfails[n]))
        out.append(pytest.param(n, marks=marks))
    return out


@pytest.fixture(scope="module")
def corpus() -> tuple[Program, dict[str, Rule]]:
    """The corpus, loaded once after the shipped files (as ``unity-eq verify`` loads a new file)."""
    program, _files = load_program([CORPUS])
    return program, {r.name: r for r in program.rules if r.file.endswith(CORPUS.name)}


def _verify(corpus: tuple[Program, dict[str, Rule]], name: str) -> RuleReport:
    program, rules = corpus
    if name in ANALYSIS:
        pytest.fail(f"{name}: an analysis declaration, which `unity-eq verify` does not check")
    (report,) = verify_program(program, [rules[name]], Options(jobs=1))
    return report


def test_the_corpus_loads_and_every_unsound_rule_has_a_counterexample(corpus: tuple[Program, dict[str, Rule]]) -> None:
    program, rules = corpus
    assert program.errors == []
    assert sorted(rules) == sorted(set(NAMES) - set(ANALYSIS))
    assert len(program.analyses) >= len(ANALYSIS) > 0
    assert len(UNSOUND) >= 30 and len(LOOK_ALIKES) >= 20
    assert sorted(COUNTEREXAMPLES) == sorted(UNSOUND)
    assert set(ESCAPES) <= set(UNSOUND) and set(GAPS) <= set(LOOK_ALIKES)


@pytest.mark.parametrize("name", UNSOUND)
def test_counterexample_is_real(name: str) -> None:
    lhs, rhs = COUNTEREXAMPLES[name]()
    why = differ(lhs, rhs)
    assert why, f"{name}: both sides agree on its counterexample"


@pytest.mark.parametrize("name", _params(UNSOUND, ESCAPES))
def test_unsound_rule_is_refuted(corpus: tuple[Program, dict[str, Rule]], name: str) -> None:
    rule = _verify(corpus, name)
    assert rule.status == "refuted", f"{name} ({rule.file}:{rule.line}) {rule.status} {rule.kind}: {rule.message}"
    assert rule.counterexample is not None and rule.counterexample.case


@pytest.mark.parametrize("name", _params(LOOK_ALIKES, GAPS))
def test_look_alike_is_proven(corpus: tuple[Program, dict[str, Rule]], name: str) -> None:
    rule = _verify(corpus, name)
    assert rule.status == "proven", f"{name} ({rule.file}:{rule.line}) {rule.status} {rule.kind}: {rule.message}"
