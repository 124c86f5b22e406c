"""Have egglog itself load rule files once, in this process, before any search.

Our parser (verify/_parse.py) models the commands the prover needs; egglog checks more (types of every
expression, re-declared sorts, option syntax). Loading the files into an empty e-graph — the shipped schema and
analyses first, as ``optimize`` does — finds those errors in a fraction of a second, instead of in every mesh's
engine worker after the search has started. egglog's ``In L:C-… of FILE: …`` message becomes one
``FILE:L:C: …`` line.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import PurePath

__all__ = ["engine_load_error"]

# egglog names the file by its last path component: "In 3:3-18 of bad.egg: (frobnicate 1 2)\nUnbound …"
_SPAN = re.compile(r"^In (\d+):(\d+)-(?:(\d+):)?(\d+) of ([^\n]*?): ")


def engine_load_error(files: Sequence[tuple[str, str]]) -> str | None:
    """Load ``files`` (``(display, text)`` pairs, in order) into a fresh egglog e-graph; return egglog's
    first error as one ``display:line:col: message`` line, or None when every file loads."""
    import egglog.bindings as bindings

    egraph = bindings.EGraph()
    for display, text in files:
        try:
            with _quiet_stderr():  # a Rust panic prints its backtrace on fd 2: our one error line replaces it
                egraph.run_program(*egraph.parse_program(text, filename=display))
        except bindings.EggSmolError as exc:
            return _one_line(str(exc), display, text)
        except BaseException as exc:  # pyo3's PanicException derives from BaseException
            if type(exc).__name__ != "PanicException":
                raise
            return _one_line(str(exc), display, text)
    return None


def _one_line(message: str, display: str, text: str) -> str:
    match = _SPAN.match(message)
    if match is None or match.group(5) not in (display, PurePath(display).name):
        body = " ".join(line.strip() for line in message.splitlines() if line.strip())
        return f"{display}: egglog rejects the file: {body.rstrip('.')}. Fix the command it names."
    line, col = int(match.group(1)), int(match.group(2))
    end_line = int(match.group(3)) if match.group(3) else line
    end_col = int(match.group(4))
    rest = message[match.end() :]
    snippet = _span_text(text, line, col, end_line, end_col)
    if snippet and rest.startswith(snippet):
        rest = rest[len(snippet) :]
    else:  # the snippet is one line of the message, the error the rest
        rest = rest.split("\n", 1)[1] if "\n" in rest else rest
    body = " ".join(part.strip() for part in rest.splitlines() if part.strip()) or "egglog error"
    where = " ".join((snippet or "").split())
    if len(where) > 60:
        where = where[:59] + "…"
    command = f" `{where}`" if where else ""
    return f"{display}:{line}:{col}: egglog rejects{command}: {body.rstrip('.')}. Fix or remove it."


def _span_text(text: str, line: int, col: int, end_line: int, end_col: int) -> str | None:
    lines = text.split("\n")
    if not (1 <= line <= end_line <= len(lines)):
        return None
    if line == end_line:
        return lines[line - 1][col - 1 : end_col]
    parts = [lines[line - 1][col - 1 :], *lines[line : end_line - 1], lines[end_line - 1][:end_col]]
    return "\n".join(parts)


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's capture or an embedded interpreter: no fd 2
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), fd)
            try:
                yield
            finally:
                os.dup2(saved, fd)
    finally:
        os.close(saved)
