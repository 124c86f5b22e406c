"""SpaceToDepth: blocks of ``blocksize`` × ``blocksize`` pixels become channels (YOLO's reorg, pixel unshuffle).

The first family added as a plug-in (docs/architecture.md): this module and ``rules/parallel/space_to_depth.egg``
are all there is to it. The op only moves data, so it shards wherever the moves stay inside one device's piece:

* along the batch (dim 0), always;
* along the height or the width (dims 2, 3) when each device's rows (columns) are whole blocks: the local size
  ``H / n`` is a multiple of ``blocksize`` (output rows ``[r·H/(n·b), (r+1)·H/(n·b))`` come from input rows
  ``[r·H/n, (r+1)·H/n)``);
* never along the channels: output channel ``(i·b + j)·C + c`` interleaves every input channel.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.family import Instance, InstanceRanges, OpFamily, Saved, ShapeError
from unity_eq.ops.spec import Family, OpSpec, int_attr, tensor

__all__ = ["SPACE_TO_DEPTH"]

SPECS = (OpSpec("SpaceToDepth", Family.PLUGIN, (tensor("input"), int_attr("blocksize"))),)


def infer_shape(op: str, args: Sequence[Any]) -> tuple[int, ...]:
    """``[N, C, H, W]`` → ``[N, C·b·b, H/b, W/b]``; H and W must be multiples of b (ONNX's rule)."""
    shape, block = args[0], args[1]
    if shape is None or len(shape) != 4:
        raise ShapeError(f"{op} takes a rank-4 input, got {shape}")
    n, c, h, w = shape
    if block < 1 or h % block or w % block:
        raise ShapeError(f"{op}: height {h} and width {w} must be multiples of blocksize {block}")
    return (n, c * block * block, h // block, w // block)


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """ONNX's reference: reshape to blocks, move the block offsets in front of the channels, reshape back.
    Pure data movement, so the same code serves the numpy and the Z3 backend (arrays of their scalars)."""
    x, block = np.asarray(args[0]), int(args[1])
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // block, block, w // block, block).transpose(0, 3, 5, 1, 2, 4)
    return blocks.reshape(n, c * block * block, h // block, w // block)


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Every rank-4 input whose dims are in ``ranges.dims``, with every blocksize from 1 to the largest dim
    that divides its height and width."""
    for shape in itertools.product(ranges.dims, repeat=4):
        for block in range(1, max(ranges.dims) + 1):
            if shape[2] % block == 0 and shape[3] % block == 0:
                yield {"input": shape}, {"blocksize": block}
    if ranges.sample:
        return
    for big, block in LARGE:
        for n in (1, 2):
            yield {"input": (n, 1, big, block)}, {"blocksize": block}
            yield {"input": (n, 1, block, big)}, {"blocksize": block}


#: (a height or width H, a blocksize b dividing it). A split of H over a mesh axis of n is sound when each
#: piece's H / n rows are a multiple of b; with dims 1-4 every such H with H >= n * b was a multiple of n * b,
#: so a split guarded by ">= n * b" passed and onnxruntime rejected the plan at H = 6 (issue 21). The H that
#: tell the two guards apart are the multiples of n and b, at least n * b, whose H / n is no multiple of b:
#: for mesh sizes n of 2-4 and blocksizes 1-4 the smallest are 6 (n = 2, b = 2 or 3), 12 (n = 4, b = 2;
#: n = 3, b = 3; n = 2, b = 4) and 20 (n = 4, b = 4); the other pairs have none (b = 1; n = 3, b = 2 or 4;
#: n = 4, b = 3: there H / n is always a multiple of b), so these dims are every case the guards differ on
#: up to the smallest.
LARGE = ((6, 2), (12, 2), (6, 3), (12, 3), (12, 4), (20, 4))


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """None: a copy, priced by the bytes it moves (the roofline's memory term)."""
    return 0.0


def saved(op: str) -> Saved:
    """A permutation of its input's elements (PyTorch's ``pixel_unshuffle`` copies): its backward keeps
    nothing."""
    return Saved()


def torch_semantics(op: str, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """ONNX SpaceToDepth in PyTorch: each block's pixels become channels, block offset outermost."""
    x, bs = inputs[0], int(attrs["blocksize"])
    b, c, h, w = x.shape
    y = x.reshape(b, c, h // bs, bs, w // bs, bs).permute(0, 3, 5, 1, 2, 4)
    return [y.reshape(b, c * bs * bs, h // bs, w // bs)]


SPACE_TO_DEPTH = OpFamily(
    name="space-to-depth",
    specs=SPECS,
    rule_file="parallel/space_to_depth.egg",
    ranges=(
        "every rank-4 input with dims 1-4 and every blocksize 1-4 that divides its height and width; heights and"
        " widths 6, 12 and 20 (blocksizes 2-4) where a split's pieces are not multiples of the blocksize"
    ),
    torch=torch_semantics,
    **OpFamily.hooks_in(globals()),
)
