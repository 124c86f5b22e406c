"""`unity-eq verify`: every shipped rule proven; unsound rules refuted with counterexamples; load errors.

Real z3 throughout (no mocks). One test per shipped rule (ids are rule names), so a failure names the rule.
The guard mirrors are checked against analysis.egg itself: the same relations derived by egglog and by the
Python predicates on the same shapes.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import egglog.bindings as bindings
import pytest

from unity_eq.cli import main as cli_main
from unity_eq.ops.registry import plugin_for
from unity_eq.rulefile.load import shipped_rule_files
from unity_eq.rulefile.manifest import rules_dir
from unity_eq.rulefile.parse import RuleSource, parse_program
from unity_eq.rulefile.terms import App, walk
from unity_eq.verify import Options, load_program, verify_rules
from unity_eq.verify._gen import op_instances
from unity_eq.verify._guards import DerivedFacts, GuardContext, solve_guards
from unity_eq.verify._semantics import Placements, VarSpec
from unity_eq.verify._verify import _templates_first, decide_rule

SHIPPED, _TARGETS = load_program()
# every shipped rule, hand-written and generated (all of rules/generated/, loaded by default or not); rules
# proven with uninterpreted functions first, so their proofs serve the rules that are instances of them
_ALL = [r for r in SHIPPED.rules if r.file in _TARGETS]
SHIPPED_RULES = [_ALL[i] for i in _templates_first(_ALL)]
FACTS = DerivedFacts(SHIPPED.analyses)
CACHE: dict[Any, Any] = {}


def write(tmp_path: Path, text: str, name: str = "my_rules.egg") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def verify_text(tmp_path: Path, text: str, **options: Any) -> Any:
    return verify_rules([write(tmp_path, text)], options=Options(jobs=1, **options))


# ------------------------------------------------------------------------------------------ shipped rules


def test_shipped_files_load_cleanly() -> None:
    assert SHIPPED.errors == []
    assert {Path(p).name for p in _TARGETS} == {p.name for p in shipped_rule_files()}
    # every rewrite of the manifest and analysis.egg's two PList rewrites
    hand_written = [r for r in SHIPPED_RULES if "generated/" not in r.file]
    assert len(hand_written) >= 130 and len(SHIPPED_RULES) > len(hand_written)
    assert {"plist-cons", "plist-nil", "matmul-split-k", "reduce-add-fuse"} <= {r.name for r in SHIPPED_RULES}


def _reads_a_plug_in_op(rule: Any) -> bool:
    return any(isinstance(t, App) and plugin_for(t.head) is not None for t in walk(rule.lhs))


#: hand-written rules proven by a bounded check over every case only (no generic proof), a minute or more each
#: on one core: CI's `unity-eq verify` step proves them on every case, and
#: tests/test_certificate.py checks that rules/proofs.json holds their bounded proof for their current text
EXHAUSTIVE_ONLY = {"split-split-fuse-first", "split-split-fuse-second"}
#: signatures whose smallest cases cross-check a generic proof here. `Options.cross_check` (1000) is what
#: `unity-eq verify` checks by default; CI's verify step checks every signature of every generically proven
#: shipped rule (`--cross-check 1000000`), so the default test run checks the generic proof and a sample only.
CROSS_CHECK = 100


def _shipped_param(rule: Any) -> Any:
    """Generated rules take 2-300 s each on every case of the ranges (~40 min for all on one core): CI's
    `unity-eq verify` step (.ci/run) proves them before the tests run (every case without a generic proof,
    every signature's smallest case beside one); here they
    are slow tests (`-m slow`), as are the EXHAUSTIVE_ONLY hand-written rules. The other hand-written rules
    are proven in the default run."""
    slow = "generated/" in rule.file or rule.name in EXHAUSTIVE_ONLY
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(rule, id=rule.name, marks=marks)


@pytest.mark.parametrize("rule", [_shipped_param(r) for r in SHIPPED_RULES])
def test_shipped_rule_is_proven(rule: Any) -> None:
    """Every shipped rule (generated ones included) is proven: generically, with its axioms cross-checked on
    a sample of the bounded cases, or by a bounded check over every case of the ranges (no budget, no
    sampling)."""
    options = Options(jobs=1, numeric="generated/" not in rule.file, cross_check=CROSS_CHECK)
    report = decide_rule(rule, FACTS, options, CACHE)
    assert report.status == "proven", f"{rule.name} ({rule.pos}): {report.message}"
    assert report.bounded is not None, rule.name
    expected = {"generic": ("proven", "cross-checked"), "bounded": ("proven",)}[report.kind]
    assert report.bounded.status in expected, report.bounded
    assert report.bounded.checked > 0 or "an instance of" in report.bounded.reason
    if "generated/" in rule.file:
        return  # generated rules: proven bounded (the generic prover is not asked to prove them)
    if rule.name.startswith("split-split-fuse"):
        # 3-way Split sizes built from sums of 2-way ones: the shape-generic prover does not model them, so
        # these two are proven on every bounded case (dims 1-4, axis sizes 1-4) only
        # (two-root rules: the numeric back-up is skipped for them, as for the generated merges)
        assert report.kind == "bounded", f"{rule.name}: {report.kind}"
        assert report.bounded is not None and report.bounded.status == "proven" and report.bounded.checked > 0
        return
    if _reads_a_plug_in_op(rule):
        # a plug-in op family (unity_eq/ops/<family>.py) gives the verifier its semantics and proof ranges but no
        # axioms for the shape-generic prover: its rules are proven on every case of the family's ranges
        assert report.kind == "bounded", f"{rule.name}: {report.kind}"
        assert report.bounded.status == "proven" and report.bounded.checked > 0
        return
    assert report.kind == "generic", f"{rule.name}: generic proof failed: {report.generic.reason}"
    assert report.bounded.checked > 0
    assert report.numeric is not None and report.numeric.status in ("passed", "skipped")  # a back-up only


def test_exhaustive_only_rules_are_certified_bounded_for_their_text() -> None:
    """The EXHAUSTIVE_ONLY rules, slow tests here, are hand-written shipped rules whose certificate
    (rules/proofs.json, written by `unity-eq verify --write-certificate`) is a bounded proof of their
    current text; CI's verify step re-proves them on every case."""
    from unity_eq.rulefile.certificate import load_certificate

    cert = load_certificate(rules_dir() / "proofs.json")
    hand_written = {r.name: r for r in SHIPPED_RULES if "generated/" not in r.file}
    for name in EXHAUSTIVE_ONLY:
        assert name in hand_written, name
        assert cert.rules[name]["proof"] == "bounded" and cert.rules[name]["digest"] == hand_written[name].digest


@pytest.mark.slow
def test_cli_verifies_everything_shipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", "--quiet"]) == 0
    assert re.search(r"ok: \d+ rules in \d+ files: \d+ proven", capsys.readouterr().out)


def test_cli_on_one_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    path = rules_dir() / "parallel" / "redistribute.egg"
    assert cli_main(["verify", str(path), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    for name in (
        "partition-combine-cancel",
        "partition-replicate-commute",
        "partition-combine-commute",
        "reduce-add-fuse",
    ):
        assert name in out
    assert "4 proven (4 generic), 0 refuted, 0 partial, 0 unknown" in out


def test_python_module_with_one_rule(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "unity_eq.verify", "--rule", "matmul-split-k", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matmul-split-k" in done.stdout and "proven" in done.stdout
    data = json.loads(report.read_text())
    (rule,) = data["rules"]
    assert rule["status"] == "proven" and rule["kind"] == "generic" and rule["file"] == "rules/parallel/matmul.egg"
    assert rule["bounded"]["cases_checked"] > 0 and data["summary"]["proven"] == 1


def test_unknown_rule_name_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", "--rule", "no-such-rule"]) == 2
    assert "no rule named no-such-rule" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ unsound rules


def refuted(report: Any, name: str) -> Any:
    (rule,) = [r for r in report.rules if r.name == name]
    assert rule.status == "refuted", f"{name}: {rule.status} {rule.message}"
    assert not rule.ok and not report.ok
    assert rule.generic is not None and not rule.generic.proven  # never "proven for all shapes"
    cex = rule.counterexample
    assert cex is not None and cex.case
    return cex


def test_matmul_commutativity_is_refuted_by_shapes(tmp_path: Path) -> None:
    """The first case the exhaustive check meets is a non-square one: b·a does not even type-check there."""
    report = verify_text(tmp_path, '(rewrite (MatMul a b) (MatMul b a) :ruleset algebra :name "matmul-commute")\n')
    cex = refuted(report, "matmul-commute")
    assert cex.kind == "shape"
    assert "cannot be evaluated" in cex.message


def test_subtraction_commutativity_is_refuted_with_values(tmp_path: Path) -> None:
    """Both sides always have the same shape, so the counterexample must be one of values."""
    report = verify_text(tmp_path, '(rewrite (Sub a b) (Sub b a) :ruleset algebra :name "sub-commute")\n')
    cex = refuted(report, "sub-commute")
    assert cex.kind == "value"
    assert set(cex.inputs) >= {"a", "b"}
    assert cex.lhs != cex.rhs  # both sides' outputs differ on these inputs


def test_partition_combine_on_different_dims_is_refuted(tmp_path: Path) -> None:
    text = """
(rewrite (Partition (Combine x d1 ax) d2 ax) x :when ((!= d1 d2))
         :ruleset parallel :name "cancel-other-dim")
(rewrite (Relu a) (Combine (Relu (Partition a d ax)) d2 ax)
         :when ((can-split a d ax) (can-split a d2 ax) (!= d d2))
         :ruleset parallel :name "relu-gather-other-dim")
"""
    report = verify_text(tmp_path, text)
    cex = refuted(report, "cancel-other-dim")
    assert cex.kind == "placement" and "S(0) and S(1)" in cex.message
    cex = refuted(report, "relu-gather-other-dim")
    assert cex.kind == "shape" and "mesh x=2" in cex.case


def test_reduce_of_values_that_are_not_partial_sums_is_refuted(tmp_path: Path) -> None:
    text = """
(rewrite (MatMul a b) (Reduce (MatMul (Replicate a ax) (Replicate b ax)) ax)
         :when ((mesh-axis ax n) (> n 1)) :ruleset parallel :name "reduce-replicated")
; the contraction split with a bias: every device adds C, so the sum counts it n times
(rewrite (Gemm a b c al be ta tb)
         (Reduce (Gemm (Partition a (- 1 ta) ax) (Partition b tb ax) c al be ta tb) ax)
         :when ((can-split a (- 1 ta) ax) (can-split b tb ax))
         :ruleset parallel :name "gemm-split-k-with-bias")
"""
    report = verify_text(tmp_path, text)
    cex = refuted(report, "reduce-replicated")
    assert cex.kind == "value" and "Reduce" in cex.check
    assert cex.got != cex.want
    cex = refuted(report, "gemm-split-k-with-bias")
    assert cex.kind == "value" and "c" in cex.inputs
    assert cex.got != cex.want


def test_missing_divisibility_guard_is_refuted(tmp_path: Path) -> None:
    # relu-split and matmul-split-rows with `can-split` replaced by everything but its divisibility test
    text = """
(rewrite (Relu a) (Combine (Relu (Partition a d ax)) d ax)
         :when ((placed a ax (R)) (mesh-axis ax n) (> n 1) (dim-range d) (< d (vec-length (shape a))))
         :ruleset parallel :name "relu-split-no-divisibility")
(rewrite (MatMul a b) (Combine (MatMul (Partition a da ax) (Replicate b ax)) d ax)
         :when ((mm-row (MatMul a b) d da) (placed a ax (R)) (mesh-axis ax n) (> n 1) (placed b ax (R)))
         :ruleset parallel :name "matmul-split-rows-no-divisibility")
"""
    report = verify_text(tmp_path, text)
    for name in ("relu-split-no-divisibility", "matmul-split-rows-no-divisibility"):
        cex = refuted(report, name)
        assert cex.kind == "shape" and "does not split into" in cex.message


def test_broken_variants_of_shipped_rules_are_refuted() -> None:
    """Mutation test of the verifier: plausible mistakes in shipped rules (a wrong dim, a dropped guard, a
    Reduce for a Combine…) are all refuted; the ok-* look-alikes are sound and proven."""
    path = Path(__file__).parent / "data" / "mutants.egg"
    report = verify_rules([path], options=Options(numeric=False))
    assert report.errors == [] and len(report.rules) >= 30
    for rule in report.rules:
        expected = "proven" if rule.name.startswith("ok-") else "refuted"
        assert rule.status == expected, f"{rule.name} ({rule.file}:{rule.line}): {rule.status} {rule.message}"
        if expected == "refuted":
            assert rule.counterexample is not None and rule.counterexample.case


def test_cli_prints_the_counterexample_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '\n(rewrite (Sub a b) (Sub b a) :ruleset algebra :name "sub-commute")\n')
    assert cli_main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "REFUTED sub-commute" in out and "my_rules.egg:2" in out
    assert "inputs:" in out and "left-hand side" in out and "right-hand side" in out and "case: one device" in out


# ------------------------------------------------------------------------------------------ sound user rules


def test_a_new_file_of_sound_rules_is_proven(tmp_path: Path) -> None:
    text = """
; MatMul is associative when no operand is a vector (a 1-D middle operand is a real counterexample)
(rewrite (MatMul (MatMul a b) c) (MatMul a (MatMul b c))
         :when ((>= (vec-length (shape a)) 2) (>= (vec-length (shape b)) 2) (>= (vec-length (shape c)) 2))
         :ruleset algebra :name "matmul-assoc")
(birewrite (Mul a b) (Mul b a) :ruleset algebra :name "mul-commute")
(rewrite (Relu (Combine x d ax)) (Combine (Relu x) d ax) :ruleset parallel :name "relu-push-combine")
"""
    report = verify_text(tmp_path, text)
    assert report.ok, [(r.name, r.status, r.message) for r in report.rules]
    kinds = {r.name: r.kind for r in report.rules}
    assert kinds == {"matmul-assoc": "generic", "mul-commute": "generic", "relu-push-combine": "generic"}


def test_left_hand_side_placements_come_from_guards(tmp_path: Path) -> None:
    """Variables are R unless a guard says otherwise: without `(placed x ax (S d))` the left-hand side below
    never fits (Relu of a replicated x cannot be a shard), so no case exists and the rule is unknown."""
    text = """
(rewrite (Combine (Relu x) d ax) (Relu (Combine x d ax)) :when ((placed x ax (S d)))
         :ruleset parallel :name "relu-pull-combine")
(rewrite (Combine (Relu x) d ax) (Relu (Combine x d ax))
         :ruleset parallel :name "relu-pull-combine-unguarded")
"""
    report = verify_text(tmp_path, text)
    status = {r.name: (r.status, r.kind) for r in report.rules}
    assert status["relu-pull-combine"] == ("proven", "generic")
    assert status["relu-pull-combine-unguarded"][0] == "unknown"
    (unguarded,) = [r for r in report.rules if r.name == "relu-pull-combine-unguarded"]
    assert "`placed` guard" in unguarded.message


def test_json_report_on_stdout(tmp_path: Path) -> None:
    path = write(tmp_path, '(rewrite (Sub a b) (Sub b a) :ruleset algebra :name "sub-commute")\n')
    done = subprocess.run(
        [sys.executable, "-m", "unity_eq.verify", str(path), "--json", "-", "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    data = json.loads(done.stdout)  # the human report went to stderr
    (rule,) = data["rules"]
    assert rule["status"] == "refuted" and rule["counterexample"]["kind"] == "value"
    assert data["summary"]["refuted"] == 1 and "REFUTED sub-commute" in done.stderr


def test_vector_matmul_associativity_is_refuted(tmp_path: Path) -> None:
    report = verify_text(tmp_path, '(rewrite (MatMul (MatMul a b) c) (MatMul a (MatMul b c)) :name "assoc")\n')
    refuted(report, "assoc")


# ---------------------------------------------------------------------------------- unknown and annotations


UNMIRRORED = """
(relation my-guard (T))
{annotation}
(rewrite (Relu a) (Combine (Relu (Partition a d ax)) d ax)
         :when ((my-guard a) (can-split a d ax)) :ruleset parallel :name "relu-split-custom")
"""


def test_unknown_fails_without_annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, UNMIRRORED.format(annotation=""))
    assert cli_main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "UNKNOWN relu-split-custom" in out and "my-guard" in out


def test_reviewed_annotation_accepts_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    note = "; verify: unknown-ok my-guard only narrows can-split (reviewed by A.)"
    path = write(tmp_path, UNMIRRORED.format(annotation=note))
    assert cli_main(["verify", str(path)]) == 0
    out = capsys.readouterr().out
    assert "UNKNOWN (accepted) relu-split-custom" in out and "reviewed by A." in out


def test_a_constructor_without_semantics_is_unknown_not_refuted(tmp_path: Path) -> None:
    text = """
(constructor MyOp (T) T)
(rewrite (MyOp a) (Combine (MyOp (Partition a d ax)) d ax) :when ((can-split a d ax)) :name "myop-split")
"""
    (rule,) = verify_text(tmp_path, text).rules
    assert rule.status == "unknown" and "constructor 'MyOp' has no semantics" in rule.message


def test_public_api_is_pinned() -> None:
    import unity_eq.verify as verify

    assert set(verify.__all__) == {
        "AnalysisDecl",
        "App",
        "BoundedResult",
        "Counterexample",
        "GenericResult",
        "Lit",
        "NumericResult",
        "Options",
        "Program",
        "Report",
        "Rule",
        "RuleReport",
        "RuleSource",
        "Term",
        "Var",
        "check_ops",  # the CLI's entry points (unity_eq/cli/rules.py): `check-ops`, `verify`, `generate`
        "generate_rules",
        "load_program",
        "main",
        "memory_capped",
        "parse_program",
        "render",
        "render_report",
        "run_verify",
        "shipped_rule_files",
        "verify_program",
        "verify_rules",
    }
    assert all(hasattr(verify, name) for name in verify.__all__)


def test_annotation_needs_a_reason(tmp_path: Path) -> None:
    report = verify_text(tmp_path, UNMIRRORED.format(annotation="; verify: unknown-ok"))
    assert any("needs a reason" in e and "my_rules.egg:3" in e for e in report.errors)


# ------------------------------------------------------------------------------------------ load-time errors


def load_errors(tmp_path: Path, text: str) -> list[str]:
    program, _ = load_program([write(tmp_path, text)])
    return program.errors


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("(rewrite (Relu a)\n  (Combine (Relu a) 0 ax)\n", "my_rules.egg:1:1", "never closed"),
        ('(rewrite (Relu a) a :name "r"))\n', "my_rules.egg:1:31", "unexpected ')'"),
        ('\n\n   (rewrite (Relu a) a :name "r)\n', "my_rules.egg:3:", "unterminated string"),
    ],
)
def test_syntax_errors_name_file_line_and_column(tmp_path: Path, text: str, where: str, what: str) -> None:
    (error,) = load_errors(tmp_path, text)
    assert where in error and what in error, error


def test_unbound_variables_are_rejected(tmp_path: Path) -> None:
    errors = load_errors(tmp_path, '(rewrite (Relu a) (Combine (Relu (Partition a k ax)) k ax) :name "shard-relu")\n')
    assert any(re.fullmatch(r"rule 'shard-relu' \(\S*my_rules.egg:1\) refers to unbound var k", e) for e in errors)
    assert any(re.fullmatch(r"rule 'shard-relu' \(\S*my_rules.egg:1\) refers to unbound var ax", e) for e in errors)
    errors = load_errors(tmp_path, '(rewrite (Relu a) a :when ((< d 2)) :name "guarded")\n')
    assert any("refers to unbound var d in :when" in e for e in errors)


def test_duplicate_names_are_rejected(tmp_path: Path) -> None:
    text = '(rewrite (Relu a) (Relu a) :name "same")\n(rewrite (Neg a) (Neg a) :name "same")\n'
    errors = load_errors(tmp_path, text)
    assert any(
        re.search(r"rule 'same' \(\S*my_rules.egg:2\) has the name of rule 'same' \(\S*my_rules.egg:1\)", e)
        for e in errors
    )
    # shipped names count too
    errors = load_errors(tmp_path, '(rewrite (Relu a) (Relu a) :name "relu-split")\n')
    assert any("rules/parallel/elementwise.egg" in e for e in errors)


def test_unknown_names_and_wrong_arity_are_rejected(tmp_path: Path) -> None:
    text = """
(rewrite (Relux a) (Relu a) :name "typo")
(rewrite (MatMul a) (Relu a) :name "arity")
(rewrite (Relu a) (Relu a) :when ((can-splitt a 0 ax)) :name "bad-guard")
(rewrite (Relu a) (Relu a) :ruleset nowhere :name "bad-ruleset")
"""
    errors = load_errors(tmp_path, text)
    assert any(
        re.search(r"rule 'typo' \(\S*my_rules.egg:2\) uses unknown constructor 'Relux'. Did you mean 'Relu'\?", e)
        for e in errors
    )
    assert any(
        re.search(r"rule 'arity' \(\S*my_rules.egg:3\) calls 'MatMul' with 1 argument, expected 2", e) for e in errors
    )
    assert any("'can-splitt'" in e and "Did you mean 'can-split'" in e for e in errors)
    assert any("undeclared ruleset 'nowhere'" in e for e in errors)


def test_load_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '(rewrite (Relu a) (Combine (Relu (Partition a k ax)) k ax) :name "shard-relu")\n')
    assert cli_main(["verify", str(path)]) == 2
    assert "refers to unbound var k" in capsys.readouterr().out


def test_schema_names_need_no_declaration(tmp_path: Path) -> None:
    program, targets = load_program([write(tmp_path, '(rewrite (Relu (Identity a)) (Relu a) :name "drop-identity")\n')])
    assert program.errors == [] and [r.name for r in program.rules if r.file in targets] == ["drop-identity"]


# ---------------------------------------------------------------------------------- guard mirrors vs egglog


def _egglog(extra: str) -> Any:
    egraph = bindings.EGraph()
    root = rules_dir()
    for name in ("schema.egg", "analysis.egg", "parallel/elementwise.egg", "parallel/matmul.egg"):
        egraph.run_program(*egraph.parse_program((root / name).read_text(), filename=name))
    egraph.run_program(*egraph.parse_program(extra))
    return egraph


def _holds(egraph: Any, fact: str) -> bool:
    try:
        egraph.run_program(*egraph.parse_program(f"(check {fact})"))
        return True
    except bindings.EggSmolError:
        return False


def _ivec(shape: tuple[int, ...]) -> str:
    return f"(vec-of {' '.join(map(str, shape))})" if shape else "(vec-empty)"


def _guard(text: str) -> Any:
    program = parse_program(
        [RuleSource("guard.egg", f"(rewrite (Relu z) (Relu z) :when ({text}))")],
        [RuleSource(f"rules/{n}", (rules_dir() / n).read_text()) for n in ("schema.egg", "analysis.egg")],
    )
    assert program.errors == [] and program.rules, program.errors
    return program.rules[-1].guards[0]


@pytest.mark.parametrize("op", ["MatMul", "Add", "Where"])
def test_guard_mirrors_agree_with_analysis_egg(op: str) -> None:
    """On sampled instances, each relation the rules use holds in Python exactly when egglog derives it."""
    names = "abc"
    for i, (args, out) in enumerate(op_instances(op)[::9][:8]):
        n_axis = 2 + i % 3
        tensors = [a for a in args if isinstance(a, VarSpec)]
        vars_ = names[: len(tensors)]
        term = f"({op} {' '.join(vars_)})"
        lines = [f'(mesh-axis "x" {n_axis})', '(axes-1 "x")', *(f"(dim-range {d})" for d in range(8))]
        lines += [f'(set (shape (Input "{v}")) {_ivec(spec.shape)})' for v, spec in zip(vars_, tensors, strict=True)]
        inputs = " ".join(f'(Input "{v}")' for v in vars_)
        lines += [
            f"(let $e ({op} {inputs}))",
            f"(set (shape $e) {_ivec(out)})",
            "(run-schedule (saturate (run analysis)))",
        ]
        egraph = _egglog("\n".join(lines))
        checks = [(f"(can-split {v} d ax)", f'(can-split (Input "{v}") {{d}} "x")') for v in vars_]
        if op == "MatMul":
            checks += [(f"({r} {term} d e)", f"({r} $e {{d}} {{e}})") for r in ("mm-row", "mm-col", "mm-k")]
            checks.append((f"(mm-batch {term} d e f)", "(mm-batch $e {d} {e} {f})"))
        else:
            for v in vars_:
                checks.append((f"(bc-dim {v} {term} d e)", f'(bc-dim (Input "{v}") $e {{d}} {{e}})'))
                checks.append((f"(bc-bcast {v} {term} d)", f'(bc-bcast (Input "{v}") $e {{d}})'))
        sorts = {v: "T" for v in vars_} | {"d": "i64", "e": "i64", "f": "i64", "ax": "String"}
        specs = dict(zip(vars_, tensors, strict=True))
        ctx = GuardContext(("x",), {"x": n_axis}, sorts, specs, {}, Placements(("x",)), FACTS)
        for python_text, egg_text in checks:
            ints = [v for v in ("d", "e", "f") if "{" + v + "}" in egg_text]
            holds = {tuple(b[v] for v in ints) for b in solve_guards([_guard(python_text)], {}, ctx)}
            for combo in itertools.product(range(4), repeat=len(ints)):
                fact = egg_text.format(**dict(zip(ints, combo, strict=True)))
                assert _holds(egraph, fact) == (combo in holds), f"{op} {[t.shape for t in tensors]}: {fact}"


# ------------------------------------------------------------------------------------------ applicability filters


def test_applicability_filter_is_left_out_of_the_proof(tmp_path: Path) -> None:
    """`merge-operand` only narrows where a rule applies: a sound rule under it is proven, an unsound one
    is still refuted (the filter cannot make a wrong rule pass)."""
    sound = """(rule ((= r0 (MatMul a b)) (= r1 (MatMul a c)) (= 2 (vec-length (shape a)))
       (= 2 (vec-length (shape b))) (= 2 (vec-length (shape c))) (= n1 (vec-get (shape b) 1))
       (= n2 (vec-get (shape c) 1)) (merge-operand b b-lo b-hi) (merge-operand c c-lo c-hi) (< b-hi c-lo))
      ((union r0 (Split (MatMul a (Concat (TCons b (TCons c (TNil))) 1)) (vec-of n1 n2) 1 0))
       (union r1 (Split (MatMul a (Concat (TCons b (TCons c (TNil))) 1)) (vec-of n1 n2) 1 1)))
      :ruleset algebra :name "filtered-merge")
"""
    unsound = """(rule ((= r0 (Relu a)) (merge-operand a lo hi)) ((union r0 a)) :ruleset algebra :name "filtered-wrong")
"""
    report = verify_text(tmp_path, sound + unsound)
    status = {r.name: r.status for r in report.rules}
    assert status == {"filtered-merge": "proven", "filtered-wrong": "refuted"}


def test_a_filter_number_used_outside_the_filter_is_a_load_error(tmp_path: Path) -> None:
    errors = load_errors(
        tmp_path,
        '(rule ((= r0 (Split a s k i)) (merge-operand a lo hi)) ((union r0 (Split a s k lo))) :name "leak")\n',
    )
    assert any("lo" in e and "applicability filter" in e for e in errors), errors


def test_a_proof_with_uninterpreted_functions_serves_its_instances_only(tmp_path: Path) -> None:
    """pow-split proves add-split (Pow is an uninterpreted function: the rule holds for every function, so
    for +); a rule that needs a property of Add (commutativity) is refuted for Pow and proven on its own."""
    text = """
(rewrite (Pow a b) (Pow b a) :ruleset algebra :name "pow-comm")
(rewrite (Add a b) (Add b a) :ruleset algebra :name "add-comm")
(rewrite (Pow (Relu a) (Relu b)) (Relu (Pow a b)) :ruleset algebra :name "pow-relu-wrong")
(rewrite (Add (Relu a) (Relu b)) (Relu (Add a b)) :ruleset algebra :name "add-relu-wrong")
"""
    report = verify_text(tmp_path, text, generic=False, numeric=False)
    by = {r.name: r for r in report.rules}
    assert by["pow-comm"].status == "refuted" and by["add-comm"].status == "proven"
    assert by["add-comm"].bounded is not None and "instance" not in by["add-comm"].bounded.reason
    assert by["pow-relu-wrong"].status == "refuted" and by["add-relu-wrong"].status == "refuted"


def test_a_budget_that_stops_early_is_partial_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bounded check cut off by `--budget` is not a proof: `partial`, exit 1, unless a reviewer annotated
    the rule; without a budget the same rule is proven on every case."""
    rule = '(rewrite (Relu (Transpose a p)) (Transpose (Relu a) p) :ruleset algebra :name "relu-transpose")\n'
    path = write(tmp_path, rule)
    assert cli_main(["verify", str(path), "--jobs", "1", "--budget", "5", "--no-generic", "--no-numeric"]) == 1
    assert "partial" in capsys.readouterr().out
    report = verify_text(tmp_path, rule, generic=False, numeric=False)
    (r,) = report.rules
    assert r.status == "proven" and r.bounded is not None and r.bounded.checked == r.bounded.enumerated > 5
    write(tmp_path, "; verify: unknown-ok reviewed: cut short on purpose\n" + rule, "annotated.egg")
    args = ["verify", str(tmp_path / "annotated.egg"), "--jobs", "1", "--budget", "5", "--no-generic", "--no-numeric"]
    assert cli_main(args) == 0
    assert "partial*" in capsys.readouterr().out


def test_same_polynomial_proves_only_identities() -> None:
    """The bounded check's shortcut before the solver: a sum-of-monomials difference of 0 proves a pair;
    anything else is left to the solver (never a proof of an unequal pair)."""
    import z3

    from unity_eq.verify._tensor import Z3Backend, same_polynomial

    bk = Z3Backend()
    x0, x1, y, z = (bk.symbol(n) for n in ("sp.x0", "sp.x1", "sp.y", "sp.z"))
    lhs = bk.mul(bk.total([x0, x1]), y)  # the all-reduced pieces times a replicated operand
    rhs = bk.total([bk.mul(x0, y), bk.mul(x1, y)])  # the pieces' products, all-reduced
    assert lhs is not rhs and not z3.is_true(z3.simplify(lhs == rhs))
    assert same_polynomial(lhs, rhs) and same_polynomial(lhs, rhs)  # the second answer is the memo's
    assert not same_polynomial(bk.mul(x0, y), bk.total([bk.mul(y, x0), 1]))
    assert not same_polynomial(bk.mul(x0, y), bk.mul(x0, z))
    assert not same_polynomial(bk.symbol("sp.i", integer=True), x0)  # an index is never a value
    f = bk.function("sp.f", 1)
    assert not same_polynomial(f(bk.total([x0, x1])), bk.total([f(x0), f(x1)]))


def test_without_a_generic_proof_every_case_decides(tmp_path: Path) -> None:
    """A transpose applied twice is the identity only for involutive perms: every perm of rank ≤ 2 is one, so
    the smallest cases all hold, and the counterexample (a rank-3 cycle) lies beyond a small cross-check.
    The generic proof fails, so the bounded check must go on to every case and refute it."""
    rule = '(rewrite (Transpose (Transpose a p) p) a :ruleset algebra :name "transpose-twice")\n'
    report = verify_text(tmp_path, rule, cross_check=5, numeric=False)
    cex = refuted(report, "transpose-twice")
    assert report.rules[0].bounded.checked > 5, report.rules[0].bounded  # found past the first 5 cases
    assert cex.kind == "shape" or cex.lhs != cex.rhs


def test_negative_cross_check_or_budget_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '(rewrite (Relu a) (Relu a) :ruleset algebra :name "same")\n')
    for flag in ("--cross-check", "--budget"):
        assert cli_main(["verify", str(path), flag, "-1"]) == 2
        captured = capsys.readouterr()
        assert flag in captured.out + captured.err and "Traceback" not in captured.out + captured.err
    done = subprocess.run(
        [sys.executable, "-m", "unity_eq.verify", str(path), "--cross-check", "-1"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--cross-check: expected 0 or more, got -1" in done.stderr


@pytest.mark.parametrize(
    ("sa", "sb", "want"),
    [
        ((1, 1, 1), (2, 1, 1), None),  # broadcast batch dims: no shape (it was a's, [1, 1, 1]; it is [2, 1, 1])
        ((2, 3, 4), (2, 4, 5), (2, 3, 5)),
        ((2, 3, 4), (4, 5), (2, 3, 5)),
        ((3, 4), (2, 4, 5), (2, 3, 5)),
    ],
)
def test_analysis_gives_a_created_matmul_its_broadcast_shape(
    sa: tuple[int, ...], sb: tuple[int, ...], want: tuple[int, ...] | None
) -> None:
    """A MatMul that a rule creates gets its shape from analysis.egg; the batch dims broadcast, so a's shape
    with the last dim replaced is right only where b's batch dims equal a's or are absent (`unity-eq verify`
    refuted the old declaration: a [1, 1, 1] @ b [2, 1, 1])."""
    lines = [f'(set (shape (Input "a")) {_ivec(sa)})', f'(set (shape (Input "b")) {_ivec(sb)})']
    lines += ['(let $e (MatMul (Input "a") (Input "b")))', "(run-schedule (saturate (run analysis)))"]
    egraph = _egglog("\n".join(lines))
    wrong = (*sa[:-1], sb[-1])
    if want is None:
        assert not _holds(egraph, f"(= (shape $e) {_ivec(wrong)})")
    else:
        assert _holds(egraph, f"(= (shape $e) {_ivec(want)})")


def test_a_rank_pinned_by_a_guard_prunes_the_search_not_the_cases() -> None:
    """A guard ``(= 4 (vec-length (shape q)))`` makes the generator drop other ranks of ``q`` where it binds
    it (rules/algebra/attention_exports.egg: five nested ops, millions of left-hand sides otherwise): the
    bindings left are exactly those of the full search whose ``q`` has that rank, in the same order."""
    from unity_eq.verify._gen import generate_lhs, rank_facts

    program = parse_program(
        [RuleSource("pin.egg", "(rewrite (Relu (MatMul (Softmax q 2) k)) (Relu (MatMul (Softmax q 2) k))"
                               " :when ((= 3 (vec-length (shape q))) (= (vec-length (shape k)) 2)))")],
        [RuleSource(f"rules/{n}", (rules_dir() / n).read_text()) for n in ("schema.egg", "analysis.egg")],
    )  # fmt: skip
    assert program.errors == []
    rule = program.rules[-1]
    facts = rank_facts(rule.guards, rule.lhs, rule.var_sorts)
    assert set(facts.component_of) == {"q", "k"}
    full = list(generate_lhs(rule.lhs, rule.var_sorts, ()))
    pruned = list(generate_lhs(rule.lhs, rule.var_sorts, (), facts=facts))
    kept = [b for b in full if len(b["q"].shape) == 3 and len(b["k"].shape) == 2]
    assert pruned == kept and len(kept) < len(full) / 2, (len(pruned), len(kept), len(full))
