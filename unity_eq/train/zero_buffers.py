"""ZeRO's flat buffers (unity_eq.train.zero): the parameters of one dtype packed into one buffer, padded to a
multiple of the group size, each rank's shard a contiguous range of it; and the two collectives on them, a
reduce-scatter and an all-gather, counted in the group's ledger. Separate from the ZeRO levels that use them
(the optimizer, the ZeRO-3 module) to keep each module small."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from unity_eq.collectives.torch_autograd import AxisGroup
from unity_eq.errors import OptionError

__all__ = ["ShardedParams", "all_gather", "reduce_scatter"]


# --- the two collectives, on flat buffers --------------------------------------------------------------------
def reduce_scatter(flat: torch.Tensor, g: AxisGroup, phase: str, nbytes: int) -> torch.Tensor:
    """This rank's chunk of the group's sum of ``flat`` (length a multiple of the group size). Gloo has no
    reduce-scatter and the plan's reductions sum in group order (equal bits on every rank): there it gathers the
    pieces and sums them in group order, as ``AxisGroup``'s all-reduce does, keeping this rank's chunk."""
    size = flat.numel() // g.size
    if g.size == 1:
        return flat.clone()
    g.ledger.record("reduce_scatter", g.axis, phase, nbytes)
    if not g.ordered_sum:
        out = torch.empty(size, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_tensor(out, flat.contiguous(), group=g.group)
        return out
    pieces = [torch.empty_like(flat) for _ in range(g.size)]
    dist.all_gather(pieces, flat.contiguous(), group=g.group)
    start = g.index * size
    total = pieces[0][start : start + size].clone()
    for piece in pieces[1:]:
        total += piece[start : start + size]
    return total


def all_gather(shard: torch.Tensor, g: AxisGroup, phase: str | None, nbytes: int) -> torch.Tensor:
    """Every rank's ``shard``, concatenated in group order; ``phase`` None: not counted (a diagnostic: the
    gradients gathered back for ``check --training``, a checkpoint)."""
    if g.size == 1:
        return shard.clone()
    if phase is not None:
        g.ledger.record("all_gather", g.axis, phase, nbytes)
    pieces = [torch.empty_like(shard) for _ in range(g.size)]
    dist.all_gather(pieces, shard.contiguous(), group=g.group)
    return torch.cat(pieces)


@dataclass
class _Bucket:
    """The parameters of one dtype packed into a flat buffer: each one's index in the caller's list, offset and
    shape; the buffer is ``padded`` long (a multiple of the group size), this rank's shard ``padded / size``."""

    indices: list[int]
    offsets: list[int]
    shapes: list[torch.Size]
    numel: int
    padded: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def flatten(self, tensors: Sequence[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor:
        """The tensors (None: zeros) of this bucket packed into one padded flat buffer."""
        flat = torch.zeros(self.padded, dtype=self.dtype, device=like.device)
        for i, offset, shape in zip(self.indices, self.offsets, self.shapes, strict=True):
            value = tensors[i]
            if value is not None:
                flat[offset : offset + shape.numel()] = value.detach().reshape(-1)
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's tensor as a view of ``flat`` (autograd follows the views back to it)."""
        return [flat[o : o + s.numel()].view(s) for o, s in zip(self.offsets, self.shapes, strict=True)]


class ShardedParams:
    """Parameters packed into flat buffers per dtype, and this rank's shard of each as a trainable Parameter."""

    def __init__(self, params: Iterable[torch.Tensor], group: AxisGroup) -> None:
        self.params = list(params)
        self.group = group
        if not self.params:
            raise OptionError("ZeRO: no parameters to shard.")
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(self.params):
            by_dtype.setdefault(p.dtype, []).append(i)
        self.buckets: list[_Bucket] = []
        for dtype, indices in by_dtype.items():
            offsets, shapes, n = [], [], 0
            for i in indices:
                offsets.append(n)
                shapes.append(self.params[i].shape)
                n += self.params[i].numel()
            padded = -(-n // group.size) * group.size
            self.buckets.append(_Bucket(indices, offsets, shapes, n, padded, dtype))
        self.shards = [
            torch.nn.Parameter(self._my_chunk(b.flatten(self.params, self.params[b.indices[0]]), b).clone())
            for b in self.buckets
        ]

    def _my_chunk(self, flat: torch.Tensor, bucket: _Bucket) -> torch.Tensor:
        size = bucket.padded // self.group.size
        return flat[self.group.index * size : (self.group.index + 1) * size]

    def bucket_bytes(self) -> list[int]:
        return [b.nbytes for b in self.buckets]

    def full(self, tensors: Sequence[torch.Tensor | None], phase: str | None) -> list[torch.Tensor]:
        """Per parameter, its whole tensor assembled from every rank's shard of ``tensors`` (one per bucket)."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(self.params)
        for bucket, shard, value in zip(self.buckets, self.shards, tensors, strict=True):
            piece = value if value is not None else torch.zeros_like(shard)
            flat = all_gather(piece.detach(), self.group, phase, bucket.nbytes)
            for i, view in zip(bucket.indices, bucket.views(flat), strict=True):
                out[i] = view
        return out

    def set_full(self, values: Sequence[torch.Tensor]) -> None:
        """Set the shards from whole values of every parameter (a checkpoint loaded)."""
        with torch.no_grad():
            for bucket, shard in zip(self.buckets, self.shards, strict=True):
                shard.copy_(self._my_chunk(bucket.flatten(values, shard), bucket))

    def scatter_gradients(self, grads: Sequence[torch.Tensor | None], phase: str) -> None:
        """Reduce-scatter each bucket of ``grads`` (this replica's own) and add this rank's chunk of the sum to
        its shard's gradient."""
        for bucket, shard in zip(self.buckets, self.shards, strict=True):
            mine = reduce_scatter(bucket.flatten(grads, shard), self.group, phase, bucket.nbytes)
            shard.grad = mine if shard.grad is None else shard.grad + mine
