"""The manifest of a plan folder: plan.json's ``written``, every file the plan wrote there (relative paths,
plan.json included).

Ownership is what the plan wrote, never a name pattern: a later ``optimize`` into the folder replaces these
files and keeps every other (a user's ``device_9.onnx`` or ``stage7/notes.txt``), and ``run --outputs`` refuses
to overwrite them. A plan.json written before the manifest says what it owns through its ``files`` (and their
``.data``) and its stages' directories (:func:`plan_files`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PLAN_JSON", "manifest_of", "model_source", "plan_files"]

PLAN_JSON = "plan.json"


def manifest_of(folder: Path) -> tuple[str, ...]:
    """Every file under ``folder`` (the folder a plan is being built in, holding only what it wrote) and
    plan.json, as sorted relative POSIX paths."""
    found = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if not path.is_dir()}
    return tuple(sorted(found | {PLAN_JSON}))


def plan_files(folder: Path) -> tuple[set[str], bool] | None:
    """The files the plan in ``folder`` owns, and whether a manifest says so (True) or they were inferred from
    an older plan.json's ``files`` and stage directories (False); None when ``folder`` holds no readable
    unity-eq plan.json (then it owns nothing, and every file in it is the user's: issue 26's audit found a
    user's device_0.onnx replaced beside another tool's plan.json)."""
    raw = _raw(folder / PLAN_JSON)
    if raw is None or "unity_eq_version" not in raw:  # unreadable, or another tool's plan.json: not ours
        return None
    written = raw.get("written")
    if isinstance(written, list) and all(isinstance(name, str) for name in written):
        return set(written) | {PLAN_JSON}, True
    return _inferred(folder, raw, ""), False


def _raw(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # not a plan we can read: it owns nothing; the caller treats the folder as the user's
    return raw if isinstance(raw, dict) else None


def _inferred(folder: Path, raw: dict[str, Any], prefix: str) -> set[str]:
    """An older plan.json's files: plan.json, its device files and their data files, and its stage
    directories' own (a pipeline plan)."""
    owned = {f"{prefix}{PLAN_JSON}"}
    files = raw.get("files")
    for name in files if isinstance(files, list) else []:
        if isinstance(name, str) and Path(name).name == name:
            owned |= {f"{prefix}{name}", f"{prefix}{name}.data"}
    stages = raw.get("stages")
    for stage in stages if isinstance(stages, list) else []:
        directory = stage.get("directory") if isinstance(stage, dict) else None
        if isinstance(directory, str) and Path(directory).name == directory and not prefix:
            inner = _raw(folder / directory / PLAN_JSON)
            owned |= _inferred(folder / directory, inner or {}, f"{directory}/")
    return owned


def model_source(folder: Path) -> str | None:
    """The path of the model the plan in ``folder`` was made from (``model.source``, or a pipeline plan's
    ``source``), None when plan.json is unreadable or does not say."""
    raw = _raw(folder / PLAN_JSON)
    if raw is None:
        return None
    model = raw.get("model")
    source = model.get("source") if isinstance(model, dict) else raw.get("source")
    return source if isinstance(source, str) else None
