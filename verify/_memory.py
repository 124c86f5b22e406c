"""A memory cap for a ``unity-eq verify`` process and its workers, so that a rule whose bounded enumeration
outgrows the machine ends as that rule's *unknown* verdict (a ``MemoryError`` :func:`decide_rule` names),
not as the whole run killed by the kernel with no output (issue 21's fourth adversary: an Attention nested in a
Where's condition grew one process to 11.7 GB).

Only the command line sets it, for the run (:func:`memory_capped`: the limit it found is restored after, so an
API user or a test calling the CLI in its own process keeps its limits)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cap_memory", "memory_capped"]

#: the share of the machine's memory all of a run's processes together may take
SHARE = 0.8
#: never below this per process (GiB): the largest shipped rule needs about 2
FLOOR_GIB = 3.0


def _physical_bytes() -> tuple[float, float]:
    """Total and available physical memory (bytes: the kernel's MemAvailable, which counts the page cache it
    can drop, where sysconf's free pages do not), or zeros where the system does not say."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total, available = float(page * os.sysconf("SC_PHYS_PAGES")), float(page * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0, 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = float(line.split()[1]) * 1024
    return total, available


def cap_memory(jobs: int) -> float | None:
    """Limit this process's address space (inherited by the workers it forks) to its share of the memory
    available now: ``SHARE`` of it over ``jobs`` processes, at least ``FLOOR_GIB``; a lower limit already set
    is kept. Returns the limit in bytes, or None where it cannot be set (no ``resource`` module)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    total, available = _physical_bytes()
    if total <= 0:
        return None
    share = max(FLOOR_GIB * 2**30, SHARE * min(total, available or total) / max(jobs, 1))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft <= share:
        return float(soft)
    limit = int(share if hard == resource.RLIM_INFINITY else min(share, hard))
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return float(limit)


@contextlib.contextmanager
def memory_capped(jobs: int) -> Iterator[float | None]:
    """:func:`cap_memory` for the duration of the block; the limit found before is restored after it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        yield None
        return
    before = resource.getrlimit(resource.RLIMIT_AS)
    try:
        yield cap_memory(jobs)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, before)
