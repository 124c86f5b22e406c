"""What running a plan reads, as typed records: :class:`RunRecord` (inputs, outputs, files, collectives, each
:class:`CollectiveRecord` with the fields its kind needs) and :func:`read_run_record`, which checks every field
the runtime uses once, when the plan loads."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.collectives.registry import RUNTIME_FIELDS
from unity_eq.errors import PlanError
from unity_eq.planfile.checks import INT, LIST, OBJECT, REDO, STR, bad, read_plan_json

#: plan.json ``kind`` of every collective the runtime executes, with the fields each needs besides the common ones
#: (the communicating kinds of :mod:`unity_eq.collectives`)
COLLECTIVE_KINDS: Mapping[str, tuple[str, ...]] = RUNTIME_FIELDS


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

    def dims(self) -> dict[str, int]:
        """Its kind's integer fields by name, as the kind's runtime op takes them."""
        found = {"dim": self.dim, "split_dim": self.split_dim, "concat_dim": self.concat_dim}
        return {name: value for name, value in found.items() if value is not None}

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
    if meta.get("plan_only") is True:
        raise PlanError(
            f"{meta_path.parent}: a plan-only plan (`optimize --plan-only`) has no device files to run. Re-run "
            "`unity-eq optimize` without `--plan-only`, with the model's weight data present, to write them."
        )
    model = _need(meta_path, meta, "model", dict, "model")
    inputs = _need(meta_path, model, "inputs", dict, "model.inputs")
    records = {}
    for name, spec in inputs.items():
        where = f"model.inputs.{name}"
        shape = _need(meta_path, spec if isinstance(spec, dict) else {}, "shape", list, where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise bad(meta_path, f"{where}.shape", "a list of sizes", shape)
        records[name] = InputRecord(tuple(shape), _need(meta_path, spec, "dtype", str, where))
    outputs = model.get("outputs")  # names, with their shapes and dtypes (an object) since format 1
    if not isinstance(outputs, dict | list) or not all(isinstance(o, str) for o in outputs):
        raise bad(meta_path, "model.outputs", "an object of output names", outputs)
    collectives = _need(meta_path, meta, "collectives", list, "collectives")
    world = len(meta["files"])
    axes: dict[str, list[tuple[int, ...]]] = {}  # the mesh's groups, read at the first collective
    fingerprint = model.get("fingerprint")
    hash_ = meta.get("plan_hash")
    return RunRecord(
        model_name=str(model.get("name", "")),
        source=model.get("source") if isinstance(model.get("source"), str) else None,
        fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        inputs=records,
        outputs=tuple(outputs),
        files=tuple(meta["files"]),
        collectives=tuple(_collective(meta_path, c, i, world, meta["mesh"], axes) for i, c in enumerate(collectives)),
        plan_hash=hash_ if isinstance(hash_, str) else None,
    )


def _need(path: Path, obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        what = {dict: OBJECT, list: LIST, str: STR, int: INT}[kind]
        raise bad(path, where if where.endswith(key) else f"{where}.{key}", what, value)
    return value


def _mesh_axes(path: Path, mesh: Any, world: int) -> dict[str, list[tuple[int, ...]]]:
    """Every mesh axis with its groups (as ``Mesh.groups`` makes them: the ranks that differ only along the
    axis, in axis order, groups in the order of their first rank), from plan.json's mesh."""
    axes, sizes = mesh.get("axes"), mesh.get("sizes")
    if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes) or len(set(axes)) != len(axes):
        raise bad(path, "mesh.axes", "a list of distinct axis names", axes)
    if (
        not isinstance(sizes, list)
        or len(sizes) != len(axes)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)
        or math.prod(sizes) != world
    ):
        raise bad(path, "mesh.sizes", f"{len(axes)} positive sizes whose product is the {world} ranks", sizes)
    ranks = np.arange(world, dtype=np.int64).reshape(sizes)
    return {
        axis: [tuple(row) for row in np.moveaxis(ranks, i, -1).reshape(-1, sizes[i]).tolist()]
        for i, axis in enumerate(axes)
    }


def _check_axis(
    path: Path, where: str, axis: str, groups: list[Any], mesh: Mapping[str, list[tuple[int, ...]]]
) -> None:
    """A collective's groups are its axis's groups: the runtime runs the groups, so a plan.json whose groups
    and axis disagree (hand-edited, or another plan's) would run a collective other than the one planned."""
    if axis not in mesh:
        raise bad(path, f"{where}.axis", f"a mesh axis ({', '.join(mesh)})", axis)
    if [tuple(g) for g in groups] != mesh[axis]:
        raise PlanError(
            f"{path}: field '{where}.groups': the groups of mesh axis {axis!r} are "
            f"{[list(g) for g in mesh[axis]]}, plan.json has {[list(g) for g in groups]}: the collective's groups "
            f"and axis disagree. {REDO}"
        )


def _collective(
    path: Path, raw: Any, index: int, world: int, mesh_raw: Any, mesh: dict[str, list[tuple[int, ...]]]
) -> CollectiveRecord:
    where = f"collectives[{index}]"
    if not isinstance(raw, dict):
        raise bad(path, where, OBJECT, raw)
    kind = _need(path, raw, "kind", str, where)
    if kind not in COLLECTIVE_KINDS:
        known = ", ".join(COLLECTIVE_KINDS)
        raise PlanError(f"{path}: field '{where}.kind': unknown collective {kind!r}; expected {known}. {REDO}")
    groups = _need(path, raw, "groups", list, where)
    for group in groups:
        if not isinstance(group, list) or not all(isinstance(r, int) and 0 <= r < world for r in group):
            raise bad(path, f"{where}.groups", f"lists of ranks below {world}", groups)
    extra = {name: _need(path, raw, name, int, where) for name in COLLECTIVE_KINDS[kind]}
    if not mesh:
        mesh.update(_mesh_axes(path, mesh_raw, world))
    _check_axis(path, where, _need(path, raw, "axis", str, where), groups, mesh)
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
