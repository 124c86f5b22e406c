"""Instances per operator: every argument list of an op the bounded ranges hold, with its output shape.

The ranges themselves are stated in :mod:`unity_eq.verify._gen` (and docs/verify.md, "Ranges")."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from unity_eq.ops.family import IndexShape, OpCase
from unity_eq.ops.registry import OPS, family_for
from unity_eq.ops.spec import OpSpec
from unity_eq.verify._semantics import SYMBOLIC, VarSpec
from unity_eq.verify._tensor import NEGATIVE_AXES, ShapeError, infer_shape


@dataclass(frozen=True)
class GenConfig:
    """``dims``: the sizes every dimension takes; ``max_rank`` of free tensors and of the elementwise, MatMul
    and layout families; ``other_rank`` of the other families; ``rank4_dims``: the dims of rank-4 broadcast
    and batched MatMul instances; ``sample``: rank 3-4 shapes from an orthogonal array (4 dims needed) and
    every ``stride``-th instance (the numeric back-up; never a proof); ``wide``: the sizes a family otherwise
    keeps small to bound z3's work (a three-operand Concat's operands, Attention's sequence and head dims)
    range over ``dims`` too (the size sweep of a rule that reads sizes, verify/_sizes.py); ``cap``: at most this
    many instances per op, a seeded shuffle of them (0: every one)."""

    dims: tuple[int, ...] = (1, 2, 3, 4)
    max_rank: int = 4
    other_rank: int = 3
    rank4_dims: tuple[int, ...] = (1, 2, 4)
    stride: int = 1
    sample: bool = False
    wide: bool = False
    cap: int = 0


# ----------------------------------------------------------------------------------------------------------
# Instances per operator: (argument values aligned with the constructor, output shape)

Instance = tuple[tuple[Any, ...], tuple[int, ...]]


def _attrs(spec: OpSpec, **given: Any) -> dict[str, Any]:
    out = {}
    for arg in spec.args:
        if arg.kind != "attr" and arg.sort != "IVec":
            continue
        if arg.name in given:
            out[arg.name] = given[arg.name]
        elif arg.sort == "f64":
            out[arg.name] = SYMBOLIC
        elif arg.sort == "i64":
            out[arg.name] = arg.default if arg.default is not None else 1
        elif arg.sort == "String":
            out[arg.name] = arg.default if arg.default is not None else ""
        else:
            out[arg.name] = tuple(arg.default) if isinstance(arg.default, tuple | list) else ()
    return out


def _make(spec: OpSpec, tensors: dict[str, Any], attrs: dict[str, Any], index: int | None = None) -> Instance | None:
    args = []
    for arg in spec.args:
        args.append(tensors[arg.name] if arg.sort in ("T", "TList") else attrs[arg.name])
    if spec.multi_output:
        args.append(index)
    shape_args = [
        (a.shape if isinstance(a, VarSpec) else [x.shape for x in a] if isinstance(a, list) else a) for a in args
    ]
    try:
        out = infer_shape(spec.name, shape_args)
    except ShapeError:
        return None
    return tuple(args), out


def _instances_of(spec: OpSpec, cfg: GenConfig) -> Iterator[Instance]:
    """The op's family's instances (shapes and attributes by name) made into argument tuples here, so that a
    family module needs none of the verifier's types."""
    family = family_for(spec.name)
    if family is None:
        raise KeyError(f"{spec.name}: no op family in unity_eq/ops/registry.py")
    for case in family.instances(spec, cfg):
        case = case if isinstance(case, OpCase) else OpCase(*case)
        tensors = {name: _var_spec(shape) for name, shape in case.tensors.items()}
        for attrs in (case.attrs, _negative_spelling(spec, case)):
            if attrs is None:
                continue
            inst = _make(spec, tensors, _attrs(spec, **attrs), case.index)
            if inst:
                yield inst


#: the largest rank whose instances are also spelled with negative axes: every rank the instances have. A
#: rule that reads -1 or -2 as "no dim" (`(!= d axis)`) fails on a rank-2 case already, but a rule whose guard
#: pins the rank to 3 or more never meets one (issue 21's fifth adversary: ReduceMax over axes [-3] of a rank-3
#: tensor, split on dim 0, "proven" under `(vec-not-contains axes 0)`); a third more Slice, Concat and
#: LayerNormalization cases is the price
NEGATIVE_AXIS_RANK = 4


def _negative_spelling(spec: OpSpec, case: OpCase) -> dict[str, Any] | None:
    """``case``'s attributes with its axis (or every axis of its axes) spelled negative, as ONNX allows
    (-1 is the last dim), for tensors up to :data:`NEGATIVE_AXIS_RANK` (Slice: dims <= 4, steps 1, starts
    >= 0); None where the op has no axis or it is already negative or absent."""
    where = NEGATIVE_AXES.get(spec.name)
    if where is None:
        return None
    at, of = where
    attr, tensor = spec.args[at].name, spec.args[of].name
    shape = case.tensors.get(tensor)
    if isinstance(shape, list):
        shape = shape[0] if shape else None
    shape = getattr(shape, "shape", shape)
    value = case.attrs.get(attr)
    if shape is None or value is None or len(shape) > NEGATIVE_AXIS_RANK:
        return None
    if spec.name == "Slice" and (
        max(shape, default=0) > 4 or any(a != 1 for a in case.attrs.get("steps") or ()) or min(case.attrs["starts"]) < 0
    ):
        return None  # the axis, not the window, is what a negative spelling tests: steps 1, starts >= 0
    rank = len(shape)
    if isinstance(value, tuple | list):
        if not value or any(a < 0 for a in value):
            return None
        return {**case.attrs, attr: tuple(a - rank for a in value)}
    if value < 0:
        return None
    return {**case.attrs, attr: value - rank}


def _var_spec(shape: Any) -> Any:
    """A family's tensor argument as the verifier's pattern variable (None and lists kept as they are)."""
    if shape is None:
        return None
    if isinstance(shape, IndexShape):
        return VarSpec(tuple(shape.shape), integer=True, high=shape.high)
    if isinstance(shape, list):
        return [_var_spec(item) for item in shape]
    return VarSpec(tuple(shape))


@cache
def op_instances(op: str, cfg: GenConfig = GenConfig()) -> tuple[Instance, ...]:
    """Every instance of ``op`` the verifier tries (deduplicated, deterministic)."""
    spec = OPS[op]
    seen: dict[Any, Instance] = {}
    for inst in _instances_of(spec, cfg):
        seen.setdefault(_key(inst[0]), inst)
    out = list(seen.values())[:: cfg.stride]
    if cfg.wide:  # the size sweep takes the first cases of a stream: in an order that mixes every size
        random.Random(zlib.crc32(op.encode())).shuffle(out)  # the same order on every run and machine
    return tuple(out[: cfg.cap or None])


@cache
def instances_by_output(op: str, cfg: GenConfig) -> dict[Any, tuple[Instance, ...]]:
    """The instances of ``op`` grouped by output shape (a nested operator must produce its parent's input)."""
    groups: dict[Any, list[Instance]] = {}
    for inst in op_instances(op, cfg):
        groups.setdefault(inst[1], []).append(inst)
    return {out: tuple(items) for out, items in groups.items()}


def _key(args: Sequence[Any]) -> Any:
    return tuple(tuple(a) if isinstance(a, list) else a for a in args)
