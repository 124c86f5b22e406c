"""Data cut and joined along an axis: Concat, Split, Slice and Gather.

They compute nothing and shard along any dim they do not cut or join: a split of another dim of the operands
is a split of the result (Gather also along its indices' dims, which take the place of ``axis``). Their rules
are in ``rules/parallel/layout.egg`` with the other data-movement ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from unity_eq.ops.family import (
    NodeView,
    NotModeled,
    OpFamily,
    Saved,
    ShapeError,
    Work,
)
from unity_eq.ops.slicing_axioms import axioms
from unity_eq.ops.slicing_cases import instances
from unity_eq.ops.spec import Arg, Family, OpSpec, int_attr, static, tensor
from unity_eq.ops.tensors import Shape, check_axis, need, norm_axis

__all__ = ["SLICING"]

SPECS = (
    OpSpec("Concat", Family.CONCAT, (Arg("inputs", "TList", "input"), int_attr("axis")), foldable=True),
    OpSpec(
        "Split",
        Family.SPLIT,
        (tensor("input"), static("split", True), int_attr("axis", 0)),
        multi_output=True,
        output_sizes="split",
        foldable=True,
    ),
    OpSpec(
        "Slice",
        Family.SLICE,
        (tensor("data"), static("starts"), static("ends"), static("axes", True), static("steps", True)),
    ),
    OpSpec("Gather", Family.GATHER, (tensor("data"), tensor("indices"), int_attr("axis", 0))),
)


def _slice_params(
    shape: Shape, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int], steps: Sequence[int]
) -> list[slice]:
    axes = list(axes) if axes else list(range(len(starts)))
    steps = list(steps) if steps else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("Slice: starts, ends, axes and steps differ in length")
    out = [slice(None)] * len(shape)
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = check_axis(a, len(shape), "Slice axis")
        if a in seen or st <= 0:
            raise ShapeError("Slice: repeated axis or non-positive step")
        seen.add(a)
        out[a] = slice(s, e, st)
    return out


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """Concat adds the operands' sizes along ``axis`` (they agree elsewhere); Split's output ``index`` has its
    part's size; Slice as Python slices (positive steps); Gather puts the indices' shape in place of ``axis``."""
    if op == "Concat":
        shapes, axis = args[0], args[1]
        if not shapes:
            raise ShapeError("Concat of an empty list")
        first = need(shapes[0])
        check_axis(axis, len(first))
        for s in shapes[1:]:
            if len(s) != len(first) or any(s[i] != first[i] for i in range(len(first)) if i != axis):
                raise ShapeError("Concat inputs differ outside the axis")
        return (*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1 :])
    if op == "Split":
        x, sizes, axis, index = need(args[0]), tuple(args[1]), args[2], args[3]
        check_axis(axis, len(x))
        if not sizes or sum(sizes) != x[axis] or any(s < 0 for s in sizes) or not 0 <= index < len(sizes):
            raise ShapeError(f"Split sizes {list(sizes)} of dim {x[axis]}")
        return (*x[:axis], sizes[index], *x[axis + 1 :])
    if op == "Slice":
        x = need(args[0])
        slices = _slice_params(x, *args[1:5])
        return tuple(len(range(*sl.indices(n))) for sl, n in zip(slices, x, strict=True))
    if op == "Gather":
        data, idx, axis = need(args[0]), need(args[1]), args[2]
        check_axis(axis, len(data))
        return (*data[:axis], *idx, *data[axis + 1 :])
    raise ShapeError(f"no semantics for {op}")


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """numpy's concatenate and indexing; a symbolic Gather picks each element with if-then-else terms over
    its (free, in-range) index."""
    if op == "Concat":
        return np.concatenate(args[0], axis=args[1])
    if op == "Split":
        x, sizes, axis, index = args
        start = sum(sizes[:index])
        sl = [slice(None)] * x.ndim
        sl[axis] = slice(start, start + sizes[index])
        return x[tuple(sl)]
    if op == "Slice":
        x = args[0]
        return x[tuple(_slice_params(x.shape, *args[1:5]))]
    if op == "Gather":
        return _gather(args, bk)
    raise NotImplementedError(f"{op}: no semantics in unity_eq/ops/slicing.py; add them with its spec")


def _gather(args: Sequence[Any], bk: Any) -> Any:
    data, idx, axis = args
    if not getattr(bk, "symbolic", False):
        ints = np.asarray(idx, dtype=np.int64)
        if ints.size and (ints.min() < -data.shape[axis] or ints.max() >= data.shape[axis]):
            raise ShapeError(f"Gather index out of range for a dim of size {data.shape[axis]}")
        return np.take(data, ints, axis=axis)
    import z3  # only the verifier's symbolic backend gets here; the engine never does

    size = data.shape[axis]
    moved = np.moveaxis(data, axis, 0)
    rest = moved.shape[1:]
    out = np.empty((*idx.shape, *rest), dtype=object)
    for p in np.ndindex(*idx.shape):
        i = idx[p]
        for r in np.ndindex(*rest):
            # an index out of range is an error in onnxruntime, not the last row: its value is a fresh symbol,
            # and a right-hand side that may read out of range where the left-hand side does not is refuted
            # (issue 21's fifth adversary: a Gather moved through an Expand of one row "proven", its index
            # clamped). The symbol is named by the index and the column it reads (z3's ids of hash-consed
            # terms), so the same Gather on both sides agrees and two Gathers of different data never do
            column = ",".join(_term_id(moved[(k, *r)]) for k in range(size))
            expr = z3.If(
                z3.Or(i == size - 1, i == -1),
                moved[(size - 1, *r)],
                bk.symbol(f"gather-out-of-range[{_term_id(i)}|{column}]"),
            )
            for k in range(size - 2, -1, -1):
                expr = z3.If(z3.Or(i == k, i == k - size), moved[(k, *r)], expr)
            out[(*p, *r)] = expr
    # out is idx + data[:axis] + data[axis+1:]; move data[:axis] in front
    ri = idx.ndim
    order = list(range(ri, ri + axis)) + list(range(ri)) + list(range(ri + axis, out.ndim))
    return np.transpose(out, order)


def _term_id(value: Any) -> str:
    """A z3 term's id (one per distinct term: z3 hash-conses them) or a constant's repr, for naming a symbol."""
    get_id = getattr(value, "get_id", None)
    return f"#{get_id()}" if get_id is not None else repr(value)


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Concat, Split and Slice move data (none); Gather one operation per output element."""
    if op == "Gather":
        return float(math.prod(out_shape))
    return 0.0


def normalize(op: str, v: dict[str, Any], node: NodeView) -> dict[str, Any]:
    """Axes non-negative; Slice's starts and ends clamped as ONNX clamps them, defaults written out; Split's
    sizes read off its outputs (whether given, implied by ``num_outputs`` or by the number of outputs)."""
    if op == "Concat":
        v["axis"] = norm_axis(v["axis"], node.rank(v["inputs"][0]))
    elif op == "Slice":
        v.update(_normalize_slice(node.shape(v["data"]), v))
    elif op in ("Split", "Gather"):
        v["axis"] = norm_axis(v["axis"], node.rank(v["input" if op == "Split" else "data"]))
    if op == "Split":
        if any(shape is None for shape in node.outputs):
            raise NotModeled
        v["split"] = tuple(shape[v["axis"]] for shape in node.outputs if shape is not None)
    return v


def _normalize_slice(shape: tuple[int, ...], v: dict[str, Any]) -> dict[str, Any]:
    starts, ends = list(v["starts"]), list(v["ends"])
    axes = list(v["axes"]) if v["axes"] else list(range(len(starts)))
    steps = list(v["steps"]) if v["steps"] else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(s <= 0 for s in steps):
        raise NotModeled
    axes = [norm_axis(a, len(shape)) for a in axes]
    if len(set(axes)) != len(axes):  # onnxruntime refuses a repeated axis: the node is carried as it is
        raise NotModeled
    norm_starts, norm_ends = [], []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        begin, stop, _ = slice(start, end, step).indices(shape[axis])
        norm_starts.append(begin)
        norm_ends.append(max(stop, begin))
    return {
        "starts": tuple(norm_starts),
        "ends": tuple(norm_ends),
        "axes": tuple(axes),
        "steps": tuple(steps),
    }


def saved(op: str) -> Saved:
    """Slice and Split return views of their input, whose backward only places the gradient; Concat copies,
    and its backward splits the gradient; Gather keeps its indices (the embedding's token ids)."""
    if op == "Gather":
        return Saved(inputs=("indices",))
    if op in ("Slice", "Split"):
        return Saved(view="data" if op == "Slice" else "input")
    return Saved()


def forward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work | None:
    """Gather reads the rows it gathers (the output's size) and the indices, not the whole table: an embedding
    lookup of a few thousand tokens in a 50k-row table touches a few thousand rows. The others read their
    inputs and write their output (the default; a Split output its share of the input)."""
    if op != "Gather":
        return None
    n = math.prod(out_shape)
    indices = math.prod(in_shapes[1]) if len(in_shapes) > 1 and in_shapes[1] is not None else 0
    return Work(float(n), float(n + indices), float(n))


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work:
    """As PyTorch's autograd runs them: Concat's input gradients are slices of the output's gradient (views:
    free); a Split output's gradient is copied into the input's (``cat`` of the outputs' gradients: read and
    write this output's size); Slice's zero-fills the input's shape and copies the gradient into the slice;
    Gather's scatters into the table: zero-fill the table's gradient, then add each gathered row's gradient
    into it (reads the gradient and the indices, reads and writes the rows)."""
    n = math.prod(out_shape)
    if op == "Concat":
        return Work(kernels=0.0)
    if op == "Split":
        return Work(0.0, float(n), float(n))
    table = math.prod(in_shapes[0]) if in_shapes and in_shapes[0] is not None else n
    if op == "Slice":
        return Work(0.0, float(n), float(table + n), kernels=2.0)
    indices = math.prod(in_shapes[1]) if len(in_shapes) > 1 and in_shapes[1] is not None else 0
    return Work(float(n), float(2 * n + indices), float(table + n), kernels=2.0)


SLICING = OpFamily(
    name="slicing",
    specs=SPECS,
    rule_file="parallel/layout.egg",
    ranges=(
        "Concat: rank 1-4, every axis, 1-3 operands (three beyond rank 2: sizes 1-2), every size of every operand"
        " along the axis; Split: rank 1-4, every axis, every composition of the dim into 1-3 parts (and 4 at "
        "ranks 1-2), also with one empty part (ranks 3-4: other dims 1-2), every output of a 2-part split, every "
        "non-empty one of a 3-part split; Slice: rank 1-3, every axis, every (start, end, step) that selects at "
        "least one element (starts -n-2 and -n … n-1, ends -n … n and past the end, steps 1-3) and every empty "
        "one with step 1, two-axis slices of rank-2 tensors (starts 0, 1, -1 and -n-2), those along dims 0 (and "
        "1) also with their axes left out, dims 5-12 sliced with steps 1-4 (with step 1 from every start to every "
        "end); Gather: data rank 1-3, every axis, indices of shape (), (1), (2), (3), (4), (1, 2), (2, 2) and "
        "(1, 1, 2) with values in range (an out-of-range read in a proof is a fresh value)"
    ),
    implied_attrs={"Split": frozenset({"num_outputs"})},
    compute_class="layout",
    compute_classes={"Gather": "memory"},
    axioms=axioms,
    instances=instances,
    **OpFamily.hooks_in(globals()),
)
