"""Weight gradients all-reduced in buckets, as the cost model prices them: data-parallel frameworks (PyTorch DDP)
all-reduce the gradients of many weights as one flat buffer of up to ``CostModel.gradient_bucket_bytes`` (25
MiB), so each weight's all-reduce pays its bytes and only its share of a collective's latency
(``CostModel.gradient_all_reduce``). Where the torch backend syncs accumulated weight gradients outside
autograd — a pipeline stage's deferred weight-gradient all-reduces over its tensor axes and the sum over its
replicas (ZeRO-0), once per step after the last microbatch — it issues one all-reduce per bucket.

**Buckets** (:func:`pack`): per mesh axis, the gradients in the order of the stage's parameters (the weights'
names sorted, as ``RankModule`` makes them), one dtype per bucket, a weight added to the open bucket of its
dtype while the bucket stays within the bucket size, else a new one opened (a weight larger than a bucket is a
bucket of its own). plan.json records no buckets: it prices each weight's all-reduce (a ``replicate`` step's
``communication_s``, a stage's ``sync_s``) with its latency share, so ``check --training`` packs the weights
plan.json prices into buckets the same way (:func:`bucket_collectives`) and compares counts and bytes per
axis. The SPMD backend still all-reduces each weight's gradient as autograd produces it (one per weight).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from unity_eq.collectives import torch_autograd as coll
from unity_eq.cost.model import GRADIENT_BUCKET_BYTES
from unity_eq.planfile import ExplainRecord, PartitionStepRecord, ReplicateStepRecord, WeightStepRecord

__all__ = ["all_reduce_in_buckets", "bucket_collectives", "bucket_size", "deferred_collectives", "pack"]


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


def all_reduce_in_buckets(grads: Sequence[torch.Tensor], group: coll.AxisGroup) -> None:
    """Sum ``grads`` (accumulated weight gradients, in the stage's parameter order) over ``group`` in place,
    one all-reduce (phase ``gradient``) per bucket over the bucket's gradients flattened into one buffer."""
    entries = [(str(g.dtype).removeprefix("torch."), g.numel() * g.element_size()) for g in grads]
    for bucket in pack(entries):
        members = [grads[i] for i in bucket]
        flat = torch.cat([g.reshape(-1) for g in members])
        summed = coll.all_reduce_gradient(flat, group)
        offset = 0
        for g in members:
            g.copy_(summed[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


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
                nbytes = int(np.prod(t.local_shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
                priced.append((names[step.src], position, step.axis, (t.dtype, nbytes)))
    by_axis: dict[str, list[tuple[str, int]]] = {}
    for _, _, axis, entry in sorted(priced):
        by_axis.setdefault(axis, []).append(entry)
    return {axis: bucket_collectives(entries) for axis, entries in by_axis.items()}
