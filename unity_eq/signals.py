"""Stopping cleanly: SIGTERM and SIGINT unwind (:func:`install_signal_handlers` raises :class:`Interrupted` in
the main thread, so every ``finally`` and context manager removes its temporary files), worker threads poll
:func:`stop_requested`, worker processes die with their parent, and a process pool stops at once
(:func:`worker_pool`). Split from :mod:`unity_eq.files`, which re-exports these names."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from types import FrameType
from typing import Any

__all__ = [
    "Interrupted",
    "die_with_parent",
    "install_signal_handlers",
    "raise_if_stopped",
    "received_signal",
    "stop_requested",
    "worker_pool",
]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signum`` says which. A KeyboardInterrupt, so code that already cleans up
    after Ctrl-C does the same after SIGTERM, and ``except Exception`` never swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_stop = threading.Event()
_received: list[int] = []


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread and ask worker threads to stop."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        _stop.set()
        first = not _received
        _received.append(signum)
        if first:  # a second signal while cleaning up must not interrupt the clean-up
            raise Interrupted(signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        if not getattr(sys.unraisablehook, "reraises_interrupts", False):
            sys.unraisablehook = _reraising_hook(sys.unraisablehook)


def _reraising_hook(previous: Any) -> Any:
    """An ``unraisablehook`` for a signal that arrives while Python runs code whose exceptions it can only print
    (a weakref callback of the import system, a finalizer): the handler's :class:`Interrupted` would be printed
    as "Exception ignored ... Traceback" and lost. It is sent again instead, from another thread once this
    code has returned, so the handler raises it where it propagates (in the main thread's own code), and
    nothing is printed. (Sent from here, the handler would run at once, inside this hook, and be lost again.)"""

    def hook(args: Any) -> None:
        if isinstance(args.exc_value, Interrupted):
            _received.clear()
            threading.Timer(0.01, os.kill, (os.getpid(), args.exc_value.signum)).start()
            return
        previous(args)

    hook.reraises_interrupts = True  # type: ignore[attr-defined]
    return hook


def received_signal() -> int | None:
    """The first signal that interrupted this process, if any."""
    return _received[0] if _received else None


def stop_requested() -> bool:
    """Whether a signal asked the process to stop (worker threads poll this)."""
    return _stop.is_set()


def raise_if_stopped() -> None:
    """For worker threads: raise :class:`Interrupted` once a signal arrived."""
    if _stop.is_set():
        raise Interrupted(_received[0] if _received else signal.SIGINT)


def die_with_parent(parent: int | None) -> None:
    """In a worker process: be killed (SIGKILL) when ``parent`` dies, so a unity-eq killed with SIGKILL leaves
    no engine running on (Linux; elsewhere a no-op). Exits at once when the parent is already gone."""
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _worker_signals() -> None:
    """In a pool's worker process: Ctrl-C is the parent's to handle (it reaches the whole process group), and
    SIGTERM ends the worker at once, without a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def worker_pool(max_workers: int, mp_context: Any) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor that an interrupt (or any error) stops at once: its workers are killed and its
    queued work dropped, where leaving ``with ProcessPoolExecutor`` would wait for all of it."""
    pool = ProcessPoolExecutor(max_workers=max_workers, mp_context=mp_context, initializer=_worker_signals)
    try:
        yield pool
    except BaseException:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError, ValueError):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
