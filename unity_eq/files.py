"""The files unity-eq writes, made safe to stop at any moment.

* **Outputs are checked before the work** (:func:`check_output_file`, :func:`check_output_dir`): a path that
  cannot be written is an error before a search of minutes, not a traceback after it. The check creates and
  removes a probe file in the nearest existing folder, because permission bits do not tell (``/proc`` looks
  writable to root).
* **A plan replaces only its own files** (:func:`replace_plan_files`): the files its plan.json lists as written
  (a manifest, not a name pattern): re-optimizing into a plan folder keeps the user's notes, ``out.npz``, a
  model named ``device_9.onnx`` or ``stage7/notes.txt``, and the folder's permissions. The plan is still
  replaced atomically: the new folder is built aside (the user's files hard-linked into it) and swapped in
  by rename.
* **Temporary folders record their owner** (:func:`owned_tempdir`, :func:`sweep_stale`): their names carry the
  pid of the process that made them, so a later run removes those of runs that died (SIGKILL, power loss)
  and never those of a live one.
* **SIGTERM and SIGINT unwind** (:func:`install_signal_handlers`, in :mod:`unity_eq.signals` and re-exported
  here): both raise :class:`Interrupted` in the main thread, so every ``finally`` and context manager removes
  its temporary files, and :func:`stop_requested` tells worker threads to stop their engine processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from unity_eq.errors import OptionError, PlanError
from unity_eq.signals import (
    Interrupted,
    die_with_parent,
    install_signal_handlers,
    raise_if_stopped,
    received_signal,
    stop_requested,
    worker_pool,
)

__all__ = [
    "Interrupted",
    "check_output_dir",
    "check_output_file",
    "check_output_folder",
    "die_with_parent",
    "install_signal_handlers",
    "owned_tempdir",
    "owner_tag",
    "raise_if_stopped",
    "received_signal",
    "replace_plan_files",
    "stop_requested",
    "sweep_stale",
    "worker_pool",
    "write_file_atomic",
]

JOB_PREFIX = "unity-eq-"  # the engine's job folders in the system temp folder
_OWNER = re.compile(r"-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-")


# ----------------------------------------------------------------------------------------------------------
# Output checks


def _probe(folder: Path, what: str) -> None:
    """Create and remove a file in ``folder``: the only sure test that we may write there."""
    try:
        fd, name = tempfile.mkstemp(prefix=".unity-eq-probe-", dir=folder)
    except OSError as exc:
        raise OptionError(f"{what}: cannot write in {folder} ({exc.strerror or exc}). Pass another path.") from None
    os.close(fd)
    Path(name).unlink()


def _nearest_existing(path: Path, what: str) -> Path:
    """The nearest existing ancestor of ``path``; it must be a folder (``file/sub`` is refused here)."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OptionError(f"{what}: {parent} is a file, not a folder. Pass another path.")
            return parent
    raise OptionError(f"{what}: no folder of {path} exists.")  # pragma: no cover - / always exists


def check_output_file(path: Path, what: str, *, make_parents: bool = False) -> None:
    """Refuse, before any work, a file output that cannot be written: a folder, a parent that is a file or
    (unless ``make_parents``) missing, or a folder we may not write in. ``what`` names the option."""
    if path.is_dir():
        raise OptionError(f"{what} {path}: is a folder; pass a file name such as {path / 'out'}.")
    parent = path.absolute().parent
    if parent.is_dir():
        _probe(parent, f"{what} {path}")
        return
    if parent.exists():
        raise OptionError(f"{what} {path}: {parent} is a file, not a folder. Pass another path.")
    if not make_parents:
        raise OptionError(f"{what} {path}: expected a file in an existing directory; {parent} does not exist.")
    _probe(_nearest_existing(path, f"{what} {path}"), f"{what} {path}")


def check_output_folder(target: Path, what: str) -> None:
    """Refuse, before any work, a folder output that cannot be written (a file, under a file, not writable)."""
    if target.exists() and not target.is_dir():
        raise OptionError(f"{what} {target}: is a file; pass a folder.")
    _probe(target if target.is_dir() else _nearest_existing(target, f"{what} {target}"), f"{what} {target}")


def check_output_dir(target: Path, what: str = "`-o`") -> None:
    """Refuse, before any work, a plan folder we must not or cannot write: a file, a non-empty folder that is
    not a plan, a path under a file, a place we may not write in."""
    if target.exists() and not target.is_dir():
        raise PlanError(f"{target}: output path is a file. Pass a directory to {what}.")
    if target.is_dir():
        if any(target.iterdir()) and not (target / "plan.json").exists():
            raise PlanError(
                f"{target}: directory is not empty and holds no plan.json; refusing to overwrite it. "
                f"Pass another {what}."
            )
        _probe(target, f"{what} {target}")
    folder = _nearest_existing(target, f"{what} {target}")
    _probe(folder, f"{what} {target}")  # the plan is built beside the target, then renamed


def write_file_atomic(target: Path, data: str | bytes, what: str) -> None:
    """Write ``target`` whole or not at all: the bytes go to a hidden sibling renamed over it, so a stop or a
    full disk never leaves half a file under the user's name. ``what`` names the option in errors."""
    partial = target.with_name(f".{target.name}.tmp-{_owner_tag()}part")
    try:
        if isinstance(data, str):
            partial.write_text(data, encoding="utf-8")
        else:
            partial.write_bytes(data)
        partial.chmod(0o666 & ~_umask())
        partial.replace(target)
    except OSError as exc:
        raise OptionError(f"{what} {target}: cannot write ({exc.strerror or exc}). Pass another path.") from None
    finally:
        partial.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------------
# Temporary folders with an owner


def owner_tag(pid: int | None = None) -> str:
    """``<host>-<pid>-``: the part of a temporary name that says which process owns it."""
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid() if pid is None else pid}-"


def _owner_tag() -> str:
    return owner_tag()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_stale(folder: Path, prefix: str) -> list[Path]:
    """Remove the folders ``prefix<host>-<pid>-*`` in ``folder`` left by dead runs on this host: the pid is
    gone. A live pid (even reused by another program) keeps its folder. Returns what was removed."""
    host = _owner_tag().rsplit("-", 2)[0]
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        match = _OWNER.match(entry.name[len(prefix) - 1 :])
        if match is None or match["host"] != host or _alive(int(match["pid"])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def owned_tempdir(prefix: str = JOB_PREFIX, folder: Path | None = None) -> Iterator[Path]:
    """A temporary folder ``prefix<host>-<pid>-XXXX`` removed on exit (also on SIGTERM, through
    :class:`Interrupted`); stale ones of dead runs in the same folder are swept first."""
    where = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    sweep_stale(where, prefix)
    path = _fresh_name(where, prefix)
    try:
        path.mkdir(mode=0o700)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _fresh_name(where: Path, prefix: str) -> Path:
    """An unused name ``prefix<host>-<pid>-XXXXXXXX`` in ``where``; the caller creates it *inside* its
    ``try``, so a signal arriving between the creation and the ``try`` cannot leave the folder behind
    (``tempfile.mkdtemp`` creates before it returns: that window once left a temporary plan in CI)."""
    while True:
        path = where / f"{prefix}{_owner_tag()}{secrets.token_hex(4)}"
        if not path.exists():
            return path


# ----------------------------------------------------------------------------------------------------------
# Replacing a plan's files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _link_or_copy(src: Path, dst: Path) -> None:
    """Put the user's file ``src`` at ``dst`` without copying bytes when the filesystem allows."""
    if src.is_symlink():
        dst.symlink_to(src.readlink())
    else:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _keep_user_entries(old: Path, new: Path, rel: str, owned: set[str], manifest: bool, writes: set[str]) -> None:
    """Put every entry of ``old`` (the plan folder, or a folder in it at ``rel``) that the earlier plan did not
    write into ``new``, folders merged. A user's file where the new plan writes one is refused when the earlier
    plan's manifest says it is not the plan's, or when there is no unity-eq plan at all (``manifest`` True);
    an older plan.json, with no manifest, lets the plan's names go."""
    for entry in old.iterdir():
        name = f"{rel}{entry.name}"
        target = new / entry.name
        if entry.is_dir() and not entry.is_symlink():
            made = not target.exists()
            if made:
                target.mkdir()
                shutil.copystat(entry, target)
            _keep_user_entries(entry, target, f"{name}/", owned, manifest, writes)
            if made and not any(target.iterdir()) and any(o.startswith(f"{name}/") for o in owned):
                target.rmdir()  # a folder of the earlier plan's files only (a stage directory) goes with them
            continue
        if name in owned:
            continue
        if name in writes:
            if manifest:
                raise PlanError(
                    f"{old / entry.name}: not a file of a unity-eq plan in this folder (no plan.json of ours lists "
                    f"it), and the new plan writes {name}; move the file away or pass another `-o`."
                )
            continue
        _link_or_copy(entry, target)


def replace_plan_files(new: Path, target: Path) -> None:
    """Make ``target`` hold the plan built in ``new`` (a sibling folder) and the user's other files.

    The files the earlier plan wrote (the manifest in its plan.json, :mod:`unity_eq.planfile.manifest`) go;
    every other entry of ``target`` stays, with the folder's permissions, whatever its name. Files get the
    permissions the umask gives (onnx writes external data 0600). Atomic as far as a filesystem allows:
    ``new`` is completed aside, then two renames swap it in, and a failure between them puts the old folder
    back."""
    from unity_eq.planfile.manifest import manifest_of, plan_files

    mask = _umask()
    for path in new.iterdir():
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)  # a stage directory must stay searchable
    if not target.exists():
        new.chmod(0o777 & ~mask)
        new.replace(target)
        return
    shutil.copystat(target, new)
    found = plan_files(target)
    # no unity-eq plan here: every file is the user's, and one where the new plan writes is refused
    owned, manifest = found if found is not None else (set(), True)
    _keep_user_entries(target, new, "", owned, manifest, set(manifest_of(new)))
    backup = target.with_name(f".{target.name}.old-{_owner_tag()}swap")
    target.replace(backup)
    try:
        new.replace(target)
    finally:  # decided by what is on disk, so a signal between two statements cannot mislead it
        if new.exists():  # the swap failed: the old plan goes back
            backup.replace(target)
        else:
            shutil.rmtree(backup, ignore_errors=True)


@contextlib.contextmanager
def plan_tempdir(target: Path) -> Iterator[Path]:
    """The folder a plan is built in beside ``target``: ``.NAME.tmp-<host>-<pid>-XXXX``, removed when the
    block fails or is interrupted (and swept when its run is dead, see :func:`sweep_stale`). The block ends
    with :func:`replace_plan_files`, which moves it into place."""
    prefix = f".{target.name}.tmp-"
    sweep_stale(target.parent, prefix)
    sweep_stale(target.parent, f".{target.name}.old-")
    path = _fresh_name(target.parent, prefix)
    try:
        path.mkdir(mode=0o700)
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def file_mode(path: Path) -> int:
    """Permission bits of ``path`` (for tests and messages)."""
    return stat.S_IMODE(path.stat().st_mode)
