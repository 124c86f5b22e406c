"""Reading ``plan.json``: one validation for every verb that reads a plan (run, check, explain).

A plan file that this unity-eq cannot read (another format version, a missing field, a ``files`` list that
does not name one plain file per rank) is a :class:`~unity_eq.errors.PlanError` naming the file and the
field, never an IndexError or a KeyError later on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unity_eq.errors import PlanError
from unity_eq.plan import PLAN_FORMAT_VERSION

__all__ = ["read_plan_json"]

_REDO = "Re-run `unity-eq optimize`."


def read_plan_json(meta_path: Path, need: Sequence[str] = ()) -> dict[str, Any]:
    """Read and check ``plan.json``: the format version, the mesh's ranks, one plain file name per rank, and
    the fields in ``need``."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{meta_path}: unreadable plan.json ({exc}). {_REDO}") from None
    if not isinstance(meta, dict):
        raise PlanError(f"{meta_path}: not a unity-eq plan.json (expected a JSON object). {_REDO}")
    version = meta.get("format_version")
    if version != PLAN_FORMAT_VERSION:
        raise PlanError(
            f"{meta_path}: plan format version {version!r}, this unity-eq reads {PLAN_FORMAT_VERSION}. {_REDO}"
        )
    for key in ("model", "mesh", "files", *need):
        if key not in meta:
            raise PlanError(f"{meta_path}: missing field {key!r}. {_REDO}")
    ranks = meta["mesh"].get("ranks") if isinstance(meta["mesh"], dict) else None
    if not isinstance(ranks, list) or not ranks:
        raise PlanError(f"{meta_path}: field 'mesh.ranks': expected a list of the ranks. {_REDO}")
    files = meta["files"]
    if not isinstance(files, list) or len(files) != len(ranks):
        count = len(files) if isinstance(files, list) else type(files).__name__
        raise PlanError(
            f"{meta_path}: field 'files': expected {len(ranks)} file names (one per rank), got {count}. {_REDO}"
        )
    for rank, name in enumerate(files):
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise PlanError(
                f"{meta_path}: field 'files[{rank}]': expected a file name in the plan folder, got {name!r}. {_REDO}"
            )
    return meta
