"""Measured op times (`unity-eq profile`'s table) as the cost model reads them.

A value type below the cost model: pricing looks ops up here, while measuring them (the profile package) needs the
whole engine. Keeping the table apart is what lets ``cost`` import it without importing the engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.errors import OptionError, UnityEqError

PROFILE_FORMAT_VERSION = 1


class ProfileError(UnityEqError):
    """A profile table is missing, unreadable or of another format."""


def jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def frozen_value(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(frozen_value(v) for v in value)
    if isinstance(value, np.ndarray):
        return tuple(frozen_value(v) for v in value.tolist())
    return value


@dataclass
class Calibration:
    """The local device as the roofline sees it: what a large MatMul, a large Add and a tiny op achieve."""

    device: str
    peak_flops: float  # float32 FLOP/s
    memory_bandwidth: float  # bytes/s (read + written)
    launch_overhead_s: float
    memory_bytes: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "peak_flops": {"float32": self.peak_flops},
            "memory_bandwidth": self.memory_bandwidth,
            "launch_overhead_s": self.launch_overhead_s,
            "memory_bytes": self.memory_bytes,
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        return cls(
            str(data["device"]),
            float(data["peak_flops"]["float32"]),
            float(data["memory_bandwidth"]),
            float(data["launch_overhead_s"]),
            float(data.get("memory_bytes", 0.0)),
            dict(data.get("details", {})),
        )


@dataclass
class ProfileTable:
    """Measured op times for one device. ``lookup`` is what :meth:`CostModel.compute` calls."""

    meta: dict[str, Any]
    entries: list[dict[str, Any]]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    hits: int = 0
    misses: int = 0
    _index: dict[tuple[Any, ...], list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for entry in self.entries:
            shapes, out, dtype = list(entry["key"]["in_shapes"]), entry["key"]["out_shape"], entry["key"]["dtype"]
            self._index.setdefault(self._key(entry["op"], shapes, out, dtype), []).append(entry)
            # tables written when a trailing absent operand was keyed as [] (pricing now leaves it out) are
            # found under today's key too (a trailing scalar operand looks the same: its timing is the op's)
            stripped = list(shapes)
            while stripped and not stripped[-1]:
                stripped.pop()
            if len(stripped) < len(shapes):
                self._index.setdefault(self._key(entry["op"], stripped, out, dtype), []).append(entry)

    @staticmethod
    def _key(op: str, in_shapes: Iterable[Iterable[int]], out_shape: Iterable[int], dtype: str) -> tuple[Any, ...]:
        return (op, tuple(tuple(int(d) for d in s) for s in in_shapes), tuple(int(d) for d in out_shape), dtype)

    @property
    def calibration(self) -> Calibration | None:
        data = self.meta.get("calibration")
        return Calibration.from_json(data) if data else None

    def lookup(
        self,
        op_type: str,
        in_shapes: Sequence[Sequence[int] | None],
        out_shape: Sequence[int],
        dtype: str,
        attrs: Mapping[str, Any] | None = None,
        *,
        count: bool = True,
        backward: bool = False,
    ) -> float | None:
        """Measured forward seconds of one op on these local shapes, or None (then the roofline prices it).
        ``count``: add the answer to ``hits`` / ``misses`` (the statistics ``optimize`` reports). ``backward``:
        its backward seconds instead (the entry's ``backward_s``: forward + backward measured in torch, less its
        forward), or None when the table has no backward for it; never counted."""
        found = self._found(op_type, in_shapes, out_shape, dtype, attrs)
        if backward:
            found = [e for e in found if e.get("backward_s") is not None]
            return max(float(e["backward_s"]) for e in found) if found else None
        if count:
            if found:
                self.hits += 1
            else:
                self.misses += 1
        return max(float(e["median_s"]) for e in found) if found else None

    def _found(
        self,
        op_type: str,
        in_shapes: Sequence[Sequence[int] | None],
        out_shape: Sequence[int],
        dtype: str,
        attrs: Mapping[str, Any] | None,
    ) -> list[dict[str, Any]]:
        # an absent optional operand (None) is keyed as ``()``, as the profile's instances write it
        shapes = [() if s is None else s for s in in_shapes]
        found = self._index.get(self._key(op_type, shapes, out_shape, dtype), [])
        if attrs is not None:
            wanted = {k: jsonable(frozen_value(v)) for k, v in attrs.items()}
            found = [e for e in found if e["attrs"] == wanted]
        return found

    def to_json(self) -> dict[str, Any]:
        return {**self.meta, "entries": self.entries, "skipped": self.skipped}

    def save(self, path: str | Path) -> Path:
        target = Path(path)
        if target.is_dir():
            raise OptionError(f"`-o` {target}: is a directory; pass a file name such as {target / 'profile.json'}.")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(target)
        return target

    def describe(self) -> str:
        summary = self.meta.get("summary", {})
        return (
            f"{len(self.entries)} op(s) measured on {self.meta.get('device', {}).get('description', '?')}, "
            f"{len(self.skipped)} skipped; roofline median relative error "
            f"{summary.get('median_relative_error', float('nan')):.2f}"
        )


def load_profile(path: str | Path) -> ProfileTable:
    """Read a table written by ``unity-eq profile`` (or :meth:`ProfileTable.save`)."""
    source = Path(path)
    if not source.exists():
        raise ProfileError(f"{source}: profile table not found. Make one with `unity-eq profile MODEL -o {source}`.")
    try:
        data = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{source}: unreadable profile table ({exc}). Re-run `unity-eq profile`.") from None
    if not isinstance(data, dict) or data.get("kind") != "unity-eq-profile":
        raise ProfileError(f"{source}: not a unity-eq profile table. Make one with `unity-eq profile`.")
    if data.get("format_version") != PROFILE_FORMAT_VERSION:
        raise ProfileError(
            f"{source}: profile format version {data.get('format_version')!r}, this unity-eq reads "
            f"{PROFILE_FORMAT_VERSION}. Re-run `unity-eq profile`."
        )
    entries = data.pop("entries", [])
    skipped = data.pop("skipped", [])
    try:
        return ProfileTable(data, entries, skipped)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{source}: malformed entry ({exc!r}). Re-run `unity-eq profile`.") from None
