"""plan.json's format version, the checks every verb makes when it reads one (:func:`read_plan_json`: the
version, the mesh's ranks, one plain file name per rank, the fields a verb needs), and the
:class:`~unity_eq.errors.PlanError` for a field of the wrong type (:func:`bad`, the JSON types in a user's words).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unity_eq.errors import PlanError

PLAN_FORMAT_VERSION = 1

REDO = "Re-run `unity-eq optimize`."


def read_plan_json(meta_path: Path, need: Sequence[str] = ()) -> dict[str, Any]:
    """Read and check ``plan.json``: the format version, the mesh's ranks, one plain file name per rank, and
    the fields in ``need``."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{meta_path}: unreadable plan.json ({exc}). {REDO}") from None
    if not isinstance(meta, dict):
        raise PlanError(f"{meta_path}: not a unity-eq plan.json (expected a JSON object). {REDO}")
    version = meta.get("format_version")
    if version != PLAN_FORMAT_VERSION:
        raise PlanError(
            f"{meta_path}: plan format version {version!r}, this unity-eq reads {PLAN_FORMAT_VERSION}. {REDO}"
        )
    for key in ("model", "mesh", "files", *need):
        if key not in meta:
            raise PlanError(f"{meta_path}: missing field {key!r}. {REDO}")
    ranks = meta["mesh"].get("ranks") if isinstance(meta["mesh"], dict) else None
    if not isinstance(ranks, list) or not ranks:
        raise PlanError(f"{meta_path}: field 'mesh.ranks': expected a list of the ranks. {REDO}")
    files = meta["files"]
    if not isinstance(files, list) or len(files) != len(ranks):
        count = len(files) if isinstance(files, list) else type(files).__name__
        raise PlanError(
            f"{meta_path}: field 'files': expected {len(ranks)} file names (one per rank), got {count}. {REDO}"
        )
    for rank, name in enumerate(files):
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise PlanError(
                f"{meta_path}: field 'files[{rank}]': expected a file name in the plan folder, got {name!r}. {REDO}"
            )
    return meta


OBJECT, LIST, STR, INT, NUMBER, BOOL = "an object", "a list", "a string", "an integer", "a number", "true/false"


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def bad(path: Path, field: str, what: str, value: Any) -> PlanError:
    return PlanError(f"{path}: field {field!r}: expected {what}, got {_shown(value)}. {REDO}")
