"""What ``unity-eq verify`` reports: the options it ran with, the verdict on each rule, and the whole run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from unity_eq.rulefile.domain import describe_domain
from unity_eq.verify._bounded import (
    BoundedResult,
    Counterexample,
)
from unity_eq.verify._generic import GenericResult
from unity_eq.verify._numeric import NumericResult


@dataclass(frozen=True)
class Options:
    """How hard to try. ``budget``: the smallest case of at most this many signatures per rule (every primary
    class once; ``None``: every case of the ranges, the only setting that proves unless the signatures hold
    every case; a budget that leaves cases out makes the rule ``partial``);
    ``cross_check``: when the generic proof holds, the bounded check runs on the smallest case of each
    signature, at most this many (every primary class once), as a check of the axioms (``None``: every case,
    as for a rule without a generic proof);
    ``timeout_ms``: z3 per case; ``jobs``: worker processes (0: one per CPU)."""

    generic: bool = True
    bounded: bool = True
    numeric: bool = True
    budget: int | None = None
    cross_check: int | None = 1000
    sizes: tuple[int, ...] = (1, 2, 3, 4)
    timeout_ms: int = 2000
    generic_timeout_ms: int = 500
    numeric_cases: int = 6
    jobs: int = 0


@dataclass
class RuleReport:
    """The verdict on one rule."""

    name: str
    file: str
    line: int
    status: str  # proven | refuted | partial | unknown
    kind: str  # generic | bounded | numeric | none
    seconds: float
    generic: GenericResult | None = None
    bounded: BoundedResult | None = None
    numeric: NumericResult | None = None
    annotation: str | None = None
    message: str = ""
    direction: str = ""
    integer: list[tuple[str, str]] = field(default_factory=list)  # (dtypes, status) of the integer checks
    digest: str = ""
    #: an analysis declaration checked against its relations' meaning (verify._analysis): it derives facts and
    #: rewrites nothing, so it has no certificate entry (the engine guards rewrites only)
    analysis: bool = False
    domain: dict[str, Any] | None = None  # what a bounded proof covered (certificate_entry)
    size_readers: list[str] = field(default_factory=list)  # what reads sizes a domain does not bound
    sweep: NumericResult | None = None  # the size sweep of a bounded proof that reads sizes (verify/_sizes.py)

    def certificate_entry(self) -> dict[str, Any] | None:
        """The rule's entry in a proof certificate (unity_eq.rulefile.certificate), or None when nothing
        lets it fire (refuted, or unknown or partial without a reviewed annotation)."""
        if self.status == "proven" and self.kind == "generic":
            return {"digest": self.digest, "proof": "generic"}
        if self.status == "proven" and self.kind == "bounded" and self.domain is not None:
            return {"digest": self.digest, "proof": "bounded", **self.domain}
        if self.ok:
            return {"digest": self.digest, "proof": "accepted", "reason": self.annotation or ""}
        return None

    @property
    def covers(self) -> str:
        """``for all`` (generic), ``within <domain>`` (bounded), or what else lets the rule fire."""
        entry = self.certificate_entry()
        if entry is None or self.analysis:  # an analysis declaration rewrites nothing: no certificate entry
            return ""
        if entry["proof"] == "generic":
            return "for all"
        if entry["proof"] == "bounded":
            sizes = f"; sizes read by: {', '.join(self.size_readers)}" if self.size_readers else ""
            if self.sweep is not None:
                sizes += (
                    f" (evaluated at dims 1-6 on {self.sweep.cases} more cases, no mismatch)"
                    if self.sweep.cases
                    else " (the size sweep reached no case of its guards at dims 1-6)"
                )
            return "within " + describe_domain(entry) + sizes
        return "accepted after review"

    @property
    def ok(self) -> bool:
        return self.status == "proven" or (self.status in ("unknown", "partial") and bool(self.annotation))

    @property
    def counterexample(self) -> Counterexample | None:
        if self.bounded and self.bounded.counterexample:
            return self.bounded.counterexample
        if self.numeric and self.numeric.counterexample and self.numeric.status == "failed":
            return self.numeric.counterexample
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "status": self.status,
            "kind": self.kind,
            "ok": self.ok,
            "seconds": round(self.seconds, 4),
        }
        if self.message:
            out["message"] = self.message
        if self.annotation:
            out["annotation"] = self.annotation
        if self.covers:
            out["covers"] = self.covers
        if self.generic is not None:
            out["generic"] = {
                "status": self.generic.status,
                "premises": self.generic.premises,
                "proven": self.generic.proven,
                "goals": self.generic.goals,
                "reason": self.generic.reason,
                "seconds": round(self.generic.seconds, 4),
            }
        if self.bounded is not None:
            b = self.bounded
            out["bounded"] = {
                "status": b.status,
                "cases_enumerated": b.enumerated,
                "classes": b.classes,
                "cases_checked": b.checked,
                "reason": b.reason,
                "seconds": round(b.seconds, 4),
            }
        if self.numeric is not None:
            out["numeric"] = {
                "status": self.numeric.status,
                "cases": self.numeric.cases,
                "max_relative_error": self.numeric.max_error,
                "float32_evaluations": self.numeric.float32,
                "seconds": round(self.numeric.seconds, 4),
            }
        if self.integer:
            out["integer"] = [{"dtypes": d, "status": st} for d, st in self.integer]
        cex = self.counterexample
        if cex is not None:
            out["counterexample"] = cex.to_json()
        return out


@dataclass
class Report:
    rules: list[RuleReport] = field(default_factory=list)
    analyses: int = 0
    files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.ok for r in self.rules)

    def count(self, status: str) -> int:
        return sum(1 for r in self.rules if r.status == status)

    def median_seconds(self) -> float:
        return statistics.median(r.seconds for r in self.rules) if self.rules else 0.0

    def to_json(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for r in self.rules:
            if r.status == "proven":
                kinds[r.kind] = kinds.get(r.kind, 0) + 1
        return {
            "ok": self.ok,
            "files": self.files,
            "errors": self.errors,
            "rules": [r.to_json() for r in self.rules],
            "summary": {
                "rules": len(self.rules),
                "proven": self.count("proven"),
                "proven_by_kind": kinds,
                "refuted": self.count("refuted"),
                "partial": self.count("partial"),
                "unknown": self.count("unknown"),
                "analysis_declarations": self.analyses,
                "seconds": round(self.seconds, 3),
                "median_seconds_per_rule": round(self.median_seconds(), 4),
                "assumes": "values are reals; inputs are NaN-free and finite (docs/verify.md)",
            },
        }
