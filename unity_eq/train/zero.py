"""ZeRO over a data-parallel group (Rajbhandari et al., 2020): the weight state sharded across the replicas,
with the collectives the stage search prices for it (CostModel.zero_*_traffic), and the same weights after every
step as plain data-parallel training (the gradients all-reduced, every replica stepping the whole model).

Stage-agnostic: every class takes the parameters (or a module), the data-parallel group as an
:class:`~unity_eq.collectives.torch_autograd.AxisGroup` (its ranks, the process group, the ledger that counts
collectives) and the level, so an SPMD plan's data axis and a pipeline stage's replicas use the same code. The
gradients it receives are each replica's own (not yet summed over the group): the caller does not all-reduce
them (an SPMD plan's weight ``replicate`` steps on the data axis are skipped, unity_eq.train.rank).

=====  ==================================================  =================================================
level  what a replica keeps                                collectives on the data axis (phase)
=====  ==================================================  =================================================
1      the whole weights and gradients, its shard of the   ``step``: reduce-scatter of the gradients, the
       optimizer state                                     update of its shard, all-gather of the weights
                                                           (both ``gradient``)
2      the whole weights, its shards of the gradients      after each backward: reduce-scatter of the
       and of the optimizer state                          gradients; ``step``: all-gather of the weights
3      its shard of everything; the whole weights only     per forward: all-gather of the weights
       while a forward or backward uses them               (``forward``) and again for the backward
                                                           (``backward``); reduce-scatter of the gradients
                                                           (``gradient``)
=====  ==================================================  =================================================

The parameters are packed into one flat buffer per dtype (padded to a multiple of the group size), so each
collective is one call per dtype, priced on the bytes of the weights (the padding, fewer than the group size in
elements, is not counted). torch's ZeroRedundancyOptimizer does not fit: it assigns whole parameters to ranks,
expects gradients all-reduced first and broadcasts the weights back (all-reduce plus broadcasts, not the
reduce-scatter and all-gather the plan prices); FSDP2 shards ``nn.Parameter``s of ordinary modules and
issues its own collectives outside the ledger, while a plan's rank reads its weights through the plan's steps.
On gloo (``ordered_sum``) the reduce-scatter sums in group order, as the plan's all-reduce does, so the summed
gradient has the same bits as plain data-parallel training's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from unity_eq.collectives.torch_autograd import BACKWARD, FORWARD, GRADIENT, AxisGroup
from unity_eq.errors import OptionError

__all__ = [
    "ZERO_LEVELS",
    "ShardedParams",
    "Zero3Module",
    "ZeroOptimizer",
    "check_level",
    "zero_collectives",
]

ZERO_LEVELS = (0, 1, 2, 3)
Key = tuple[str, str, str]


def check_level(level: int) -> int:
    if level not in ZERO_LEVELS:
        raise OptionError(f"ZeRO level: expected one of {', '.join(map(str, ZERO_LEVELS))}, got {level!r}.")
    return level


def zero_collectives(level: int, axis: str, bucket_bytes: Sequence[int], microbatches: int = 1) -> dict[Key, list[int]]:
    """What ZeRO ``level`` issues in one step on ``axis`` for weights of ``bucket_bytes`` (one entry per dtype):
    (kind, axis, phase) -> [count, bytes], as CostModel.zero_*_traffic prices it (level 1: one reduce-scatter and
    one all-gather per step; 2: a reduce-scatter per microbatch, an all-gather per step; 3: per microbatch an
    all-gather for the forward, one for the backward and a reduce-scatter)."""
    n, total = len(bucket_bytes), int(sum(bucket_bytes))
    if level == 0 or n == 0:
        return {}
    scatters = 1 if level == 1 else microbatches
    out = {("reduce_scatter", axis, GRADIENT): [n * scatters, total * scatters]}
    if level == 3:
        out[("all_gather", axis, FORWARD)] = [n * microbatches, total * microbatches]
        out[("all_gather", axis, BACKWARD)] = [n * microbatches, total * microbatches]
    else:
        out[("all_gather", axis, GRADIENT)] = [n, total]
    return out


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


class ZeroOptimizer:
    """ZeRO-1 or ZeRO-2 over ``params`` (every replica holds them whole): ``make`` builds the optimizer over this
    rank's shards; :meth:`step` gives every replica the weights plain data-parallel training would have.

    Use it as an optimizer: ``zero_grad()``, ``backward()``, ``step()``. ZeRO-2 reduce-scatters the gradients at
    the end of each backward (hooked on the parameters; a microbatch's gradients are then freed), ZeRO-1 in
    :meth:`step` (after the microbatches accumulated). :meth:`reduce_gradients` does it now (idempotent)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        group: AxisGroup,
        level: int,
        make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        if check_level(level) not in (1, 2):
            raise OptionError(f"ZeroOptimizer runs ZeRO-1 and ZeRO-2; ZeRO-{level} is Zero3Module's (or none).")
        self.level = level
        self.sharded = ShardedParams(params, group)
        self.optimizer = make(self.sharded.shards)
        self._queued = False
        if level == 2:
            for p in self.sharded.params:
                p.register_post_accumulate_grad_hook(self._after_gradient)

    @property
    def params(self) -> list[torch.Tensor]:
        return self.sharded.params

    def _after_gradient(self, _param: torch.Tensor) -> None:
        """ZeRO-2: the first gradient of a backward queues the reduce-scatter for when autograd finishes."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        self._queued = False
        self.reduce_gradients()

    def reduce_gradients(self) -> None:
        """Reduce-scatter the replica's own gradients into the shards' (nothing when none are pending) and free
        them."""
        grads = [p.grad for p in self.params]
        if all(g is None for g in grads):
            return
        self.sharded.scatter_gradients(grads, GRADIENT)
        for p in self.params:
            p.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shard with the summed gradient, then all-gather the weights into every replica."""
        self.reduce_gradients()
        self.optimizer.step()
        full = self.sharded.full(list(self.sharded.shards), GRADIENT)
        for p, value in zip(self.params, full, strict=True):
            p.copy_(value)

    def full_gradients(self) -> list[torch.Tensor]:
        """Every parameter's summed gradient, gathered from the shards (not counted: a diagnostic)."""
        self.reduce_gradients()
        return self.sharded.full([s.grad for s in self.sharded.shards], None)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()


@dataclass(frozen=True)
class _Saved:
    """A saved tensor that is a view of a gathered weight buffer: where in it (packed instead of the tensor)."""

    bucket: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class _Gather(torch.autograd.Function):
    """ZeRO-3's use of the weights: the shard all-gathered into the whole flat buffer; the backward
    reduce-scatters its gradient into the shard's."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, owner: Zero3Module, k: int) -> torch.Tensor:
        ctx.owner, ctx.k = owner, k
        phase = BACKWARD if owner.recomputing else FORWARD
        return all_gather(shard.detach(), owner.sharded.group, phase, owner.sharded.buckets[k].nbytes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        owner: Zero3Module = ctx.owner
        owner.regathered.pop(ctx.k, None)  # the backward is past every use of this bucket's weights
        bucket = owner.sharded.buckets[ctx.k]
        return reduce_scatter(grad, owner.sharded.group, GRADIENT, bucket.nbytes), None, None


class Zero3Module(torch.nn.Module):
    """ZeRO-3 over ``module``'s parameters: this rank keeps its shard of each (``parameters()`` are the shards,
    so any optimizer over them steps ZeRO-3); a forward all-gathers the whole weights, runs ``module`` on them
    (``torch.func.functional_call``) and drops them; the backward all-gathers them again where autograd needs
    a saved weight, and reduce-scatters their gradients into the shards'.

    ``recompute``: the forward runs under activation checkpointing (unity_eq.train.recompute) with the gather
    inside, so the recomputation gathers the weights again (the backward's all-gather) and nothing else does.
    ``module`` is not a submodule (its own parameters are freed; only the shards are this module's)."""

    def __init__(self, module: torch.nn.Module, group: AxisGroup, recompute: bool = False) -> None:
        super().__init__()
        named = list(module.named_parameters())
        params = [p for _, p in named]
        self.__dict__["inner"] = module  # not registered: its parameters are not ours to train
        self.names: list[str] = [name for name, _ in named]
        self.sharded = ShardedParams(params, group)
        self.shards = torch.nn.ParameterList(self.sharded.shards)
        self.sharded.shards = list(self.shards)
        self.recompute = recompute
        self.recomputing = False  # the recomputation's gather is the backward's
        self._first_run = True
        self.gathered: dict[int, torch.Tensor] = {}  # bucket -> whole buffer, during a forward
        self.regathered: dict[int, torch.Tensor] = {}  # bucket -> whole buffer, during a backward
        with torch.no_grad():
            for p in params:  # the whole weights live only while a forward or backward uses them
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def full_weights(self) -> list[torch.Tensor]:
        """Every parameter's whole value (in ``inner``'s order), gathered from the shards, not counted."""
        return self.sharded.full(list(self.shards), None)

    def full_gradients(self) -> list[torch.Tensor]:
        return self.sharded.full([s.grad for s in self.shards], None)

    def _run(self, *args: Any) -> Any:
        """Gather every bucket, run the module on the whole weights (the argument list ends with the shards)."""
        n = len(self.shards)
        shards, inner_args = args[-n:], args[:-n]
        values: dict[str, torch.Tensor] = {}
        for k, (bucket, shard) in enumerate(zip(self.sharded.buckets, shards, strict=True)):
            flat = _Gather.apply(shard, self, k)
            self.gathered[k] = flat
            for i, view in zip(bucket.indices, bucket.views(flat), strict=True):
                values[self.names[i]] = view
        try:
            inner: torch.nn.Module = self.__dict__["inner"]
            return torch.func.functional_call(inner, values, inner_args)
        finally:
            self.gathered.clear()

    def forward(self, *args: Any) -> Any:
        if self.recompute:
            from unity_eq.train.recompute import checkpointed

            def run(*a: Any) -> Any:
                first = self._first_run
                self._first_run = False
                self.recomputing = not first
                try:
                    return self._run(*a)
                finally:
                    self.recomputing = False

            self._first_run = True
            return checkpointed(run, *args, *self.shards, ledger=self.sharded.group.ledger)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self._run(*args, *self.shards)

    # --- saved weights: packed as a place in the gathered buffer, gathered again when the backward needs them --
    def _pack(self, t: torch.Tensor) -> Any:
        for k, flat in self.gathered.items():
            if t.device == flat.device and t.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr():
                return _Saved(k, tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))
        return t

    def _unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Saved):
            return saved
        if saved.bucket not in self.regathered:
            bucket = self.sharded.buckets[saved.bucket]
            shard = self.shards[saved.bucket]
            self.regathered[saved.bucket] = all_gather(shard.detach(), self.sharded.group, BACKWARD, bucket.nbytes)
        return self.regathered[saved.bucket].as_strided(saved.size, saved.stride, saved.offset)
