"""Proof certificates from a verify run: ``--write-certificate`` writes them, every other run compares.

The certificate (:mod:`unity_eq.rulefile.certificate`) holds, per rule, what its proof covers; the engine
fires a rule only inside it. A run that proves rules compares what it proved with the certificate of each
rule's file: a shipped rule whose entry differs (its text changed, its domain grew or shrank because the
instance spaces changed, a generic proof was lost) makes the run fail with the one command that fixes it, so
CI (``unity-eq verify``) fails while ``rules/proofs.json`` is stale. A user's file gets a note instead: its
rules are left out of ``optimize`` until its certificate is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unity_eq.rulefile.certificate import (
    CERTIFICATE_NAME,
    Certificate,
    certificate_path,
    load_certificate,
    write_certificate,
)
from unity_eq.rulefile.manifest import rules_dir
from unity_eq.verify._verify import RuleReport

__all__ = ["CertificateCheck", "certify"]


@dataclass
class CertificateCheck:
    """Per certificate file: the rules whose entry differs from this run's proofs (``stale``), and whether
    the file is the shipped one (whose staleness fails the run)."""

    path: Path
    stale: list[str] = field(default_factory=list)
    narrower: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)  # certified generic, proven bounded only this run
    written: int = 0

    @property
    def shipped(self) -> bool:
        return self.path.resolve() == (rules_dir() / CERTIFICATE_NAME).resolve()


def _rule_path(display: str) -> Path:
    root = rules_dir().parent
    for candidate in (root / display, Path(display)):
        if candidate.exists():
            return candidate
    return Path(display)


def _narrower(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """The certificate says less than this run proved: bounded there, generic now (a generic proof that
    timed out on a loaded machine when the certificate was written). The engine is only more careful than it
    could be, so this is not stale; writing the certificate again lets the rule fire everywhere."""
    return (
        old is not None
        and new is not None
        and old.get("digest") == new.get("digest")
        and old.get("proof") == "bounded"
        and new.get("proof") == "generic"
    )


def _generic_timed_out(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """The certificate records a generic proof of this very text, and this run proved it bounded only: z3's
    generic proof has a wall-clock limit, so on a loaded machine it can time out where it held when the
    certificate was written. The rule is still proven (this run's bounded check passed, and the generic proof
    of the same text exists), so this is a note, not staleness: CI must not fail on the machine's load."""
    return (
        old is not None
        and new is not None
        and old.get("digest") == new.get("digest")
        and old.get("proof") == "generic"
        and new.get("proof") == "bounded"
    )


def certify(rules: Sequence[RuleReport], write: bool, complete: bool) -> list[CertificateCheck]:
    """Compare (or, with ``write``, update) the certificate of every file of ``rules``. ``complete``: the run
    verified every rule of those files, so entries of rules it did not see (deleted rules) are dropped when
    writing, and are stale otherwise."""
    by_cert: dict[Path, list[RuleReport]] = {}
    for r in rules:
        if r.analysis:  # analysis declarations rewrite nothing: the engine has nothing to guard
            continue
        by_cert.setdefault(certificate_path(_rule_path(r.file), rules_dir()), []).append(r)
    out = []
    for path, reports in sorted(by_cert.items()):
        cert = load_certificate(path)
        check = CertificateCheck(path)
        fresh = Certificate(path, {} if complete else dict(cert.rules))
        for r in reports:
            entry = r.certificate_entry()
            if entry is None:
                fresh.rules.pop(r.name, None)
            else:
                fresh.rules[r.name] = entry
            old = cert.rules.get(r.name)
            if old != entry and not (_narrower(old, entry) or _generic_timed_out(old, entry)):
                check.stale.append(r.name)
            elif _generic_timed_out(old, entry):
                check.timed_out.append(r.name)
            elif old != entry:
                check.narrower.append(r.name)
        if complete:
            check.stale += sorted(set(cert.rules) - {r.name for r in reports})
        if write:
            write_certificate(fresh)
            check.written = len(fresh.rules)
        out.append(check)
    return out
