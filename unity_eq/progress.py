"""Progress of a long job as rows (one per mesh, one for the device files…) that a display can draw.

The search and the pipeline report to a :class:`Tracker` from several threads (two meshes saturate at a
time); what is shown is the tracker's business:

* :class:`Tracker` shows nothing (``-q``);
* :class:`LineTracker` prints a plain line when a mesh starts and when it ends: the output of a run whose
  stderr is not a terminal (a log file, CI), where a redrawn display would be noise;
* :class:`LiveTracker` redraws a rich table on a terminal: every row's phase (saturation iteration and
  e-nodes, extraction, baselines, files written) and its elapsed time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["LineTracker", "LiveTracker", "Tracker"]


class Tracker:
    """Receives progress; shows nothing. ``row`` names what progresses (``mesh x=2,y=4``)."""

    def queue(self, row: str) -> None:
        """``row`` will start later (a mesh waiting for a worker)."""

    def start(self, row: str, text: str) -> None:
        """``row`` starts now, doing ``text``."""

    def update(self, row: str, text: str) -> None:
        """``row`` is now doing ``text``."""

    def count(self, row: str, done: int, total: int, what: str) -> None:
        """``done`` of ``total`` ``what`` of ``row`` are finished."""

    def finish(self, row: str, text: str) -> None:
        """``row`` ended; ``text`` says how."""


class LineTracker(Tracker):
    """One plain line through ``say`` when a row whose name starts with ``prefix`` starts and when it ends;
    the rest (iterations, counts) would be too many lines for a log."""

    def __init__(self, say: Callable[[str], None], prefix: str = "mesh ") -> None:
        self.say = say
        self.prefix = prefix

    def start(self, row: str, text: str) -> None:
        if row.startswith(self.prefix):
            self.say(f"{row}: {text}")

    def finish(self, row: str, text: str) -> None:
        if row.startswith(self.prefix):
            self.say(f"{row}: {text}")


class LiveTracker(Tracker):
    """A rich display on ``console`` with one row per ``row``: name, what it is doing, elapsed time.

    Use it as a context manager; messages printed on the same console appear above the display, which stays
    when done unless ``transient`` (when the results printed next say it all). ``on_step`` hears every change
    as ``row: text`` (the CLI keeps the last one to say where an interrupt stopped)."""

    def __init__(self, console: Console, on_step: Callable[[str], None] | None = None, transient: bool = False) -> None:
        self.progress = Progress(
            TextColumn("{task.description}", style="bold"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=transient,
        )
        self.on_step = on_step or (lambda _m: None)
        self.rows: dict[str, TaskID] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> LiveTracker:
        self.progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.stop()

    def _task(self, row: str) -> TaskID:
        with self.lock:
            if row not in self.rows:
                self.rows[row] = self.progress.add_task(escape(row), start=False, total=None, status="queued")
            return self.rows[row]

    def _set(self, row: str, text: str, **extra: Any) -> TaskID:
        task = self._task(row)
        self.progress.update(task, status=escape(text), **extra)
        self.on_step(f"{row}: {text}")
        return task

    def queue(self, row: str) -> None:
        self._task(row)

    def start(self, row: str, text: str) -> None:
        self.progress.start_task(self._set(row, text))

    def update(self, row: str, text: str) -> None:
        self._set(row, text)

    def count(self, row: str, done: int, total: int, what: str) -> None:
        self._set(row, f"{done} of {total} {what}", completed=done, total=total)

    def finish(self, row: str, text: str) -> None:
        self.progress.stop_task(self._set(row, text))
