"""``unity-eq verify`` and ``unity-eq generate-rules``: the commands of the rule verifier.

Together and apart from the rest because they are the only part of the engine's code that calls into
:mod:`unity_eq.verify` (z3): the engine never imports the verifier, the command line dispatches to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from unity_eq.cli.shared import err, out
from unity_eq.errors import OptionError
from unity_eq.files import check_output_file, check_output_folder

__all__ = ["generate_rules", "verify"]


def verify(
    paths: list[Path] = typer.Argument(None, help=".egg files to verify (default: every shipped rule)."),
    rule: list[str] = typer.Option([], "--rule", "-r", help="Verify only this rule (repeatable)."),
    json_path: str = typer.Option(None, "--json", help="Write a JSON report to this file (`-` for stdout)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes (default: one per CPU)."),
    budget: int = typer.Option(
        0, "--budget", min=0, help="At most this many cases per rule (0: every case; stopping early is `partial`)."
    ),
    cross_check: int = typer.Option(
        1000,
        "--cross-check",
        min=0,
        help="Bounded cases that check the axioms of a rule proven generically (0: every case).",
    ),
    timeout: int = typer.Option(2000, "--timeout", help="z3 timeout per case, in milliseconds."),
    no_generic: bool = typer.Option(False, "--no-generic", help="Skip the shape-generic proofs."),
    no_numeric: bool = typer.Option(False, "--no-numeric", help="Skip the numeric back-up (and its float32 pass)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only failures and the summary."),
    write_certificate: bool = typer.Option(
        False,
        "--write-certificate",
        help="Write what each proof covers (rules/proofs.json, or my.proofs.json beside my.egg): the engine "
        "fires a rule only there.",
    ),
) -> None:
    """Prove every rewrite rule sound with z3; exit 0 iff every rule is proven (and its certificate current).

    Proofs are over the reals and assume NaN-free, finite inputs: a rule right only because NaN never occurs
    (Where(Greater(a, b), a, b) as Max(a, b)) is proven. Float32 rounding is checked (a float32 pass of the
    numeric back-up) where float arithmetic feeds a discrete op: a comparison, a Where's condition, Floor, a
    Cast to an integer. See docs/verify.md.
    """
    import os

    from unity_eq.verify import Options, memory_capped, run_verify

    options = Options(
        generic=not no_generic,
        numeric=not no_numeric,
        budget=budget or None,
        cross_check=cross_check or None,
        timeout_ms=timeout,
        jobs=jobs,
    )
    if json_path and json_path != "-":
        check_output_file(Path(json_path), "`--json`")
    with memory_capped(jobs or (os.cpu_count() or 1)):  # a rule whose cases outgrow it gets an unknown verdict
        code = run_verify(paths or None, rule, options, json_path, quiet, out, write_certificate)
    if code:
        raise typer.Exit(code)


def generate_rules(
    ops: str = typer.Option(
        "MatMul,Add,Relu,Concat,Split,Transpose,Partition,Combine,Replicate,Reduce",
        "--ops",
        help="Comma-separated operators to enumerate over.",
    ),
    max_size: int = typer.Option(3, "--max-size", help="Operators per enumerated graph, at most (1-3)."),
    output: Path = typer.Option(
        None, "--output", "-o", help="Directory for the .egg files and report (default: print the report only)."
    ),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes for the proofs (default: one per CPU)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random fingerprint inputs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Enumerate small graphs, fingerprint them exactly, prove the candidate rules with z3, prune and write them."""
    from unity_eq.verify import check_ops, render_report
    from unity_eq.verify import generate_rules as run_generate

    names = check_ops(ops)
    if output is not None:
        check_output_folder(output, "`-o`")
    if not 1 <= max_size <= 3:
        raise OptionError(f"`--max-size`: expected 1, 2 or 3, got {max_size}. Size 4 does not finish in hours.")
    if jobs < 0:
        raise OptionError(f"`--jobs`: expected 0 (one per CPU) or more, got {jobs}.")
    if quiet:
        report = run_generate(names, max_size, output, jobs=jobs, seed=seed)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        ) as bar:
            tasks: dict[str, Any] = {}

            def tick(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(phase, total=total)
                bar.update(tasks[phase], completed=done, total=total)

            report = run_generate(names, max_size, output, jobs=jobs, seed=seed, progress=tick)
    out.print(render_report(report), markup=False)
    if output is not None:
        out.print(f"\nwritten to {output}/ (report.md, report.json)", markup=False)
