"""The ``verify`` verb: ``unity-eq verify [PATHS...]`` and ``python -m unity_eq.verify``.

Prints one row per rule (status, kind of proof, time, name, file:line), then the details of every rule that
is not proven, then a summary. Exit status: 0 iff every rule is proven (or unknown with a reviewed
``; verify: unknown-ok <reason>`` annotation), 1 when a rule is refuted or unknown, 2 when a file does not
load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from unity_eq.verify._verify import Options, Report, RuleReport, verify_rules

__all__ = ["main", "render", "run"]

#: what every proof assumes, printed under the summary (docs/verify.md, "NaN and float rounding")
NAN_FREE = (
    "note: proofs are over the reals and assume NaN-free, finite inputs and values that do not overflow (float16 "
    "does at 65504; a rule right only because NaN never occurs is proven) and do not tell -0 from +0; float32 "
    "rounding is checked where it feeds a discrete op (docs/verify.md)"
)

_STYLE = {"proven": "green", "refuted": "bold red", "partial": "yellow", "unknown": "yellow"}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _value(x: Any, limit: int = 300) -> str:
    text = json.dumps(x) if not isinstance(x, str) else x
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _details(r: RuleReport, out: Console) -> None:
    where = f"{r.file}:{r.line}"
    accepted = r.status in ("unknown", "partial") and r.annotation
    label = f"{r.status.upper()} (accepted)" if accepted else r.status.upper()
    direction = f", {r.direction}" if r.direction else ""
    out.print(f"[{_STYLE[r.status]}]{label}[/] [bold]{escape(r.name)}[/] ({escape(where)}{direction})")
    if r.annotation:
        out.print(f"  annotated: {escape(r.annotation)}")
    cex = r.counterexample
    if r.message and (cex is None or cex.message != r.message):
        out.print(f"  {escape(r.message)}")
    if cex is None:
        if r.bounded and r.bounded.reason and r.bounded.reason not in r.message:
            out.print(f"  bounded: {escape(r.bounded.reason)}")
        return
    out.print(f"  case: {escape(cex.case)}")
    out.print(f"  {cex.kind}: {escape(cex.message)}")
    if cex.inputs:
        out.print("  inputs:")
        for name, value in cex.inputs.items():
            out.print(f"    {escape(name)} = {escape(_value(value))}")
    if cex.lhs is not None:
        out.print(f"  left-hand side  = {escape(_value(cex.lhs))}")
        out.print(f"  right-hand side = {escape(_value(cex.rhs))}")
    if cex.check:
        out.print(f"  failing check: {escape(cex.check)}")
        out.print(f"    got  = {escape(_value(cex.got))}")
        out.print(f"    want = {escape(_value(cex.want))}")
    for fn, interp in cex.functions.items():
        out.print(f"  function {escape(fn)} = {escape(interp)}")


def render(report: Report, out: Console, quiet: bool = False) -> None:
    """Print the report: a table of every rule (unless ``quiet``), details of failures, a summary."""
    for error in report.errors:
        out.print(f"[red]error:[/red] {escape(error)}")
    if report.rules and not quiet:
        # aligned plain rows rather than a rich Table: a narrow terminal must not truncate rule names
        width = max(len(r.name) for r in report.rules)
        places = max(len(f"{r.file}:{r.line}") for r in report.rules)
        out.print(
            f"[bold]{'status':<9} {'proof':<8} {'time':>7}  {'rule':<{width}}  {'where':<{places}}  covers[/bold]"
        )
        for r in report.rules:
            status = r.status if not (r.status in ("unknown", "partial") and r.annotation) else f"{r.status}*"
            name, where = escape(r.name), escape(f"{r.file}:{r.line}")
            style = _STYLE[r.status]
            covers = escape(r.covers)
            out.print(
                f"[{style}]{status:<9}[/] {r.kind:<8} {r.seconds:>5.2f} s  {name:<{width}}  {where:<{places}}  {covers}"
            )
    failing = [r for r in report.rules if r.status != "proven"]
    if failing:
        out.print()
    for r in failing:
        _details(r, out)
    kinds: dict[str, int] = {}
    for r in report.rules:
        if r.status == "proven":
            kinds[r.kind] = kinds.get(r.kind, 0) + 1
    by_kind = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    if report.rules:
        out.print(NAN_FREE)  # above the summary, which stays the last line
    verdict = "[green]ok[/green]" if report.ok else "[bold red]FAILED[/bold red]"
    proven = f"{report.count('proven')} proven" + (f" ({by_kind})" if by_kind else "")
    out.print(
        f"{verdict}: {_n(len(report.rules), 'rule')} in {_n(len(report.files), 'file')}: {proven}, "
        f"{report.count('refuted')} refuted, {report.count('partial')} partial, {report.count('unknown')} unknown; "
        f"{report.analyses} analysis declarations (facts only, nothing to prove); "
        f"{report.seconds:.1f} s, median {report.median_seconds():.3f} s per rule"
    )


def run(
    paths: Sequence[Path] | None,
    names: Sequence[str] = (),
    options: Options = Options(),
    json_path: str | None = None,
    quiet: bool = False,
    out: Console | None = None,
    write_certificate: bool = False,
) -> int:
    """Verify, print, write the JSON report, compare (or write) the proof certificates; return the exit
    status."""
    if json_path == "-":
        out = Console(stderr=True, highlight=False, soft_wrap=True)  # stdout carries the JSON
    out = out or Console(highlight=False, soft_wrap=True)
    full = options.generic and options.budget is None
    if write_certificate and not full:
        from unity_eq.errors import OptionError

        raise OptionError("`--write-certificate` records full proofs: leave out `--no-generic` and `--budget`.")
    report = verify_rules(paths or None, names, options)
    render(report, out, quiet)
    stale = False
    if full and not report.errors:
        stale = _certificates(report, paths, names, write_certificate, out)
    if json_path:
        text = json.dumps(report.to_json(), indent=1, default=str)
        if json_path == "-":
            sys.stdout.write(text + "\n")
        else:
            try:
                Path(json_path).write_text(text + "\n")
            except OSError as exc:
                from unity_eq.errors import OptionError

                raise OptionError(f"`--json` {json_path}: cannot write ({exc.strerror or exc}).") from None
    if report.errors:
        return 2
    return 0 if report.ok and not stale else 1


def _certificates(
    report: Report, paths: Sequence[Path] | None, names: Sequence[str], write: bool, out: Console
) -> bool:
    """Write or compare the proof certificates (verify/_certify.py); True when the shipped one is stale."""
    from unity_eq.rulefile.manifest import rules_dir
    from unity_eq.verify._certify import certify

    shipped = rules_dir().resolve()
    complete = not names and (not paths or not any(Path(p).resolve().is_relative_to(shipped) for p in paths))
    stale = False
    for check in certify(report.rules, write, complete):
        shown = escape(_shown(check.path))
        if write:
            out.print(f"certificate: wrote {shown} ({_n(check.written, 'rule')})")
            continue
        if check.narrower:
            out.print(
                f"note: {shown} certifies {_n(len(check.narrower), 'rule')} only within a domain that this run "
                f"proved for all ({escape(', '.join(check.narrower[:5]))}): `--write-certificate` lets them fire "
                "everywhere."
            )
        if check.timed_out:
            out.print(
                f"note: {shown} certifies {_n(len(check.timed_out), 'rule')} as proven for all, and this run's "
                f"generic proof of the same text timed out ({escape(', '.join(check.timed_out[:5]))}); the bounded "
                "check proved them here. A loaded machine does this: z3's limits are wall-clock."
            )
        listed = escape(
            ", ".join(check.stale[:5]) + (f" and {len(check.stale) - 5} more" if len(check.stale) > 5 else "")
        )
        if check.stale and check.shipped:
            stale = True
            out.print(
                f"[red]error:[/red] {shown} is stale for {_n(len(check.stale), 'rule')} ({listed}): the engine fires "
                "a rule only as its certificate says, and this run proved otherwise. Run `unity-eq verify "
                "--write-certificate`."
            )
        elif check.stale:
            rule_file = Path(str(check.path).removesuffix(".proofs.json") + ".egg")
            out.print(
                f"note: {shown} has no current entry for {_n(len(check.stale), 'rule')} ({listed}): `optimize` "
                f"leaves them out until you run `unity-eq verify {escape(_shown(rule_file))} --write-certificate`."
            )
    return stale


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m unity_eq.verify [PATHS...] [--rule NAME]...``"""
    parser = argparse.ArgumentParser(
        prog="python -m unity_eq.verify",
        description="Prove rewrite rules sound with z3 (default: every rule shipped in rules/). Proofs are over "
        "the reals and assume NaN-free, finite inputs; float32 rounding is checked where it feeds a discrete op "
        "(docs/verify.md).",
    )
    parser.add_argument("paths", nargs="*", type=Path, help=".egg files to verify (with the shipped schema)")
    parser.add_argument("--rule", "-r", action="append", default=[], help="verify only this rule (repeatable)")
    parser.add_argument("--json", dest="json_path", help="write a JSON report to this file (- for stdout)")
    parser.add_argument("--jobs", "-j", type=int, default=0, help="worker processes (default: one per CPU)")
    parser.add_argument(
        "--budget",
        type=int,
        default=0,
        help="check the smallest case of at most this many signatures per rule, every mesh size and guard "
        "binding once (0: every case, the default; a budget that leaves cases out makes the rule partial, "
        "which fails)",
    )
    parser.add_argument(
        "--cross-check",
        type=int,
        default=Options.cross_check,
        help="signatures whose smallest case checks the axioms of a rule proven generically (0: every case)",
    )
    parser.add_argument("--timeout", type=int, default=Options.timeout_ms, help="z3 timeout per case, ms")
    parser.add_argument("--no-generic", action="store_true", help="skip shape-generic proofs")
    parser.add_argument("--no-numeric", action="store_true", help="skip the numeric back-up (and its float32 pass)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only failures and the summary")
    parser.add_argument(
        "--write-certificate", action="store_true", help="write what each proof covers for the engine (docs/verify.md)"
    )
    args = parser.parse_args(argv)
    for flag, value in (("--budget", args.budget), ("--cross-check", args.cross_check)):
        if value < 0:
            parser.error(f"{flag}: expected 0 or more, got {value}")
    options = Options(
        generic=not args.no_generic,
        numeric=not args.no_numeric,
        budget=args.budget or None,
        cross_check=args.cross_check or None,
        timeout_ms=args.timeout,
        jobs=args.jobs,
    )
    from unity_eq.errors import UnityEqError
    from unity_eq.verify._memory import memory_capped

    try:
        with memory_capped(args.jobs or (os.cpu_count() or 1)):
            return run(
                args.paths, args.rule, options, args.json_path, args.quiet, write_certificate=args.write_certificate
            )
    except UnityEqError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
        return exc.exit_code
