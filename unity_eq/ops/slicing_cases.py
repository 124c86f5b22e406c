"""The slicing family's verifier instances (unity_eq.ops.slicing): Concat and Split up to ``max_rank``, Slice and
Gather up to ``other_rank`` (docs/verify.md's table). Separate from the family's semantics and costs to keep
each module small; what each generator covers and why is in its docstring."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from unity_eq.ops.cases import other_shapes, rank_dims, shape_pool
from unity_eq.ops.family import IndexShape, Instance, InstanceRanges, OpCase
from unity_eq.ops.spec import Family, OpSpec

__all__ = ["LARGE_DIMS", "instances"]


def _concat_cases(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """Lists of 1-3 tensors equal outside ``axis``; every size of every operand along it (three operands
    beyond rank 2: sizes 1-2, and at rank 4 other dims of 1-2, unless ``wide``)."""
    out: list[Instance] = []
    for shape in shape_pool(cfg, range(1, cfg.max_rank + 1)):
        for axis in range(len(shape)):
            if shape[axis] != cfg.dims[0]:
                continue  # the other dims range over every shape; the axis dim is each operand's own
            for count in (1, 2, 3):
                sizes_from = rank_dims(cfg, len(shape))
                if count == 3 and len(shape) > 2 and not cfg.wide:
                    # three operands beyond rank 2 (a permutation of three operands at rank 4 is no
                    # involution): sizes 1-2 along the axis, and at rank 4 the other dims 1-2 too
                    if cfg.sample or (len(shape) > 3 and any(n > 2 for n in shape)):
                        continue
                    sizes_from = cfg.dims[:2]
                for sizes in itertools.product(sizes_from, repeat=count):
                    items = [(*shape[:axis], n, *shape[axis + 1 :]) for n in sizes]
                    out.append(({"inputs": items}, {"axis": axis}))
    # every case fits (the operands agree outside the axis), so this strides the instances themselves
    return iter(out[:: 5 if cfg.sample else 1])


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(total,)] if total >= 1 else []
    return [(first, *rest) for first in range(1, total) for rest in _compositions(total - first, parts - 1)]


def _with_a_zero(total: int, parts: int) -> list[tuple[int, ...]]:
    """Splits of ``total`` into ``parts`` sizes, one of them 0 (ONNX allows an empty output)."""
    return [(*c[:z], 0, *c[z:]) for c in _compositions(total, parts - 1) for z in range(parts)]


def _split_cases(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """Every composition of the dim into 1-3 parts (1-4 at ranks 1-2) and, into 2 and 3 parts, with one empty part (its
    neighbours' output indices shift: a rule that counts outputs by position met none before), at every
    rank; every output, the empty one included (a rule that spells the empty part as a slice ``-0:`` gets
    the whole dim there). Ranks 1-2 alone do not suffice (issue 21): the certificate records a bounded rule's
    rank, so a rule guarded to rank 3 had no empty part in its domain. Beyond rank 2 the empty parts are cut
    from shapes whose other dims are 1 or 2 (every axis, every size along it): Split copies the other dims
    unchanged, so what an empty part changes (its position, its neighbours' sizes, the output's 0) is all
    along the axis, which ranks 1-2 show over every dim; the other dims 1 and 2 give each a size-1 and a
    larger value. Every other dim at every size costs twenty times the time of rules/algebra/split.egg."""
    for i, shape in enumerate(shape_pool(cfg, range(1, cfg.max_rank + 1))):
        for axis in range(len(shape)):
            options = [c for p in (1, 2, 3) for c in _compositions(shape[axis], p)]
            if len(shape) <= 2:  # four parts (of a dim of 4): a rule for "three parts or more" met only three
                options += _compositions(shape[axis], 4)
            if len(shape) <= 2 or all(n <= 2 for d, n in enumerate(shape) if d != axis):
                options += [c for p in (2, 3) for c in _with_a_zero(shape[axis], p)]
            for j, sizes in enumerate(dict.fromkeys(options)):
                if cfg.sample and len(options) > 3 and (i + j) % 2:
                    continue
                for index in range(len(sizes)):
                    if sizes[index] or len(sizes) == 2:
                        yield OpCase({"input": shape}, {"split": sizes, "axis": axis}, index)


def _axis_slices(n: int, every: bool) -> list[tuple[int, int, int]]:
    """(start, end, step) on a dim of size ``n``. ``every``: each start from ``-n`` to ``n-1`` and one below
    ``-n`` (clamped to 0, as a start of INT64_MIN is), each end from ``-n`` to ``n`` and past it (clamped, as
    exporters write INT64_MAX), steps 1-3, so a guard on the numbers (``(<= (vec-get st 0) 1)``) meets every
    slice it admits, negative spellings included; the empty ones (start at or after the end) with step 1
    (issue 21: a shape formula that goes negative when the start passes the end met no empty Slice; with
    step 1 an empty slice's count, 0, is the only one where end - start is not the count, so a formula
    that reads the difference as the count is wrong there; the larger steps' empty slices, three times as
    many, are left out for time). Otherwise the few a rule over two
    axes needs: from the start, from 1, from the last element or from below ``-n`` (the corner one-axis slices
    have, where ONNX clamps the start to 0: issue 21's adversary normalized it by adding n; ``-n`` itself is
    0 exactly), to the end, to 1, to the last or past the end, steps 1 and 2, non-empty."""
    steps: tuple[int, ...] = (1, 2, 3) if every else (1, 2)
    if every:
        starts, ends = [-n - 2, *range(-n, n)], [*range(-n, n + 1), n + 3]
    else:
        starts, ends = sorted({0, min(1, n - 1), -1, -n - 2}), sorted({1, -1, n, n + 3})
    out = [(s, e, st) for s in starts for e in ends for st in steps if len(range(n)[s:e:st]) > 0]
    if every:
        out += [(s, e, 1) for s in starts for e in ends if not range(n)[s:e]]
    return out


#: dims beyond ``dims``: each is a multiple of a step (or 1) that is at least step x mesh size but not a
#: multiple of it (6 = 2·3 >= 2·2, 9 >= 3·2, 8 >= 2·3, 12 >= 2·4 and 3·3), so that a guard ">= n * step"
#: differs from "n * step divides the dim" on some case (issue 21)
LARGE_DIMS = (5, 6, 8, 9, 12)


def _large_slices(n: int) -> list[tuple[int, int, int]]:
    """Slices of a large dim: from the start, 1, 2, the last or below ``-n``; to 1, the last, the end or past
    it; steps 1-4. With step 1, every start and end from 0 to the end and past it as well: a rule whose guard
    pins a literal end (`(= en (vec-of 6))`) met it only where 6 is an end of those (dims 5 and 6) and was
    "proven" to slice nothing off (issue 21's fifth adversary)."""
    starts = sorted({0, 1, 2, -1, -n - 2})
    ends = sorted({1, -1, n - 1, n, n + 3})
    strided = [(s, e, st) for s in starts for e in ends for st in (1, 2, 3, 4) if len(range(n)[s:e:st]) > 0]
    every = [(s, e, 1) for s in range(n + 1) for e in range(1, n + 2) if s < e and (s, e, 1) not in strided]
    return strided + every


def _slice_cases(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """Every one-axis slice of every shape (:func:`_axis_slices`, empty ones with step 1); two-axis slices of rank-2
    shapes from the smaller per-axis set; those along dims 0, 1, ... also with their axes left out (ONNX's
    default: a rule that reads "no axes" as "no axis" met none, issue 21's fourth adversary); slices of
    :data:`LARGE_DIMS` along the last axis of ``(n,)``,
    ``(2, n)`` and ``(3, n)`` (splits of the other dim while a strided slice runs along it)."""
    if not cfg.sample:
        for n in LARGE_DIMS:
            large: tuple[tuple[int, ...], ...] = ((n,), (2, n), (3, n), (n, 2))
            for big in large:
                axis = big.index(n)
                for start, end, step in _large_slices(n):
                    yield {"data": big}, {"starts": (start,), "ends": (end,), "axes": (axis,), "steps": (step,)}
    for shape in other_shapes(cfg):
        rank = len(shape)
        choices: list[tuple[tuple[int, ...], list[tuple[tuple[int, int, int], ...]]]] = [
            ((a,), [(sl,) for sl in _axis_slices(shape[a], every=True)]) for a in range(rank)
        ]
        if rank == 2:
            pairs = itertools.product(_axis_slices(shape[0], every=False), _axis_slices(shape[1], every=False))
            choices.append(((0, 1), list(pairs)))
        for axes, options in choices:
            for j, picked in enumerate(options):
                if cfg.sample and j % 7:
                    continue
                given = dict(
                    starts=tuple(sl[0] for sl in picked),
                    ends=tuple(sl[1] for sl in picked),
                    axes=axes,
                    steps=tuple(sl[2] for sl in picked),
                )
                yield {"data": shape}, given
                if axes == tuple(range(len(axes))):  # the same slice with its axes left out (ONNX: 0, 1, ...)
                    yield {"data": shape}, {**given, "axes": ()}


def _gather_cases(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    idx_shapes = [(), (1,), (2,), (3,), (2, 2), (1, 2), (4,), (1, 1, 2)]  # indices of rank 0-3
    for i, shape in enumerate(other_shapes(cfg)):
        for axis in range(len(shape)):
            picked = (idx_shapes[(i + axis) % len(idx_shapes)], idx_shapes[(i + axis + 3) % len(idx_shapes)])
            for idx in picked if cfg.sample else idx_shapes:
                yield {"data": shape, "indices": IndexShape(idx, shape[axis])}, {"axis": axis}


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Concat and Split up to ``max_rank``, Slice and Gather up to ``other_rank`` (docs/verify.md's table)."""
    by_family = {Family.CONCAT: _concat_cases, Family.SPLIT: _split_cases, Family.SLICE: _slice_cases}
    return by_family.get(spec.family, _gather_cases)(spec, ranges)
