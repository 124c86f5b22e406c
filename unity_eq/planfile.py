"""``plan.json``: the only code that reads and writes it, with one validation for every verb that reads a plan.

``write_plan_json`` writes it (lowering builds the content); ``read_plan_json`` checks the format and what
every verb needs; ``read_run_record`` gives the runtime typed records (:class:`RunRecord`: inputs, outputs, files,
collectives) so that running a plan reads no raw dictionary; ``check_explain_fields`` types what ``explain``
reads. A plan file that this unity-eq cannot read (another format version, a missing or mistyped field, a
``files`` list that does not name one plain file per rank, an unknown collective) is a
:class:`~unity_eq.errors.PlanError` naming the file and the field, never an IndexError or a KeyError later on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unity_eq.errors import PlanError
from unity_eq.plan import PLAN_FORMAT_VERSION

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveRecord",
    "InputRecord",
    "RunRecord",
    "check_explain_fields",
    "read_plan_json",
    "read_run_record",
    "write_plan_json",
]

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


def write_plan_json(path: Path, content: Mapping[str, Any], default: Callable[[Any], Any] | None = None) -> None:
    """Write ``plan.json`` (indent 1, as every plan so far: plan hashes and diffs stay comparable)."""
    path.write_text(json.dumps(content, indent=1, default=default))


# ----------------------------------------------------------------------------------------------------------
# What running a plan reads, as typed records

#: plan.json ``kind`` of every collective the runtime executes, with the fields each needs besides the common ones
COLLECTIVE_KINDS: dict[str, tuple[str, ...]] = {
    "all_gather": ("dim",),
    "all_reduce": (),
    "reduce_scatter": ("dim",),
    "all_to_all": ("split_dim", "concat_dim"),
}


@dataclass(frozen=True)
class InputRecord:
    """A model input as the plan expects it."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective between session segments: ``src`` on every rank of a group becomes ``dst`` after stage
    ``stage``. ``dim`` for all_gather and reduce_scatter, ``split_dim``/``concat_dim`` for all_to_all."""

    id: int
    kind: str
    axis: str
    groups: tuple[tuple[int, ...], ...]
    src: str
    dst: str
    stage: int
    dim: int | None = None
    split_dim: int | None = None
    concat_dim: int | None = None

    def group_of(self, rank: int) -> tuple[int, ...]:
        for group in self.groups:
            if rank in group:
                return group
        raise PlanError(f"plan.json: collective {self.id} has no group holding rank {rank}")


@dataclass(frozen=True)
class RunRecord:
    """What ``run`` and ``check`` need from plan.json, typed and checked once when the plan loads."""

    model_name: str
    source: str | None
    fingerprint: str | None  # of what the model computes (frontends.onnx_read.model_fingerprint)
    inputs: Mapping[str, InputRecord]
    outputs: tuple[str, ...]
    files: tuple[str, ...]
    collectives: tuple[CollectiveRecord, ...]
    plan_hash: str | None

    @property
    def world_size(self) -> int:
        return len(self.files)


def read_run_record(meta_path: Path) -> RunRecord:
    """Read plan.json for running it: every field the runtime uses, with its type, or one PlanError."""
    meta = read_plan_json(meta_path, need=("collectives",))
    model = _need(meta_path, meta, "model", dict, "model")
    inputs = _need(meta_path, model, "inputs", dict, "model.inputs")
    records = {}
    for name, spec in inputs.items():
        where = f"model.inputs.{name}"
        shape = _need(meta_path, spec if isinstance(spec, dict) else {}, "shape", list, where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _bad(meta_path, f"{where}.shape", "a list of sizes", shape)
        records[name] = InputRecord(tuple(shape), _need(meta_path, spec, "dtype", str, where))
    outputs = model.get("outputs")  # names, with their shapes and dtypes (an object) since format 1
    if not isinstance(outputs, dict | list) or not all(isinstance(o, str) for o in outputs):
        raise _bad(meta_path, "model.outputs", "an object of output names", outputs)
    collectives = _need(meta_path, meta, "collectives", list, "collectives")
    world = len(meta["files"])
    fingerprint = model.get("fingerprint")
    hash_ = meta.get("plan_hash")
    return RunRecord(
        model_name=str(model.get("name", "")),
        source=model.get("source") if isinstance(model.get("source"), str) else None,
        fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        inputs=records,
        outputs=tuple(outputs),
        files=tuple(meta["files"]),
        collectives=tuple(_collective(meta_path, c, i, world) for i, c in enumerate(collectives)),
        plan_hash=hash_ if isinstance(hash_, str) else None,
    )


def _need(path: Path, obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        what = {dict: _OBJECT, list: _LIST, str: _STR, int: _INT}[kind]
        raise _bad(path, where if where.endswith(key) else f"{where}.{key}", what, value)
    return value


def _collective(path: Path, raw: Any, index: int, world: int) -> CollectiveRecord:
    where = f"collectives[{index}]"
    if not isinstance(raw, dict):
        raise _bad(path, where, _OBJECT, raw)
    kind = _need(path, raw, "kind", str, where)
    if kind not in COLLECTIVE_KINDS:
        known = ", ".join(COLLECTIVE_KINDS)
        raise PlanError(f"{path}: field '{where}.kind': unknown collective {kind!r}; expected {known}. {_REDO}")
    groups = _need(path, raw, "groups", list, where)
    for group in groups:
        if not isinstance(group, list) or not all(isinstance(r, int) and 0 <= r < world for r in group):
            raise _bad(path, f"{where}.groups", f"lists of ranks below {world}", groups)
    extra = {name: _need(path, raw, name, int, where) for name in COLLECTIVE_KINDS[kind]}
    return CollectiveRecord(
        id=_need(path, raw, "id", int, where),
        kind=kind,
        axis=_need(path, raw, "axis", str, where),
        groups=tuple(tuple(g) for g in groups),
        src=_need(path, raw, "src", str, where),
        dst=_need(path, raw, "dst", str, where),
        stage=_need(path, raw, "stage", int, where),
        **extra,
    )


# ----------------------------------------------------------------------------------------------------------
# The fields `explain` reads (text, json and the pictures): their types, checked once when the plan loads.

_OBJECT, _LIST, _STR, _INT, _NUMBER, _BOOL = "an object", "a list", "a string", "an integer", "a number", "true/false"
_NUM_OR_NULL = "a number or null"
_STR_OR_NULL = "a string or null"

#: top-level field: what it must be; every one but those `read_plan_json` requires may be absent
_TOP: dict[str, str] = {
    "model": _OBJECT,
    "objective": _STR,
    "mesh": _OBJECT,
    "machine": _OBJECT,
    "cost": _OBJECT,
    "tensors": _OBJECT,
    "steps": _LIST,
    "collectives": _LIST,
    "shardings": _OBJECT,
    "mesh_search": _OBJECT,
    "baselines": _OBJECT,
    "extraction": _OBJECT,
    "parallelism": _OBJECT,
    "stats": _OBJECT,
    "memory": _OBJECT,
}
_MODEL = {"name": _STR, "outputs": _OBJECT, "inputs": _OBJECT}
_MESH = {"axes": _LIST, "sizes": _LIST, "ranks": _LIST}
_RANK = {"device": _INT, "node": _INT, "rank": _INT}
_MACHINE = {"name": _STR_OR_NULL, "node_list": _LIST, "mesh_axes": _LIST}
_COST = {"total_s": _NUM_OR_NULL, "compute_s": _NUM_OR_NULL, "communication_s": _NUM_OR_NULL}
_TENSOR = {
    "shape": _LIST,
    "local_shape": _LIST,
    "placement": _LIST,
    "dtype": _STR,
    "source": _STR_OR_NULL,
    "value": _STR_OR_NULL,
}
_STEP = {
    "kind": _STR,
    "out": _STR,
    "src": _STR,
    "op": _STR,
    "axis": _STR,
    "inputs": _LIST,
    "outputs": _LIST,
    "compute_s": _NUM_OR_NULL,
    "communication_s": _NUM_OR_NULL,
}
_PARALLELISM = {"devices": _INT, "devices_used": _INT, "machine_devices": _INT, "note": _STR_OR_NULL}
_BY_AXIS = {"forward_s": _NUMBER, "backward_s": _NUMBER, "gradient_s": _NUMBER}
_OVERLAP = {"gradient_all_reduce_s": _NUMBER, "overlappable_s": _NUMBER, "exposed_s": _NUMBER}
_BASELINE = {
    "mesh": _STR,
    "description": _STR,
    "total_s": _NUMBER,
    "compute_s": _NUMBER,
    "communication_s": _NUMBER,
    "memory_bytes": _NUMBER,
    "ratio": _NUM_OR_NULL,
    "devices": _INT,
    "devices_used": _INT,
}
_TRIED = {"mesh": _STR, "status": _STR, "cost_s": _NUM_OR_NULL, "enodes": _INT, "seconds": _OBJECT}
_SKIPPED = {"mesh": _STR, "reason": _STR}
#: steps that move a tensor: they name the tensor they move and the mesh axis
_MOVES = ("partition", "replicate", "combine")


def _is(value: Any, what: str) -> bool:
    if what == _OBJECT:
        return isinstance(value, dict)
    if what == _LIST:
        return isinstance(value, list)
    if what == _STR:
        return isinstance(value, str)
    if what == _STR_OR_NULL:
        return value is None or isinstance(value, str)
    if what == _BOOL:
        return isinstance(value, bool)
    if what == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number or (what == _NUM_OR_NULL and value is None)


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _bad(path: Path, field: str, what: str, value: Any) -> PlanError:
    return PlanError(f"{path}: field {field!r}: expected {what}, got {_shown(value)}. {_REDO}")


def _fields(path: Path, obj: dict[str, Any], spec: dict[str, str], where: str) -> None:
    for key, what in spec.items():
        if key in obj and not _is(obj[key], what):
            raise _bad(path, f"{where}{key}", what, obj[key])


def _record(path: Path, obj: Any, spec: dict[str, str], where: str, required: Sequence[str] = ()) -> None:
    """``obj`` is an object whose fields in ``spec`` have their types, and has every field of ``required``."""
    if not isinstance(obj, dict):
        raise _bad(path, where, _OBJECT, obj)
    for key in required:
        if key not in obj:
            raise PlanError(f"{path}: missing field {where + '.' + key!r}. {_REDO}")
    _fields(path, obj, spec, where + ".")


def _items(path: Path, values: Any, what: str, field: str) -> None:
    for i, value in enumerate(values):
        if not _is(value, what):
            raise _bad(path, f"{field}[{i}]", what, value)


def check_explain_fields(meta: dict[str, Any], path: Path) -> None:
    """Check the types of every field `explain` reads, so a hand-edited or damaged plan.json is one
    PlanError naming the field and what was expected, not an AttributeError deep in the report."""
    _fields(path, meta, _TOP, "")
    _record(path, meta["model"], _MODEL, "model", ("name",))
    for name, output in meta["model"].get("outputs", {}).items():
        _record(path, output, {"tensor": _STR}, f"model.outputs.{name}")
    mesh = meta["mesh"]
    _fields(path, mesh, _MESH, "mesh.")
    for key in ("axes", "sizes"):
        if key not in mesh:
            raise PlanError(f"{path}: missing field 'mesh.{key}'. {_REDO}")
    _items(path, mesh["axes"], _STR, "mesh.axes")
    _items(path, mesh["sizes"], _INT, "mesh.sizes")
    if len(mesh["sizes"]) != len(mesh["axes"]):
        raise _bad(path, "mesh.sizes", f"{len(mesh['axes'])} sizes (one per axis)", mesh["sizes"])
    for i, rank in enumerate(mesh["ranks"]):
        if not isinstance(rank, dict):
            raise _bad(path, f"mesh.ranks[{i}]", _OBJECT, rank)
        _fields(path, rank, _RANK, f"mesh.ranks[{i}].")
        if "device" not in rank:
            raise PlanError(f"{path}: missing field 'mesh.ranks[{i}].device'. {_REDO}")
    if "machine" in meta:
        _fields(path, meta["machine"], _MACHINE, "machine.")
    cost = meta.get("cost", {})
    _fields(path, cost, {**_COST, "communication_by_axis": _OBJECT, "overlap": _OBJECT}, "cost.")
    for axis, parts in cost.get("communication_by_axis", {}).items():
        _record(path, parts, _BY_AXIS, f"cost.communication_by_axis.{axis}", tuple(_BY_AXIS))
    if cost.get("overlap"):
        _record(path, cost["overlap"], _OVERLAP, "cost.overlap", tuple(_OVERLAP))
    if meta.get("parallelism"):
        _record(path, meta["parallelism"], _PARALLELISM, "parallelism", ("devices", "devices_used"))
    for name, value in meta.get("baselines", {}).items():
        if value is not None:
            required = ("mesh", "description", "total_s", "compute_s", "communication_s", "memory_bytes")
            _record(path, value, _BASELINE, f"baselines.{name}", required)
    search = meta.get("mesh_search", {})
    _fields(path, search, {"tried": _LIST, "skipped": _LIST, "chosen": _STR_OR_NULL}, "mesh_search.")
    for i, tried in enumerate(search.get("tried", [])):
        _record(path, tried, _TRIED, f"mesh_search.tried[{i}]", ("mesh",))
    for i, skipped in enumerate(search.get("skipped", [])):
        _record(path, skipped, _SKIPPED, f"mesh_search.skipped[{i}]", ("mesh", "reason"))
    extraction = meta.get("extraction", {})
    choice = extraction.get("plan_choice")
    if choice is not None:
        _record(path, choice, {"note": _STR_OR_NULL}, "extraction.plan_choice")
        if choice.get("cheaper_baseline") is not None:
            _record(path, choice["cheaper_baseline"], {"note": _STR_OR_NULL}, "extraction.plan_choice.cheaper_baseline")
    for name, value in meta.get("memory", {}).items():
        if name != "weight_bytes_per_rank" and not _is(value, _NUMBER) and not isinstance(value, bool):
            raise _bad(path, f"memory.{name}", _NUMBER, value)
    tensors = meta["tensors"]
    for tid, tensor in tensors.items():
        if not isinstance(tensor, dict):
            raise _bad(path, f"tensors.{tid}", _OBJECT, tensor)
        _fields(path, tensor, _TENSOR, f"tensors.{tid}.")
        for key in ("shape", "local_shape"):
            _items(path, tensor.get(key, []), _INT, f"tensors.{tid}.{key}")
        _items(path, tensor.get("placement", []), _STR, f"tensors.{tid}.placement")
    for i, step in enumerate(meta["steps"]):
        if not isinstance(step, dict):
            raise _bad(path, f"steps[{i}]", _OBJECT, step)
        _fields(path, step, _STEP, f"steps[{i}].")
        kind = step.get("kind", "")
        needs = (
            ("op", "inputs", "outputs") if kind == "compute" else ("out", "src", "axis") if kind in _MOVES else ("out",)
        )
        for key in ("kind", *needs):
            if key not in step:
                raise PlanError(f"{path}: missing field 'steps[{i}].{key}'. {_REDO}")
        # inputs hold tensor names and literals (a Reshape's target shape): explain skips what is not a tensor
        _items(path, step.get("outputs", []), _STR_OR_NULL, f"steps[{i}].outputs")
        for key in ("out", "src"):
            if key in step and step[key] not in tensors and kind != "weight":
                raise _bad(path, f"steps[{i}].{key}", "a tensor named in 'tensors'", step[key])
        for out in step.get("outputs", []):
            if out is not None and out not in tensors:
                raise _bad(path, f"steps[{i}].outputs", "tensors named in 'tensors'", out)
