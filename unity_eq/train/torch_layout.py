"""ONNX's reshape, layout, slicing and indexing ops as PyTorch ops (the families of ``unity_eq/ops/reshape.py`` and
``unity_eq/ops/slicing.py``): the part of :data:`unity_eq.train.torch_ops.TORCH_OPS` that moves elements without
computing on them. Each is a view or a copy through autograd's own kernels, so its backward is autograd's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["LAYOUT_OPS", "MULTI_OUTPUT_OPS", "OpFn", "Tensor", "ints", "op_axes"]

Tensor = torch.Tensor
OpFn = Callable[[list[Any], Mapping[str, Any]], list[Tensor]]


def ints(value: Tensor | Sequence[int] | None) -> list[int]:
    """An ONNX int list as an attribute or a tensor input gives it (None: none)."""
    if value is None:
        return []
    if isinstance(value, Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]


# --- reshape and layout (unity_eq/ops/reshape.py) ---------------------------------------------------------------
def _reshape(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, shape = inputs[0], ints(inputs[1])
    allow_zero = int(attrs.get("allowzero", 0))
    target = [x.shape[i] if (d == 0 and not allow_zero) else d for i, d in enumerate(shape)]
    return [x.reshape(target)]


def _transpose(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x = inputs[0]
    perm = attrs.get("perm") or list(reversed(range(x.dim())))
    return [x.permute(*[int(p) for p in perm])]


def op_axes(inputs: list[Any], attrs: Mapping[str, Any], position: int = 1) -> list[int] | None:
    """The ``axes`` of an op that takes them as an input (opset 13+) or an attribute (before); None: absent."""
    if len(inputs) > position and inputs[position] is not None:
        return ints(inputs[position])
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    return None


def _unsqueeze(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x = inputs[0]
    axes = op_axes(inputs, attrs) or []
    rank = x.dim() + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = x.unsqueeze(axis)
    return [x]


def _squeeze(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x = inputs[0]
    axes = op_axes(inputs, attrs)
    if axes is None:
        return [x.squeeze()]
    for axis in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(axis)
    return [x]


def _flatten(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x = inputs[0]
    axis = int(attrs.get("axis", 1)) % (x.dim() + 1) if x.dim() else 0
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


def _expand(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, shape = inputs[0], ints(inputs[1])
    rank = max(x.dim(), len(shape))
    padded = [1] * (rank - len(shape)) + shape
    current = [1] * (rank - x.dim()) + list(x.shape)
    target = [c if s == 1 else s for s, c in zip(padded, current, strict=True)]
    return [x.reshape(current).expand(target)]


def _concat(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [torch.cat([i for i in inputs if i is not None], dim=int(attrs.get("axis", 0)))]


def _split(inputs: list[Any], attrs: Mapping[str, Any], outputs: int) -> list[Tensor]:
    x = inputs[0]
    axis = int(attrs.get("axis", 0)) % x.dim()
    sizes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attrs.get("split") or [])
    if not sizes:
        count = int(attrs.get("num_outputs", outputs))
        step = -(-x.shape[axis] // count)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(count)]
    return list(torch.split(x, sizes, dim=axis))


# --- slicing and indexing (unity_eq/ops/slicing.py) ----------------------------------------------------------
def _slice(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x = inputs[0]
    starts, ends = ints(inputs[1]), ints(inputs[2])
    axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index: list[Any] = [slice(None)] * x.dim()
    flips = []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis %= x.dim()
        size = x.shape[axis]
        if step > 0:
            lo = max(0, min(size, start + size if start < 0 else start))
            hi = max(0, min(size, end + size if end < 0 else end))
            index[axis] = slice(lo, max(lo, hi), step)
        else:  # a negative step: slice the flipped tensor
            lo = max(-1, min(size - 1, start + size if start < 0 else start))
            hi = max(-1, min(size - 1, end + size if end < 0 else end))
            index[axis] = slice(size - 1 - lo, size - 1 - hi if hi < lo else size - 1 - lo, -step)
            flips.append(axis)
    if flips:
        x = torch.flip(x, flips)
    return [x[tuple(index)]]


def _gather(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, indices = inputs[0], inputs[1].to(torch.int64)
    axis = int(attrs.get("axis", 0)) % x.dim()
    indices = torch.where(indices < 0, indices + x.shape[axis], indices)
    flat = torch.index_select(x, axis, indices.reshape(-1))
    shape = [*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]]
    return [flat.reshape(shape)]


def _gather_elements(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, indices = inputs[0], inputs[1].to(torch.int64)
    axis = int(attrs.get("axis", 0)) % x.dim()
    return [torch.gather(x, axis, torch.where(indices < 0, indices + x.shape[axis], indices))]


def _gather_nd(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    data, indices = inputs[0], inputs[1].to(torch.int64)
    b = int(attrs.get("batch_dims", 0))
    k = indices.shape[-1]
    batch = math.prod(data.shape[:b])
    flat = data.reshape(batch, *data.shape[b:])
    idx = indices.reshape(batch, -1, k)
    sizes = torch.tensor(data.shape[b : b + k], dtype=torch.int64)
    idx = torch.where(idx < 0, idx + sizes, idx)
    rows = torch.arange(batch).view(batch, 1).expand(batch, idx.shape[1])
    picked = flat[(rows, *(idx[..., j] for j in range(k)))]
    return [picked.reshape(*indices.shape[:-1], *data.shape[b + k :])]


LAYOUT_OPS: dict[str, OpFn] = {
    # reshape and layout (unity_eq/ops/reshape.py)
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Flatten": _flatten,
    "Expand": _expand,
    "Concat": _concat,
    # slicing and indexing (unity_eq/ops/slicing.py)
    "Slice": _slice,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
}

#: ops whose number of outputs is the node's (Split)
MULTI_OUTPUT_OPS: dict[str, Callable[[list[Any], Mapping[str, Any], int], list[Tensor]]] = {"Split": _split}
