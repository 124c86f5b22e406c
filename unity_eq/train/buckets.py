"""Weight gradients all-reduced in buckets, as the cost model prices them: data-parallel frameworks (PyTorch DDP)
all-reduce the gradients of many weights as one flat buffer of up to ``CostModel.gradient_bucket_bytes`` (25
MiB), so each weight's all-reduce pays its bytes and only its share of a collective's latency
(``CostModel.gradient_all_reduce``). The torch backend issues one all-reduce per bucket for an SPMD plan's
weight-gradient all-reduces (during the backward, :class:`BucketedSync`), and for a pipeline stage's deferred
weight-gradient all-reduces over its tensor axes and its sum over its replicas (ZeRO-0), once per step after
the last microbatch (:func:`all_reduce_in_buckets`).

**Buckets** (:func:`pack`): per mesh axis, the gradients in the order of the rank's parameters (the weights'
names sorted, as ``RankModule`` makes them), one dtype per bucket, a weight added to the open bucket of its
dtype while the bucket stays within the bucket size, else a new one opened (a weight larger than a bucket is a
bucket of its own). plan.json records no buckets: it prices each weight's all-reduce (a ``replicate`` step's
``communication_s``, a stage's ``sync_s``) with its latency share, so ``check --training`` packs the weights
plan.json prices into buckets the same way (:func:`bucket_collectives`) and compares counts and bytes per
axis.

**During a backward** (:class:`BucketedSync`; an SPMD plan's rank, ``RankModule(bucket_weight_sync=True)``):
the same buckets, issued by hooks on the parameters while autograd runs, so a user's own ``loss.backward()``
loop syncs them with nothing more to call. A parameter's gradient is ready once autograd has accumulated it
(its ``AccumulateGrad`` node runs once per backward, after every use's gradient is summed: a weight read several
times is all-reduced once); a bucket goes out once its weights are ready and every bucket before it has gone
(the same order on every rank, which gloo and NCCL need). The buckets left when the backward ends (a weight it
did not reach) go out then, such a weight contributing zeros, so every rank issues the same all-reduces; it gets
the summed gradient (zeros where no rank reached it, where autograd alone would leave ``None``). Gradients
accumulated over several backwards (microbatches) stay right: each backward's own gradient is summed, then
added to the one accumulated before it, which was kept aside.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch

from unity_eq.collectives import torch_autograd as coll
from unity_eq.cost.model import GRADIENT_BUCKET_BYTES
from unity_eq.planfile import ExplainRecord, PartitionStepRecord, ReplicateStepRecord, WeightStepRecord

__all__ = [
    "BucketedSync",
    "all_reduce_bucket",
    "all_reduce_in_buckets",
    "axis_buckets",
    "bucket_collectives",
    "bucket_size",
    "deferred_collectives",
    "gradient_entry",
    "pack",
]


def bucket_size() -> int:
    """The bytes of a gradient bucket: the cost model's (``CostModel.gradient_bucket_bytes``'s default; 0 or
    less: every gradient a bucket of its own, as the cost model then prices them)."""
    return int(GRADIENT_BUCKET_BYTES)


def pack(entries: Sequence[tuple[str, int]], size: int | None = None) -> list[list[int]]:
    """Buckets of ``entries`` ((dtype, bytes) in order) as lists of their indices, in the order they close:
    greedily, one open bucket per dtype, a new one when the entry would take it past ``size`` bytes."""
    size = bucket_size() if size is None else size
    closed: list[list[int]] = []
    open_: dict[str, tuple[list[int], int]] = {}
    for index, (dtype, nbytes) in enumerate(entries):
        members, used = open_.get(dtype, ([], 0))
        if members and (size <= 0 or used + nbytes > size):
            closed.append(members)
            members, used = [], 0
        open_[dtype] = ([*members, index], used + nbytes)
    return closed + [members for members, _ in open_.values()]


def gradient_entry(t: torch.Tensor) -> tuple[str, int]:
    """(dtype, bytes) of a gradient (or of its parameter), as :func:`pack` takes them."""
    return str(t.dtype).removeprefix("torch."), t.numel() * t.element_size()


def all_reduce_bucket(members: Sequence[torch.Tensor], group: coll.AxisGroup) -> None:
    """Sum one bucket's gradients over ``group`` in place: one all-reduce (phase ``gradient``) of them flattened
    into one buffer, unflattened back."""
    flat = torch.cat([g.reshape(-1) for g in members])
    summed = coll.all_reduce_gradient(flat, group)
    offset = 0
    for g in members:
        g.copy_(summed[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_in_buckets(grads: Sequence[torch.Tensor], group: coll.AxisGroup) -> None:
    """Sum ``grads`` (accumulated weight gradients, in the stage's parameter order) over ``group`` in place,
    one all-reduce (phase ``gradient``) per bucket over the bucket's gradients flattened into one buffer."""
    for bucket in pack([gradient_entry(g) for g in grads]):
        all_reduce_bucket([grads[i] for i in bucket], group)


def bucket_collectives(entries: Sequence[tuple[str, int]]) -> list[int]:
    """[count, bytes] of the all-reduces :func:`all_reduce_in_buckets` issues for ``entries`` ((dtype,
    bytes) in parameter order)."""
    return [len(pack(entries)), sum(nbytes for _, nbytes in entries)]


def deferred_collectives(record: ExplainRecord, deferred: Mapping[str, str]) -> dict[str, list[int]]:
    """Per mesh axis, [count, bytes] of a stage's deferred weight-gradient all-reduces as plan.json prices them
    (its ``replicate`` steps in ``deferred`` with a communication price, on axes of more than one rank, each of
    its source's local bytes), packed into buckets in parameter order (the weights' names sorted, each weight's
    replicate steps in plan order), as :meth:`RankModule.sync_deferred` issues them."""
    sizes = dict(zip(record.mesh.axes, record.mesh.sizes, strict=True))
    names: dict[str, str] = {}  # a weight chain's tensor -> its weight's name
    priced: list[tuple[str, int, str, tuple[str, int]]] = []  # (weight, position, axis, (dtype, bytes))
    for position, step in enumerate(record.steps):
        if isinstance(step, WeightStepRecord):
            names[step.out] = step.name
        elif isinstance(step, PartitionStepRecord | ReplicateStepRecord) and step.src in names:
            names[step.out] = names[step.src]
            if (
                isinstance(step, ReplicateStepRecord)
                and step.out in deferred
                and (step.communication_s or 0) > 0
                and sizes[step.axis] > 1
            ):
                t = record.tensors[step.src]
                priced.append((names[step.src], position, step.axis, (t.dtype, t.local_bytes)))
    by_axis: dict[str, list[tuple[str, int]]] = {}
    for _, _, axis, entry in sorted(priced):
        by_axis.setdefault(axis, []).append(entry)
    return {axis: bucket_collectives(entries) for axis, entries in by_axis.items()}


def axis_buckets(params: Sequence[torch.Tensor], axes: Mapping[int, Sequence[str]]) -> list[tuple[str, list[int]]]:
    """The buckets of the parameters ``axes`` names (parameter index -> the mesh axes its gradient is summed
    over), in the order they are issued: per axis (in the order the first parameters name them), the
    parameters in index order packed by :func:`pack`; each bucket as (axis, parameter indices)."""
    by_axis: dict[str, list[int]] = {}
    for index, names in sorted(axes.items()):
        for axis in names:
            by_axis.setdefault(axis, []).append(index)
    out: list[tuple[str, list[int]]] = []
    for axis, indices in by_axis.items():
        out += [(axis, [indices[j] for j in bucket]) for bucket in pack([gradient_entry(params[i]) for i in indices])]
    return out


class BucketedSync:
    """The weight-gradient all-reduces of ``params`` in buckets, issued from hooks while autograd runs a backward
    (module docstring, "During a backward"). ``axes``: parameter index -> the mesh axes its gradient is summed
    over, in order; ``groups``: this rank's group on each axis."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        axes: Mapping[int, Sequence[str]],
        groups: Mapping[str, coll.AxisGroup],
    ) -> None:
        self.params = list(params)
        self.groups = dict(groups)
        self.axes = {index: list(names) for index, names in axes.items() if names}
        self.buckets = axis_buckets(self.params, self.axes)
        self._ready: set[int] = set()  # reached by this backward (or zero-filled at its end)
        self._kept: dict[int, torch.Tensor] = {}  # the gradient accumulated before this backward, kept aside
        self._left: dict[int, int] = {}  # parameter index -> its buckets not yet issued in this backward
        self._next = 0  # the next bucket to issue
        self._queued = False
        # torch frees a leaf's AccumulateGrad node when nothing holds it, so the hooks are kept with it (DDP keeps
        # them too); a pre-hook on it runs only when a backward accumulates the gradient (not torch.autograd.grad)
        self._accumulators: list[Any] = []
        for index in self.axes:
            param = self.params[index]
            with torch.enable_grad():  # a module made under torch.no_grad() still has its nodes
                view = param.view_as(param).grad_fn
            assert view is not None, "a parameter requires its gradient"
            accumulator: Any = view.next_functions[0][0]
            accumulator.register_prehook(partial(self._before_accumulate, index))
            param.register_post_accumulate_grad_hook(partial(self._accumulated, index))
            self._accumulators.append(accumulator)

    def _before_accumulate(self, index: int, _grads: Any) -> None:
        """Keep the gradient accumulated by earlier backwards aside: autograd then leaves this backward's own."""
        param = self.params[index]
        if param.grad is not None:
            self._kept[index] = param.grad
            param.grad = None

    def _accumulated(self, index: int, _param: torch.Tensor) -> None:
        if not self._queued:  # the first gradient of a backward: what is left goes out when autograd finishes
            self._queued = True
            self._left = {i: len(names) for i, names in self.axes.items()}
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._ready.add(index)
        self._issue(flush=False)

    def _issue(self, flush: bool) -> None:
        """Issue the buckets in order while the next one's weights are ready (all of them: ``flush``)."""
        while self._next < len(self.buckets):
            axis, members = self.buckets[self._next]
            if not flush and not self._ready.issuperset(members):
                return
            grads = [self._contribution(index) for index in members]
            all_reduce_bucket(grads, self.groups[axis])
            self._next += 1
            for index, grad in zip(members, grads, strict=True):
                self._left[index] -= 1
                kept = self._kept.pop(index, None) if self._left[index] == 0 else None
                if kept is not None:  # every axis summed: the earlier backwards' gradient added back
                    self.params[index].grad = kept.add_(grad)

    def _contribution(self, index: int) -> torch.Tensor:
        """This backward's gradient of a parameter; zeros for one it did not reach (its gradient kept aside)."""
        param = self.params[index]
        if index not in self._ready:
            if param.grad is not None:
                self._kept[index] = param.grad
            param.grad = torch.zeros_like(param)
            self._ready.add(index)
        assert param.grad is not None
        return param.grad

    def _end_of_backward(self) -> None:
        try:
            self._issue(flush=True)
        finally:
            self._ready.clear()
            self._next = 0
            self._queued = False
