"""Proof certificates: a rule fires only where it was proven (unity_eq/rulefile/certificate.py).

The domains are the ones the verifier wrote from its own enumeration (no hand-made certificate is trusted by
the engine tests), and firing is observed in egglog itself, on the text the engine loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import egglog.bindings as bindings
import pytest
from rich.console import Console

from unity_eq.rulefile.certificate import OPT_OUT, certificate_path, load_certificate
from unity_eq.rulefile.domain import component_value, domain_components
from unity_eq.rulefile.load import load_program
from unity_eq.rulefile.manifest import load_rule_files, rules_dir
from unity_eq.verify import Options
from unity_eq.verify._cli import run as run_verify

RULES = """\
; a user's rules
(rewrite (Relu (Identity a)) (Relu a)
         :ruleset algebra :name "drop-identity-under-relu")
(rewrite (Softmax (Identity a) ax) (Softmax a ax)
         :ruleset algebra :name "drop-identity-under-softmax")
"""


def test_shipped_certificate_matches_the_shipped_rules() -> None:
    """The fast half of CI's check (no proving): every shipped rule has an entry for its current text, no
    entry names a rule that is gone, and each bounded domain has the components its rule has now. A rule
    edited without `unity-eq verify --write-certificate` fails here (and would not fire)."""
    program, targets = load_program(engine=False)
    cert = load_certificate(rules_dir() / "proofs.json")
    shipped = {r.name: r for r in program.rules if r.file in targets}
    assert sorted(cert.rules) == sorted(shipped), "rules/proofs.json names other rules than the shipped ones"
    stale = [name for name, rule in shipped.items() if cert.rules[name]["digest"] != rule.digest]
    assert not stale, f"rules/proofs.json is stale for {stale}: run `unity-eq verify --write-certificate`"
    for name, entry in cert.rules.items():
        assert entry["proof"] in ("generic", "bounded", "accepted"), name
        if entry["proof"] == "bounded":
            assert entry["components"] == [list(c) for c in domain_components(shipped[name])], name
            assert entry["rows"], name


def _verify(path: Path, write: bool = True) -> tuple[int, str]:
    console = Console(record=True, width=300)
    code = run_verify([path], options=Options(jobs=1), out=console, write_certificate=write)
    return code, console.export_text()


def _fires(rule_file: Path, rank: int, dtype: str = "float32") -> bool:
    """Whether ``drop-identity-under-relu`` rewrites ``Relu(Identity(x))`` for an ``x`` of this rank and
    dtype, with the rule files as the engine loads them (schema, analyses, certificate guards)."""
    egraph = bindings.EGraph()
    for f in load_rule_files([rule_file]):
        egraph.run_program(*egraph.parse_program(f.text, filename=str(f.path)))
    dims = " ".join(["2"] * rank)
    egraph.run_program(
        *egraph.parse_program(
            f'(let $x (Input "x")) (set (shape $x) (vec-of {dims})) (set (dtype $x) "{dtype}")'
            "(let $e (Relu (Identity $x)))"
            "(run-schedule (saturate (run analysis)) (run algebra) (saturate (run analysis)))"
        )
    )
    try:
        egraph.run_program(*egraph.parse_program("(check (= $e (Relu $x)))"))
    except bindings.EggSmolError:
        return False
    return True


def test_bounded_rule_fires_only_inside_the_domain_its_proof_enumerated(tmp_path: Path) -> None:
    """The verifier proves the rule on free tensors of rank 0-4 (docs/verify.md's ranges) and not
    generically, so it fires on rank 0-4 float tensors, and not on rank 5, nor on integer or bool tensors
    (the semantics are over the reals)."""
    path = tmp_path / "my.egg"
    path.write_text(RULES)
    code, text = _verify(path)
    assert code == 0, text
    assert "within a: float rank 0-4" in text
    cert = json.loads((tmp_path / "my.proofs.json").read_text())
    entry = cert["rules"]["drop-identity-under-relu"]
    assert entry["proof"] == "bounded" and entry["rows"] == [[0], [1], [2], [3], [4]]
    assert [_fires(path, rank) for rank in range(6)] == [True] * 5 + [False]
    assert not _fires(path, 2, "int64") and not _fires(path, 2, "bool")


def test_rule_without_a_current_certificate_is_left_out_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mine.egg"
    path.write_text(RULES)
    assert not _fires(path, 2)
    err = capsys.readouterr().err
    assert err.count("mine.egg: 2 rule(s) left out") == 1
    assert f"unity-eq verify {tmp_path / 'mine.egg'} --write-certificate" in err
    monkeypatch.setenv(OPT_OUT, "1")  # the experiment's opt-out
    assert _fires(path, 2)
    monkeypatch.delenv(OPT_OUT)
    assert _verify(path)[0] == 0
    assert _fires(path, 2)
    path.write_text(RULES.replace(":ruleset algebra :name", "; moved\n :ruleset algebra :name", 1))
    assert _fires(path, 2), "a change of layout or comments keeps the digest"
    # an edited rule's entry is stale: it no longer fires, and verify (without writing) says so
    path.write_text(RULES.replace("(Relu a)\n", "(Relu a) :when ((= r (vec-length (shape a))))\n", 1))
    assert not _fires(path, 2)
    code, text = _verify(path, write=False)
    assert code == 0 and "mine.proofs.json has no current entry for 1 rule (drop-identity-under-relu)" in text


def test_certificate_of_a_user_file_is_beside_it(tmp_path: Path) -> None:
    assert certificate_path(tmp_path / "a.egg", rules_dir()) == tmp_path / "a.proofs.json"
    assert certificate_path(rules_dir() / "parallel" / "matmul.egg", rules_dir()) == rules_dir() / "proofs.json"


def test_component_values() -> None:
    from unity_eq.verify._semantics import VarSpec

    assert component_value("tensor", None) == -1
    assert component_value("tensor", VarSpec((2, 3))) == 2
    assert component_value("tensor", VarSpec((2,), integer=True)) == 101
    assert component_value("length", (0, 2, 1)) == 3
    assert component_value("String", "SAME_UPPER") == "SAME_UPPER"


def test_stale_shipped_entry_fails_the_run() -> None:
    """What CI's `unity-eq verify` does when rules/proofs.json does not say what a run proved: the shipped
    certificate is stale (the verb then exits 1). Here a run's report for relu-split with another text."""
    from unity_eq.verify._certify import certify
    from unity_eq.verify._verify import RuleReport

    current = load_certificate(rules_dir() / "proofs.json").rules["relu-split"]
    edited = RuleReport("relu-split", "rules/parallel/elementwise.egg", 5, "proven", "generic", 0.0, digest="0" * 16)
    (check,) = certify([edited], write=False, complete=False)
    assert check.shipped and check.stale == ["relu-split"]
    same = RuleReport("relu-split", "rules/parallel/elementwise.egg", 5, "proven", "generic", 0.0)
    same.digest = current["digest"]
    assert certify([same], write=False, complete=False)[0].stale == []
    refuted = RuleReport("relu-split", "rules/parallel/elementwise.egg", 5, "refuted", "bounded", 0.0)
    refuted.digest = current["digest"]
    assert certify([refuted], write=False, complete=False)[0].stale == ["relu-split"]


def test_a_certificate_narrower_than_the_proof_is_noted_not_stale(tmp_path: Path) -> None:
    """A rule certified bounded that a run proves generically (its generic proof timed out on a loaded
    machine when the certificate was written) is not stale: the engine is only more careful than needed."""
    path = tmp_path / "g.egg"
    path.write_text(
        "(rewrite (Relu a) (Combine (Relu (Partition a d ax)) d ax)\n"
        '         :when ((can-split a d ax)) :ruleset parallel :name "my-relu-split")\n'
    )
    code, text = _verify(path)
    assert code == 0 and "for all" in text, text
    cert_path = tmp_path / "g.proofs.json"
    data = json.loads(cert_path.read_text())
    entry = data["rules"]["my-relu-split"]
    entry.update(proof="bounded", components=[["a", "tensor"]], rows=[[2]], mesh_sizes=[1, 2])
    cert_path.write_text(json.dumps(data))
    code, text = _verify(path, write=False)
    assert code == 0 and "certifies 1 rule only within a domain" in text, text
    assert "no current entry" not in text


def test_write_certificate_for_named_rules_keeps_the_other_entries(tmp_path: Path) -> None:
    """`unity-eq verify FILE --rule NAME --write-certificate` proves NAME alone and merges its entry: the
    entries of the file's other rules stay as they were (how a new shipped rule is certified without
    re-proving the whole rule set)."""
    path = tmp_path / "two.egg"
    path.write_text(RULES)
    cert_path = tmp_path / "two.proofs.json"

    def write(names: list[str]) -> dict[str, Any]:
        console = Console(record=True, width=300)
        code = run_verify([path], names, options=Options(jobs=1), out=console, write_certificate=True)
        assert code == 0, console.export_text()
        return dict(json.loads(cert_path.read_text())["rules"])

    first = write(["drop-identity-under-relu"])
    assert sorted(first) == ["drop-identity-under-relu"]
    both = write(["drop-identity-under-softmax"])
    assert sorted(both) == ["drop-identity-under-relu", "drop-identity-under-softmax"]
    assert both["drop-identity-under-relu"] == first["drop-identity-under-relu"]


def test_writing_some_rules_merges_their_entries_and_keeps_the_others(tmp_path: Path) -> None:
    """`unity-eq verify --rule NAME --write-certificate` (and a run over some shipped files) rewrites only the
    entries of the rules it verified: a changed rule's entry is regenerated without proving every other rule
    again. A run over a whole user file (``complete``) drops the entries of rules it no longer has."""
    from unity_eq.rulefile.certificate import Certificate, write_certificate
    from unity_eq.verify._certify import certify
    from unity_eq.verify._verify import RuleReport

    rule_file = tmp_path / "mine.egg"
    rule_file.write_text("")
    path = certificate_path(rule_file, rules_dir())
    old = {"digest": "1" * 16, "proof": "generic"}
    kept = {"digest": "2" * 16, "proof": "bounded", "components": [["a", "tensor"]], "rows": [[2]], "mesh_sizes": [1]}
    write_certificate(Certificate(path, {"changed": old, "other": kept}))
    report = RuleReport("changed", str(rule_file), 1, "proven", "generic", 0.0, digest="3" * 16)
    (check,) = certify([report], write=True, complete=False)
    assert check.stale == ["changed"] and check.written == 2
    assert load_certificate(path).rules == {"changed": {"digest": "3" * 16, "proof": "generic"}, "other": kept}
    (check,) = certify([report], write=True, complete=True)
    assert load_certificate(path).rules == {"changed": {"digest": "3" * 16, "proof": "generic"}}


def test_a_rule_stating_facts_beside_its_unions_never_fires_even_with_an_entry(tmp_path: Path) -> None:
    """Such a rule was once proven by its unions alone (its facts unchecked) and could have a certificate entry
    from then: the entry is void, so the rule is left out (verify now refuses to load it)."""
    from unity_eq.rulefile.certificate import Certificate, _commands, guard_text
    from unity_eq.rulefile.sexp import command_digest

    text = '(rule ((= e (Relu a))) ((union e (Relu a)) (nonzero-values e)) :ruleset algebra :name "smuggle")\n'
    ((_start, _end, cmd),) = _commands(text, "mine.egg")
    cert = Certificate(tmp_path / "mine.proofs.json", {"smuggle": {"digest": command_digest(cmd), "proof": "generic"}})
    guarded = guard_text(text, "mine.egg", cert)
    assert guarded.skipped == ["smuggle"]
    fine = text.replace(" (nonzero-values e)", "")
    ((_start, _end, cmd),) = _commands(fine, "mine.egg")
    cert = Certificate(tmp_path / "mine.proofs.json", {"smuggle": {"digest": command_digest(cmd), "proof": "generic"}})
    assert guard_text(fine, "mine.egg", cert).skipped == []


CONCAT_RULE = '(rewrite (Concat l 3) (Concat l -1) :ruleset algebra :name "concat-axis3-is-last")\n'


def _concat_fires(rule_file: Path, ranks: list[int]) -> bool:
    """Whether ``concat-axis3-is-last`` rewrites a Concat along axis 3 of tensors of these ranks."""
    egraph = bindings.EGraph()
    for f in load_rule_files([rule_file]):
        egraph.run_program(*egraph.parse_program(f.text, filename=str(f.path)))
    lets = "".join(
        f'(let $x{i} (Input "x{i}")) (set (shape $x{i}) (vec-of {" ".join(["2"] * r)})) (set (dtype $x{i}) "float32")'
        for i, r in enumerate(ranks)
    )
    items = "(TNil)"
    for i in reversed(range(len(ranks))):
        items = f"(TCons $x{i} {items})"
    egraph.run_program(
        *egraph.parse_program(
            f"{lets}(let $e (Concat {items} 3))"
            "(run-schedule (saturate (run analysis)) (run algebra) (saturate (run analysis)))"
        )
    )
    try:
        egraph.run_program(*egraph.parse_program(f"(check (= $e (Concat {items} -1)))"))
    except bindings.EggSmolError:
        return False
    return True


def test_a_list_variable_fires_only_on_lists_of_the_ranks_its_proof_took(tmp_path: Path) -> None:
    """A ``TList`` variable's elements' class is part of the domain (the engine's ``tlkind``): "axis 3 is the
    last" holds at rank 4, which the verifier's lists take, and is wrong at rank 5, which they do not; without
    the component the rule, proven on rank-4 lists, fired on rank-5 ones (issue 21, sixth adversary)."""
    from unity_eq.verify._semantics import VarSpec

    assert component_value("tensors", [VarSpec((2, 3)), VarSpec((2, 2))]) == 2
    assert component_value("tensors", [VarSpec((2,)), VarSpec((2, 2))]) == -2
    assert component_value("tensors", []) == -1
    path = tmp_path / "concat.egg"
    path.write_text(CONCAT_RULE)
    code, text = _verify(path)
    assert code == 0, text
    entry = json.loads((tmp_path / "concat.proofs.json").read_text())["rules"]["concat-axis3-is-last"]
    assert entry["components"] == [["l", "tensors"]] and entry["rows"] == [[4]], entry
    assert _concat_fires(path, [4, 4]) and _concat_fires(path, [4])
    assert not _concat_fires(path, [5, 5]) and not _concat_fires(path, [5])
