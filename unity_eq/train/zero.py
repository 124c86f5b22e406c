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

from unity_eq.collectives.torch_autograd import BACKWARD, FORWARD, GRADIENT, AxisGroup
from unity_eq.errors import OptionError
from unity_eq.train.zero_buffers import ShardedParams, all_gather, reduce_scatter

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


class ZeroOptimizer:
    """ZeRO-1 or ZeRO-2 over ``params`` (every replica holds them whole): ``make`` builds the optimizer over this
    rank's shards and the ``plain`` parameters (those the plan does not sum over the group: stepped whole on
    every rank, unity_eq.train.zero_plan); :meth:`step` gives every replica the weights plain data-parallel
    training would have.

    Use it as an optimizer: ``zero_grad()``, ``backward()``, ``step()``. ZeRO-2 reduce-scatters the gradients at
    the end of each backward (hooked on the parameters; a microbatch's gradients are then freed), ZeRO-1 in
    :meth:`step` (after the microbatches accumulated). :meth:`reduce_gradients` does it now (idempotent)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        group: AxisGroup,
        level: int,
        make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        plain: Iterable[torch.nn.Parameter] = (),
    ) -> None:
        if check_level(level) not in (1, 2):
            raise OptionError(f"ZeroOptimizer runs ZeRO-1 and ZeRO-2; ZeRO-{level} is Zero3Module's (or none).")
        self.level = level
        self.sharded = ShardedParams(params, group)
        self.plain = list(plain)
        self.optimizer = make([*self.sharded.shards, *self.plain])
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

    def __init__(
        self,
        module: torch.nn.Module,
        group: AxisGroup,
        recompute: bool = False,
        keep: Iterable[torch.nn.Parameter] = (),
    ) -> None:
        """``keep``: parameters of ``module`` left whole on every rank (the plan does not sum them over the
        group, unity_eq.train.zero_plan): ours to train as they are, never gathered."""
        super().__init__()
        kept = {id(p) for p in keep}
        named = [(name, p) for name, p in module.named_parameters() if id(p) not in kept]
        params = [p for _, p in named]
        self.__dict__["inner"] = module  # not registered: its parameters are not ours to train
        self.names: list[str] = [name for name, _ in named]
        self.order = [name for name, _ in module.named_parameters()]  # inner's order, kept ones included
        pairs = [(n, p) for n, p in module.named_parameters() if id(p) in kept]
        self.kept_names = [n for n, _ in pairs]
        self.kept = torch.nn.ParameterList([p for _, p in pairs])
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
        return self._in_order(self.sharded.full(list(self.shards), None), [p.detach() for p in self.kept])

    def full_gradients(self) -> list[torch.Tensor | None]:
        gathered = self.sharded.full([s.grad for s in self.shards], None)
        return self._in_order(gathered, [p.grad for p in self.kept])

    def set_full(self, values: Sequence[torch.Tensor]) -> None:
        """Set every parameter (in ``inner``'s order) from its whole value: the shards and the kept ones."""
        by_name = dict(zip(self.order, values, strict=True))
        self.sharded.set_full([by_name[n] for n in self.names])
        with torch.no_grad():
            for name, param in zip(self.kept_names, self.kept, strict=True):
                param.copy_(by_name[name])

    def _in_order(self, gathered: Sequence[Any], kept: Sequence[Any]) -> list[Any]:
        by_name = dict(zip(self.names, gathered, strict=True))
        by_name.update(zip(self.kept_names, kept, strict=True))
        return [by_name[n] for n in self.order]

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
