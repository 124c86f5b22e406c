"""Saturate an encoding with the rule files in an isolated worker process, within limits.

The worker runs the schema, analyses, rule files and the program with a memory limit, in explicit iterations
with node, iteration and wall-clock limits, and returns the serialized e-graph. egglog has no timeout or
interrupt inside one call and aborts the process when an allocation fails, so the worker isolates the CLI
from a runaway run. Saturation reports why it stopped (:class:`StopReason`), as egg's runner does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from unity_eq.egraph.encode import Encoding
from unity_eq.errors import RuleError, SaturationError
from unity_eq.files import die_with_parent, owned_tempdir, raise_if_stopped
from unity_eq.rulefile.manifest import RuleFile

__all__ = ["Limits", "SaturationResult", "StopReason", "peak_rss_mib", "saturate", "worker_main"]


class StopReason(Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"


@dataclass(frozen=True)
class Limits:
    """Bounds on one saturation. Defaults never hang on the models we ship; flags change them."""

    max_iterations: int = 12
    max_nodes: int = 200_000
    time_limit_s: float = 120.0
    memory_limit_gib: float = 6.0
    algebra_iterations: int = 3


@dataclass
class SaturationResult:
    serialized: dict[str, Any]
    stop_reason: StopReason
    iterations: int
    enodes: int
    seconds: float
    history: list[tuple[int, int, float]] = field(default_factory=list)  # (iteration, e-nodes, seconds)
    worker_peak_mib: float = 0.0


ProgressFn = Callable[[str, int, int, float], None]


def _tensor_table_sizes(egraph: Any) -> int:
    import egglog.bindings as bindings

    (out,) = egraph.run_program(*egraph.parse_program("(print-size)"))
    if isinstance(out, bindings.PrintAllFunctionsSize):
        sizes = out.sizes
    else:  # pragma: no cover - older bindings print text
        return 0
    skip = {"Tensor"}
    return sum(n for name, n in sizes if name[:1].isupper() and name not in skip)


def _run_phase(egraph: Any, ruleset: str) -> bool:
    (out,) = egraph.run_program(*egraph.parse_program(f"(run-schedule (run {ruleset}))"))
    updated = bool(out.report.updated)
    (out,) = egraph.run_program(*egraph.parse_program("(run-schedule (saturate (run analysis) (run expand)))"))
    return updated


def worker_main(job_path: str) -> int:
    """Body of the worker process (``python -m unity_eq.egraph JOB``).

    Progress and the final status go to stdout as JSON lines; the serialized e-graph goes to a file.
    """
    job = json.loads(Path(job_path).read_text())
    die_with_parent(job.get("parent"))  # a killed unity-eq leaves no engine running on
    limits = Limits(**job["limits"])

    def send(*item: Any) -> None:
        print(json.dumps(item), flush=True)

    try:
        _limit_memory(limits.memory_limit_gib)
        import egglog.bindings as bindings

        start = time.monotonic()
        egraph = bindings.EGraph()
        for text, filename in job["files"]:
            try:
                egraph.run_program(*egraph.parse_program(text, filename=filename))
            except bindings.EggSmolError as exc:
                send("rule-error", f"{filename}: {exc}")
                return 0
        _run_chunked(egraph, job["program"])
        egraph.run_program(*egraph.parse_program("(run-schedule (saturate (run analysis) (run expand)))"))
        nodes = _tensor_table_sizes(egraph)
        history = [(0, nodes, time.monotonic() - start)]
        send("progress", "analysis", 0, nodes, history[-1][2])
        reason, iteration = _run_phases(egraph, limits, start, history, send)
        Path(job["out"]).write_text(egraph.serialize([]).to_json())
        send("done", reason.value, iteration, history[-1][1], time.monotonic() - start, history, peak_rss_mib())
    except MemoryError:
        send("error", "out of memory")
    except Exception as exc:  # reported to the parent, which raises SaturationError with it
        send("error", f"{type(exc).__name__}: {exc}")
    return 0


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB.

    Linux's VmHWM belongs to the address space and starts afresh at exec; ``ru_maxrss`` survives
    fork + exec, so a subprocess would report its parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024
    except ImportError:  # pragma: no cover - Windows
        return 0.0


def _run_chunked(egraph: Any, program: str, lines_per_call: int = 200) -> None:
    """Run a long program a few hundred commands at a time.

    egglog 13.2 keeps a copy of the whole source text in every command's span, so one call with N commands
    costs O(N × text): 8.7 GB for densenet121's 7,600 lines. In chunks it is linear.
    """
    lines = program.splitlines()
    for start in range(0, len(lines), lines_per_call):
        chunk = "\n".join(lines[start : start + lines_per_call])
        egraph.run_program(*egraph.parse_program(chunk, filename=f"<encoded model, line {start + 1}>"))


def _run_phases(
    egraph: Any,
    limits: Limits,
    start: float,
    history: list[tuple[int, int, float]],
    send: Callable[..., None],
) -> tuple[StopReason, int]:
    """Bounded algebra iterations, then parallel iterations, re-saturating the analyses after each."""
    iteration = 0
    phases = [("algebra", limits.algebra_iterations), ("parallel", limits.max_iterations)]
    for ruleset, budget in phases:
        for step in range(budget):
            iteration += 1
            updated = _run_phase(egraph, ruleset)
            nodes = _tensor_table_sizes(egraph)
            elapsed = time.monotonic() - start
            history.append((iteration, nodes, elapsed))
            send("progress", ruleset, iteration, nodes, elapsed)
            if not updated:
                break
            if nodes > limits.max_nodes:
                return StopReason.NODE_LIMIT, iteration
            if elapsed > limits.time_limit_s:
                return StopReason.TIME_LIMIT, iteration
            if ruleset == "parallel" and step == budget - 1:
                return StopReason.ITERATION_LIMIT, iteration
    return StopReason.SATURATED, iteration


def _limit_memory(gib: float) -> None:
    if gib <= 0:
        return
    try:
        import resource

        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # pragma: no cover - platforms without RLIMIT_AS
        pass


def saturate(
    rule_files: list[RuleFile],
    encoding: Encoding,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
) -> SaturationResult:
    """Run equality saturation for ``encoding`` in a worker process and return the serialized e-graph."""
    limits = limits or Limits()
    with owned_tempdir() as tmp:  # removed on SIGTERM too; a killed run's is swept by the next run
        out_path = Path(tmp) / "egraph.json"
        job = {
            "files": [(f.text, f.display) for f in rule_files],
            "program": encoding.program,
            "limits": dataclasses.asdict(limits),
            "out": str(out_path),
            "parent": os.getpid(),
        }
        job_path = str(Path(tmp) / "job.json")
        Path(job_path).write_text(json.dumps(job))
        message, last, exitcode = _supervise(job_path, limits, progress)
        if message is None:
            raise SaturationError(_crash_message(exitcode, limits, last))
        kind = message[0]
        if kind == "rule-error":
            raise RuleError(f"rule file failed to load: {message[1]}")
        if kind == "error":
            if any(word in message[1].lower() for word in _MEMORY_WORDS):
                raise SaturationError(_killed_message("ran out of memory", limits, last))
            raise SaturationError(f"e-graph engine failed: {message[1]}")
        _, reason, iterations, nodes, seconds, history, peak_mib = message
        serialized = json.loads(out_path.read_text())
    history_rows = [(int(i), int(n), float(t)) for i, n, t in history]
    return SaturationResult(serialized, StopReason(reason), iterations, nodes, seconds, history_rows, peak_mib)


def _supervise(
    job_path: str, limits: Limits, progress: ProgressFn | None
) -> tuple[list[Any] | None, tuple[str, int, int, float] | None, int | None]:
    """Run the worker, relay its progress, kill it past the hard deadline. Returns (final message, last
    progress, exit code)."""
    cmd = [sys.executable, "-m", "unity_eq.egraph", job_path]
    raise_if_stopped()  # a signal arrived while this mesh waited for a worker thread
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + limits.time_limit_s * 1.5 + 60
    last: tuple[str, int, int, float] | None = None
    message = None
    assert proc.stdout is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while message is None:
                raise_if_stopped()  # SIGTERM/SIGINT: the finally below kills the engine
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    proc.kill()
                    raise SaturationError(_killed_message("did not finish in time", limits, last))
                if not sel.select(min(remaining, 1.0)):
                    continue
                line = proc.stdout.readline()
                if not line:
                    break  # the worker exited
                item = json.loads(line)
                if item[0] == "progress":
                    last = (item[1], item[2], item[3], item[4])
                    if progress:
                        progress(*item[1:])
                else:
                    message = item
    finally:
        if proc.poll() is None and message is None:
            proc.kill()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
        proc.stdout.close()
    return message, last, proc.returncode


_MEMORY_WORDS = ("memory", "failed to map segment", "cannot allocate")


def _where(last: tuple[str, int, int, float] | None) -> str:
    if last is None:
        return "before the first iteration"
    phase, iteration, nodes, secs = last
    return f"after {phase} iteration {iteration} ({nodes} e-nodes, {secs:.1f} s)"


def _crash_message(exitcode: int | None, limits: Limits, last: tuple[str, int, int, float] | None) -> str:
    return _killed_message(f"stopped unexpectedly (exit code {exitcode})", limits, last)


def _killed_message(what: str, limits: Limits, last: tuple[str, int, int, float] | None) -> str:
    return (
        f"e-graph saturation {what} {_where(last)}; memory limit {limits.memory_limit_gib:g} GiB. "
        "Lower `--max-nodes` or `--max-iterations`, or raise `--memory-limit`."
    )
