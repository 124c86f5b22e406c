"""``plan.json``: the only code that reads and writes it, as typed records, with one validation for every verb.

Lowering builds a :class:`PlanRecord` (the whole file) and :func:`write_plan_json` writes it; the search fills
the records of what it found (:class:`PlanReport`: mesh search, baselines, extraction, memory, cost) and of how
it went (:class:`StatsRecord`). :func:`read_plan_json` checks the format and what every verb needs;
:func:`read_run_record` gives the runtime its records (:class:`RunRecord`: inputs, outputs, files,
collectives) and :func:`read_explain_record` gives ``explain`` and its pictures theirs (:class:`ExplainRecord`),
so no verb reads a raw dictionary. A plan file that this unity-eq cannot read (another format version, a
missing or mistyped field, a ``files`` list that does not name one plain file per rank, an unknown collective
or step) is a :class:`~unity_eq.errors.PlanError` naming the file and the field, never an IndexError or a
KeyError later on.

A record's fields are its plan.json keys, in the order they are written; a field with a default may be left
out of the file (and is left out when it holds its default; null is refused: absent is how it says "none"), a
field typed ``… | None`` without one is always written, null when None. Values are written as they were given
(``json.dumps`` with indent 1), so a record written and read back is the same record, and plan.json stays byte
for byte what it was when it was a dictionary.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from typing_extensions import assert_never

from unity_eq.errors import PlanError

__all__ = [
    "COLLECTIVE_KINDS",
    "PLAN_FORMAT_VERSION",
    "AxisRecord",
    "AxisTrafficRecord",
    "BaselineRecord",
    "BlocksRecord",
    "CheaperBaselineRecord",
    "CheapestRecord",
    "CollectiveRecord",
    "CombineStepRecord",
    "ComputeStepRecord",
    "CostRecord",
    "DeviceKindRecord",
    "ExplainRecord",
    "ExtractionRecord",
    "IlpProgramRecord",
    "IlpRecord",
    "InputRecord",
    "InputStepRecord",
    "LinkRecord",
    "MachineRecord",
    "MemoryUsageRecord",
    "MeshRecord",
    "MeshSearchRecord",
    "ModelInputRecord",
    "ModelOutputRecord",
    "ModelRecord",
    "NodeRecord",
    "OverlapRecord",
    "ParallelismRecord",
    "PartitionStepRecord",
    "PlanChoiceRecord",
    "PlanMemoryRecord",
    "PlanRecord",
    "PlanReport",
    "ProfileStatsRecord",
    "RankRecord",
    "Record",
    "ReduceStepRecord",
    "ReplicateStepRecord",
    "RunRecord",
    "RunnerUpRecord",
    "SaturationRecord",
    "SkippedRecord",
    "StatsRecord",
    "StepRecord",
    "TensorRecord",
    "TieBreakRecord",
    "TrialSecondsRecord",
    "TriedRecord",
    "WeightStepRecord",
    "json_default",
    "read_explain_record",
    "read_plan_json",
    "read_run_record",
    "write_plan_json",
]

PLAN_FORMAT_VERSION = 1

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


def write_plan_json(path: Path, plan: PlanRecord) -> None:
    """Write ``plan.json`` (indent 1, as every plan so far: plan hashes and diffs stay comparable)."""
    path.write_text(json.dumps(plan.to_json(), indent=1, default=json_default))


def json_default(value: Any) -> Any:
    """What ``json.dumps`` writes for a value it has no rule for: numpy scalars as numbers, tuples as lists,
    anything else as its text."""
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return str(value)


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
    bytes: int | None = None  # per rank (written for users; the runtime does not read it)

    def to_json(self) -> dict[str, Any]:
        """As plan.json holds it (``dim`` is null for an all_reduce)."""
        entry: dict[str, Any] = {"id": self.id, "kind": self.kind, "axis": self.axis, "dim": self.dim}
        if self.split_dim is not None or self.concat_dim is not None:
            entry.update(split_dim=self.split_dim, concat_dim=self.concat_dim)
        entry.update(src=self.src, dst=self.dst, groups=[list(g) for g in self.groups])
        entry.update(bytes=self.bytes, stage=self.stage)
        return entry

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
# Records: how a record becomes its JSON object and back


class Record:
    """A plan.json object as a frozen dataclass (subclasses are ``@dataclass(frozen=True, kw_only=True)``);
    a record with a ``KIND`` is one member of a union told apart by the object's ``kind`` key."""

    KIND: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the fields in order, those holding their default left out."""
        entry: dict[str, Any] = {"kind": self.KIND} if self.KIND else {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if _has_default(f) and value == _default_of(f):
                continue
            entry[f.name] = _encode(value)
        return entry

    @classmethod
    def from_json(cls, raw: Any, path: Path, where: str) -> Self:
        """The record of the JSON object ``raw`` found at ``where`` in ``path``, every field checked."""
        if not isinstance(raw, dict):
            raise _bad(path, where, _OBJECT, raw)
        hints = _hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            inner = f"{where}.{f.name}" if where else f.name
            if f.name not in raw:
                if not _has_default(f):
                    raise PlanError(f"{path}: missing field {inner!r}. {_REDO}")
                continue
            value = raw[f.name]
            if value is None and _has_default(f):  # absent is how a field with a default says "none"
                raise _bad(path, inner, _describe(_without_none(hints[f.name])), value)
            values[f.name] = _decode(hints[f.name], value, path, inner)
        return cls(**values)


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default_of(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default


def _encode(value: Any) -> Any:
    if isinstance(value, Record | CollectiveRecord):
        return value.to_json()
    if isinstance(value, Mapping):
        return {key: _encode(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_encode(item) for item in value]
    return value  # as given: json.dumps writes it (numpy scalars through json_default)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The fields' types of a record, evaluated once (the annotations are strings)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _members(tp: Any) -> tuple[Any, ...]:
    """The members of a union type (``A | B``), or ``(tp,)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _without_none(tp: Any) -> Any:
    members = [m for m in _members(tp) if m is not type(None)]
    return members[0] if len(members) == 1 else typing.Union[tuple(members)]  # noqa: UP007


_OBJECT, _LIST, _STR, _INT, _NUMBER, _BOOL = "an object", "a list", "a string", "an integer", "a number", "true/false"


def _describe(tp: Any) -> str:
    """What a value of type ``tp`` is, in a user's words (``an object``, ``a number or null``)."""
    members = _members(tp)
    if len(members) > 1:
        words = [_describe(m) for m in members if m is not type(None)]
        return " or ".join(dict.fromkeys(words)) + (" or null" if type(None) in members else "")
    origin = typing.get_origin(tp)
    if origin is tuple:
        return _LIST
    if origin is Mapping or (isinstance(tp, type) and issubclass(tp, Record)):
        return _OBJECT
    return {str: _STR, int: _INT, float: _NUMBER, bool: _BOOL}.get(tp, "a value")


def _decode(tp: Any, raw: Any, path: Path, where: str) -> Any:
    """``raw`` (from json.loads) as a value of type ``tp``, or a PlanError naming ``where``."""
    if tp is Any:
        return raw
    members = _members(tp)
    if len(members) > 1:
        if raw is None and type(None) in members:
            return None
        kinds = {m.KIND: m for m in members if isinstance(m, type) and issubclass(m, Record) and m.KIND}
        if kinds:  # a union of records told apart by their kind
            if not isinstance(raw, dict):
                raise _bad(path, where, _OBJECT, raw)
            if "kind" not in raw:
                raise PlanError(f"{path}: missing field {where + '.kind'!r}. {_REDO}")
            kind = raw["kind"]
            if not isinstance(kind, str) or kind not in kinds:
                raise _bad(path, f"{where}.kind", "one of " + ", ".join(kinds), kind)
            return kinds[kind].from_json(raw, path, where)
        for member in members:
            if member is not type(None) and _fits(member, raw):
                return _decode(member, raw, path, where)
        raise _bad(path, where, _describe(tp), raw)
    origin = typing.get_origin(tp)
    if origin is tuple:
        if not isinstance(raw, list):
            raise _bad(path, where, _LIST, raw)
        item = typing.get_args(tp)[0]
        return tuple(_decode(item, value, path, f"{where}[{i}]") for i, value in enumerate(raw))
    if origin is Mapping:
        if not isinstance(raw, dict):
            raise _bad(path, where, _OBJECT, raw)
        item = typing.get_args(tp)[1]
        return {key: _decode(item, value, path, f"{where}.{key}") for key, value in raw.items()}
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_json(raw, path, where)
    if not _fits(tp, raw):
        raise _bad(path, where, _describe(tp), raw)
    return raw  # as read: an integer where a number is expected stays one, so it is written back the same


def _fits(tp: Any, raw: Any) -> bool:
    """Whether ``raw`` has the JSON shape of ``tp`` (its items are checked when it is decoded)."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        return isinstance(raw, list)
    if origin is Mapping or (isinstance(tp, type) and issubclass(tp, Record)):
        return isinstance(raw, dict)
    if tp is bool:
        return isinstance(raw, bool)
    if tp is int:
        return isinstance(raw, int) and not isinstance(raw, bool)
    if tp is float:
        return isinstance(raw, int | float) and not isinstance(raw, bool)
    if tp is str:
        return isinstance(raw, str)
    raise TypeError(f"plan.json records: no rule for {tp!r}")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _bad(path: Path, field: str, what: str, value: Any) -> PlanError:
    return PlanError(f"{path}: field {field!r}: expected {what}, got {_shown(value)}. {_REDO}")


# ----------------------------------------------------------------------------------------------------------
# The sections of plan.json


@dataclass(frozen=True, kw_only=True)
class ModelInputRecord(Record):
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, kw_only=True)
class ModelOutputRecord(Record):
    shape: tuple[int, ...]
    dtype: str
    tensor: str  # the plan's tensor that holds it


@dataclass(frozen=True, kw_only=True)
class ModelRecord(Record):
    """``model``: the source model's name, file and fingerprint, its inputs and outputs."""

    name: str
    source: str
    fingerprint: str | None = None  # of what the model computes (frontends.onnx.model_fingerprint)
    inputs: Mapping[str, ModelInputRecord]
    outputs: Mapping[str, ModelOutputRecord]


@dataclass(frozen=True, kw_only=True)
class RankRecord(Record):
    """One rank of the mesh: its coordinates and the machine device (kind, node) it runs on."""

    rank: int
    coords: tuple[int, ...]
    device: int
    device_kind: str
    node: int


@dataclass(frozen=True, kw_only=True)
class MeshRecord(Record):
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    devices: tuple[int, ...]  # the machine device of each rank
    ranks: tuple[RankRecord, ...]

    @property
    def label(self) -> str:
        """``x=2,y=4``"""
        return ",".join(f"{a}={n}" for a, n in zip(self.axes, self.sizes, strict=True))


@dataclass(frozen=True, kw_only=True)
class DeviceKindRecord(Record):
    peak_flops: Mapping[str, float]  # FLOP/s per dtype
    memory_bandwidth_bytes_s: float
    memory_bytes: float


@dataclass(frozen=True, kw_only=True)
class LinkRecord(Record):
    name: str
    bandwidth_bytes_s: float | None  # null: unlimited
    latency_s: float


@dataclass(frozen=True, kw_only=True)
class NodeRecord(Record):
    """One node of the machine: its devices, the link between them and its network to the other nodes."""

    name: str
    devices: tuple[int, ...]
    link: LinkRecord
    network: LinkRecord | None
    nics: int


@dataclass(frozen=True, kw_only=True)
class AxisRecord(Record):
    """How a mesh axis sits on the machine (unity_eq.cost.axis_info)."""

    name: str
    size: int
    spans_nodes: bool
    nodes: int
    ranks_per_node: int
    link: str
    bandwidth_gbs: float | None


@dataclass(frozen=True, kw_only=True)
class MachineRecord(Record):
    """``machine``: device kinds, nodes and links (SI units: FLOP/s, bytes/s, s), and the mesh's axes on it."""

    name: str
    source: str
    devices: int
    nodes: int
    device_kinds: Mapping[str, DeviceKindRecord]
    node_list: tuple[NodeRecord, ...]
    launch_overhead_s: float
    efficiency: float
    memory_fraction: float
    mesh_axes: tuple[AxisRecord, ...]


@dataclass(frozen=True, kw_only=True)
class AxisTrafficRecord(Record):
    """Communication on one mesh axis by phase (unity_eq.report)."""

    forward_s: float
    backward_s: float
    gradient_s: float


@dataclass(frozen=True, kw_only=True)
class OverlapRecord(Record):
    """Training: how much of the gradient all-reduce traffic can hide behind the backward pass."""

    gradient_all_reduce_s: float
    overlappable_s: float
    exposed_s: float
    backward_s: float
    note: str


@dataclass(frozen=True, kw_only=True)
class CostRecord(Record):
    """``cost``: the predicted time per step, split into compute and communication (by axis and phase)."""

    total_s: float
    compute_s: float
    communication_s: float
    communication_by_axis: Mapping[str, AxisTrafficRecord] | None = None
    overlap: OverlapRecord | None = None


@dataclass(frozen=True, kw_only=True)
class TensorRecord(Record):
    """One tensor of the plan: global shape, placement per mesh axis, each rank's piece."""

    shape: tuple[int, ...]
    dtype: str
    placement: tuple[str, ...]
    local_shape: tuple[int, ...]
    source: str | None = None  # the source model's tensor it equals
    value: str | None = None  # the source model's tensor whose value it holds, sharded or not


# The steps: one record per kind; the predicted seconds are there when the plan was priced step by step.


@dataclass(frozen=True, kw_only=True)
class ComputeStepRecord(Record):
    KIND: ClassVar[str] = "compute"
    op: str
    inputs: tuple[str | tuple[int, ...] | None, ...]  # tensors, literals (a Reshape's shape), absent inputs
    outputs: tuple[str, ...]  # "" for an output nobody reads
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class InputStepRecord(Record):
    KIND: ClassVar[str] = "input"
    out: str
    name: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class WeightStepRecord(Record):
    KIND: ClassVar[str] = "weight"
    out: str
    name: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class PartitionStepRecord(Record):
    KIND: ClassVar[str] = "partition"
    out: str
    src: str
    dim: int
    axis: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class CombineStepRecord(Record):
    KIND: ClassVar[str] = "combine"
    out: str
    src: str
    dim: int
    axis: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ReduceStepRecord(Record):
    KIND: ClassVar[str] = "reduce"
    out: str
    src: str
    axis: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ReplicateStepRecord(Record):
    KIND: ClassVar[str] = "replicate"
    out: str
    src: str
    axis: str
    compute_s: float | None = None
    communication_s: float | None = None


StepRecord = (
    ComputeStepRecord
    | InputStepRecord
    | WeightStepRecord
    | PartitionStepRecord
    | CombineStepRecord
    | ReduceStepRecord
    | ReplicateStepRecord
)


# What the search found (mesh_search, baselines, extraction, blocks, parallelism, memory, cost)


@dataclass(frozen=True, kw_only=True)
class TrialSecondsRecord(Record):
    saturate: float
    extract: float


@dataclass(frozen=True, kw_only=True)
class TriedRecord(Record):
    """One mesh the search tried (unity_eq.search.trial.MeshTrial) and what became of it."""

    mesh: str
    axes: tuple[AxisRecord, ...]
    status: str  # ok, infeasible (nothing fits), failed
    devices: str | None = None  # a mesh over part of the machine: its devices (``0-3``), count and kind
    device_count: int | None = None
    device_kind: str | None = None
    reason: str = ""
    cost_s: float | None = None  # its plan's cost
    compute_s: float | None = None
    communication_s: float | None = None
    extraction: str | None = None
    memory_bytes: float | None = None
    min_memory_bytes: float | None = None  # infeasible: the smallest plan found
    enodes: int | None = None
    stop_reason: str | None = None
    penalty_rounds: int | None = None
    seconds: TrialSecondsRecord | None = None
    egraph_of: str = ""  # the mesh whose e-graph it reuses (the one-device plan)
    baseline_only: bool = False  # evaluated only for a baseline (under `--mesh`)


@dataclass(frozen=True, kw_only=True)
class RunnerUpRecord(Record):
    mesh: str
    cost_s: float


@dataclass(frozen=True, kw_only=True)
class SkippedRecord(Record):
    mesh: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class MeshSearchRecord(Record):
    """``mesh_search``: the mesh chosen, those tried and skipped, and the cheapest other one."""

    chosen: str
    tried: tuple[TriedRecord, ...]
    runner_up: RunnerUpRecord | None
    skipped: tuple[SkippedRecord, ...]


@dataclass(frozen=True, kw_only=True)
class BaselineRecord(Record):
    """A hand-made strategy priced under the same cost model; ``ratio`` is its cost over the plan's."""

    description: str
    mesh: str
    devices: int
    devices_used: int  # devices doing distinct work (the rest repeat them)
    total_s: float
    compute_s: float
    communication_s: float
    memory_bytes: float
    fits: bool
    sharded: bool
    ratio: float | None


@dataclass(frozen=True, kw_only=True)
class CheapestRecord(Record):
    mesh: str
    extraction: str
    total_s: float
    communication_s: float


@dataclass(frozen=True, kw_only=True)
class TieBreakRecord(Record):
    """A tie (within ``tolerance``) went to a plan that communicates less than the cheapest."""

    tolerance: float
    cheapest: CheapestRecord
    reason: str
    note: str


@dataclass(frozen=True, kw_only=True)
class CheaperBaselineRecord(Record):
    name: str
    total_s: float
    note: str


@dataclass(frozen=True, kw_only=True)
class PlanChoiceRecord(Record):
    """How the plan relates to the baselines: the baseline it is, or a cheaper one out of the search's reach."""

    baseline: str | None
    note: str | None = None
    cheaper_baseline: CheaperBaselineRecord | None = None


@dataclass(frozen=True, kw_only=True)
class IlpProgramRecord(Record):
    """What HiGHS said about one program (unity_eq.extract.ilp.IlpReport)."""

    status: str
    objective_s: float
    lower_bound_s: float
    gap: float
    seconds: float
    variables: int
    rows: int
    greedy_objective_s: float


@dataclass(frozen=True, kw_only=True)
class IlpRecord(Record):
    """``--extractor ilp``: the exact extraction against the greedy one, and which plan was kept."""

    greedy_total_s: float
    ilp_total_s: float
    kept: str
    programs: tuple[IlpProgramRecord, ...]
    max_gap: float
    all_optimal: bool


@dataclass(frozen=True, kw_only=True)
class ExtractionRecord(Record):
    """``extraction``: how the plan was extracted and how memory was handled."""

    method: str
    restriction: str
    memory_penalty_rounds: int
    memory_penalty_s_per_byte: float
    memory_handling: str
    tie_break: TieBreakRecord | None
    plan_choice: PlanChoiceRecord
    ilp: IlpRecord | None = None


@dataclass(frozen=True, kw_only=True)
class BlocksRecord(Record):
    """``blocks``: the pieces of a model optimized block by block (unity_eq.split.BlockSplit)."""

    pieces: int
    distinct: int
    nodes_per_piece: tuple[int, ...]
    cuts: tuple[str, ...]
    copies: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ParallelismRecord(Record):
    """``parallelism``: the mesh axes the plan uses and how many devices do distinct work (unity_eq.report)."""

    used_axes: tuple[str, ...]
    unused_axes: tuple[str, ...]
    devices: int
    devices_used: int
    copies: int
    machine_devices: int
    idle_devices: int | None = None  # the plan runs on part of the machine
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class MemoryUsageRecord(Record):
    """Bytes per device of a plan (unity_eq.memory.MemoryUsage)."""

    weight_bytes: float
    weight_state_bytes: float
    activation_bytes: float
    total_bytes: float
    capacity_bytes: float
    fits: bool


_USAGE_KEYS = tuple(f.name for f in dataclasses.fields(MemoryUsageRecord))


@dataclass(frozen=True, kw_only=True)
class PlanMemoryRecord(Record):
    """``memory``: the memory per device the search predicted (absent for a plan lowered without a search),
    and the weight bytes written for each rank, in one object."""

    usage: MemoryUsageRecord | None
    weight_bytes_per_rank: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**(self.usage.to_json() if self.usage else {}), "weight_bytes_per_rank": self.weight_bytes_per_rank}

    @classmethod
    def from_json(cls, raw: Any, path: Path, where: str) -> Self:
        if not isinstance(raw, dict):
            raise _bad(path, where, _OBJECT, raw)
        usage = MemoryUsageRecord.from_json(raw, path, where) if any(k in raw for k in _USAGE_KEYS) else None
        per_rank = raw.get("weight_bytes_per_rank", [])
        return cls(
            usage=usage,
            weight_bytes_per_rank=_decode(tuple[int, ...], per_rank, path, f"{where}.weight_bytes_per_rank"),
        )


@dataclass(frozen=True)
class PlanReport:
    """What the search found besides the plan (plan.json sections of the same names; see unity_eq.search)."""

    mesh_search: MeshSearchRecord | None = None
    baselines: Mapping[str, BaselineRecord] = field(default_factory=dict)
    blocks: BlocksRecord | None = None
    extraction: ExtractionRecord | None = None
    parallelism: ParallelismRecord | None = None
    memory: MemoryUsageRecord | None = None
    cost: CostRecord | None = None


@dataclass(frozen=True, kw_only=True)
class SaturationRecord(Record):
    stop_reason: str
    iterations: int
    enodes: int
    seconds: float
    worker_peak_mib: float


@dataclass(frozen=True, kw_only=True)
class ProfileStatsRecord(Record):
    """How many op prices came from a measured profile and how many from the roofline."""

    device: str | None
    measured: int
    roofline: int


@dataclass(frozen=True, kw_only=True)
class StatsRecord(Record):
    """``stats``: how the search went (the chosen mesh's saturation, wall-clock timings, the profile used)."""

    ilp: IlpProgramRecord | None = None  # a plan of unity_eq.extract.ilp.extract_ilp
    saturation: SaturationRecord | None = None
    timings: Mapping[str, float] | None = None
    profile: ProfileStatsRecord | None = None


# ----------------------------------------------------------------------------------------------------------
# The whole file as lowering writes it, and the part `explain` reads


@dataclass(frozen=True, kw_only=True)
class PlanRecord(Record):
    """The content of plan.json (docs/plan-format.md)."""

    format_version: int
    unity_eq_version: str
    model: ModelRecord
    objective: str
    mesh: MeshRecord
    machine: MachineRecord
    cost: CostRecord
    files: tuple[str, ...]
    tensors: Mapping[str, TensorRecord]
    steps: tuple[StepRecord, ...]
    collectives: tuple[CollectiveRecord, ...]
    shardings: Mapping[str, tuple[str, ...]]
    mesh_search: MeshSearchRecord | None = None
    baselines: Mapping[str, BaselineRecord] = field(default_factory=dict)
    extraction: ExtractionRecord | None = None
    blocks: BlocksRecord | None = None
    parallelism: ParallelismRecord | None = None
    stats: StatsRecord
    plan_hash: str
    memory: PlanMemoryRecord


@dataclass(frozen=True, kw_only=True)
class ExplainRecord(Record):
    """What ``explain`` and its pictures read: every section but model, mesh, tensors and steps may be absent
    (a plan lowered without a search has no mesh_search, baselines, extraction or parallelism)."""

    model: ModelRecord
    objective: str | None = None
    mesh: MeshRecord
    machine: MachineRecord | None = None
    cost: CostRecord | None = None
    tensors: Mapping[str, TensorRecord]
    steps: tuple[StepRecord, ...]
    mesh_search: MeshSearchRecord | None = None
    baselines: Mapping[str, BaselineRecord] = field(default_factory=dict)
    extraction: ExtractionRecord | None = None
    parallelism: ParallelismRecord | None = None
    memory: PlanMemoryRecord | None = None

    @property
    def training(self) -> bool:
        return self.objective == "training"


def read_explain_record(meta_path: Path) -> ExplainRecord:
    """Read plan.json for ``explain``: the checks `run` makes, then every field explain reads with its type,
    and that the steps name tensors the plan has; or one PlanError naming the file and the field."""
    meta = read_plan_json(meta_path, need=("steps", "tensors"))
    record = ExplainRecord.from_json(meta, meta_path, "")
    mesh = record.mesh
    if len(mesh.sizes) != len(mesh.axes):
        raise _bad(meta_path, "mesh.sizes", f"{len(mesh.axes)} sizes (one per axis)", list(mesh.sizes))
    tensors = record.tensors
    for i, step in enumerate(record.steps):
        names: list[tuple[str, str]]  # (field, tensor)
        match step:
            case ComputeStepRecord():
                names = [("outputs", out) for out in step.outputs if out]
            case WeightStepRecord():
                names = []  # its tensor may be gone: folded into what it makes at lowering
            case InputStepRecord():
                names = [("out", step.out)]
            case PartitionStepRecord() | CombineStepRecord() | ReduceStepRecord() | ReplicateStepRecord():
                names = [("out", step.out), ("src", step.src)]
            case _:
                assert_never(step)
        for key, name in names:
            if name not in tensors:
                what = "tensors named in 'tensors'" if key == "outputs" else "a tensor named in 'tensors'"
                raise _bad(meta_path, f"steps[{i}].{key}", what, name)
    return record
