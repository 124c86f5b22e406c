"""Records: how a plan.json record becomes its JSON object and back (:class:`Record`, one generic encoding and
one checked decoding for every record, driven by the fields' types).

A record's fields are its plan.json keys, in the order they are written; a field with a default may be left
out of the file (and is left out when it holds its default; null is refused: absent is how it says "none"), a
field typed ``… | None`` without one is always written, null when None. A :class:`CollectiveRecord` (the
runtime's, not a :class:`Record`) is written through its own ``to_json``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from unity_eq.errors import PlanError
from unity_eq.planfile.checks import BOOL, INT, LIST, NUMBER, OBJECT, REDO, STR, bad
from unity_eq.planfile.run import CollectiveRecord


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
            raise bad(path, where, OBJECT, raw)
        hints = _hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            inner = f"{where}.{f.name}" if where else f.name
            if f.name not in raw:
                if not _has_default(f):
                    raise PlanError(f"{path}: missing field {inner!r}. {REDO}")
                continue
            value = raw[f.name]
            if value is None and _has_default(f):  # absent is how a field with a default says "none"
                raise bad(path, inner, _describe(_without_none(hints[f.name])), value)
            values[f.name] = decode(hints[f.name], value, path, inner)
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


def _describe(tp: Any) -> str:
    """What a value of type ``tp`` is, in a user's words (``an object``, ``a number or null``)."""
    members = _members(tp)
    if len(members) > 1:
        words = [_describe(m) for m in members if m is not type(None)]
        return " or ".join(dict.fromkeys(words)) + (" or null" if type(None) in members else "")
    origin = typing.get_origin(tp)
    if origin is tuple:
        return LIST
    if origin is Mapping or (isinstance(tp, type) and issubclass(tp, Record)):
        return OBJECT
    return {str: STR, int: INT, float: NUMBER, bool: BOOL}.get(tp, "a value")


def decode(tp: Any, raw: Any, path: Path, where: str) -> Any:
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
                raise bad(path, where, OBJECT, raw)
            if "kind" not in raw:
                raise PlanError(f"{path}: missing field {where + '.kind'!r}. {REDO}")
            kind = raw["kind"]
            if not isinstance(kind, str) or kind not in kinds:
                raise bad(path, f"{where}.kind", "one of " + ", ".join(kinds), kind)
            return kinds[kind].from_json(raw, path, where)
        for member in members:
            if member is not type(None) and _fits(member, raw):
                return decode(member, raw, path, where)
        raise bad(path, where, _describe(tp), raw)
    origin = typing.get_origin(tp)
    if origin is tuple:
        if not isinstance(raw, list):
            raise bad(path, where, LIST, raw)
        item = typing.get_args(tp)[0]
        return tuple(decode(item, value, path, f"{where}[{i}]") for i, value in enumerate(raw))
    if origin is Mapping:
        if not isinstance(raw, dict):
            raise bad(path, where, OBJECT, raw)
        item = typing.get_args(tp)[1]
        return {key: decode(item, value, path, f"{where}.{key}") for key, value in raw.items()}
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_json(raw, path, where)
    if not _fits(tp, raw):
        raise bad(path, where, _describe(tp), raw)
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
