"""One rank of an SPMD plan as a ``torch.nn.Module``: plan.json's steps executed as PyTorch ops.

The module runs the plan's steps in order (the same steps the ONNX lowering writes into ``device_<rank>.onnx``):
a ``compute`` step is the ONNX op in PyTorch (unity_eq.train.torch_ops), a parallel step is its autograd
collective (the kind's ``torch_op``: unity_eq.collectives.torch_autograd), so the backward pass is autograd's
and issues the collectives the plan priced.

**Parameters are this rank's shards.** A weight the plan loads is a chain of steps before any op reads it: the
weight, its ``partition`` steps (the chunk of each mesh axis) and ``replicate`` steps. When every use of a
source weight on this rank reads the same chunk, that chunk is the rank's parameter (a Megatron column
shard, a data-parallel replica's whole weight); the replicate steps of the chain become gradient all-reduces of
it. When a rank reads one weight in several ways (a tied embedding, whole in one place and sliced in another),
its parameter is the whole weight and each sliced use is an activation-style partition (its gradient
all-gathered), which the cost model does not price: ``check --training`` reports it.

**What is trainable.** A float initializer of the source ONNX file is a parameter; an integer one, or a tensor
the frontend folded from constants (a name the file does not have), is a constant: no gradient, no optimizer
state, no gradient all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from typing_extensions import assert_never

from unity_eq.collectives import torch_autograd as coll
from unity_eq.collectives import torch_op as _op
from unity_eq.dtypes import is_float
from unity_eq.errors import PlanError
from unity_eq.planfile import (
    CombineStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    InputStepRecord,
    PartitionStepRecord,
    ReduceStepRecord,
    ReplicateStepRecord,
    WeightStepRecord,
)
from unity_eq.train.torch_ops import refuse_unknown, run_op, tensor_of

__all__ = ["RankModule", "Region", "depends_on_inputs", "weight_uses"]

Parts = tuple[tuple[int, str], ...]  # the (dim, mesh axis) of each partition, in order


@dataclass(frozen=True)
class _Chain:
    """A weight not yet read by an op: the source weight, its partitions and its replicate axes so far."""

    name: str
    parts: Parts = ()
    replicates: tuple[tuple[str, str], ...] = ()  # (mesh axis, the replicate step's out)


@dataclass(frozen=True)
class Region:
    """Where a rank's piece lies in the source weight: per dim, ``(start, size)``."""

    box: tuple[tuple[int, int], ...]

    def index(self) -> tuple[slice, ...]:
        return tuple(slice(start, start + size) for start, size in self.box)


def region_of(
    shape: Sequence[int], parts: Parts, axes: Sequence[str], sizes: Sequence[int], coords: Sequence[int]
) -> Region:
    """The box of the chunk ``parts`` selects, on a rank at ``coords`` of the mesh."""
    box = [(0, int(d)) for d in shape]
    for dim, axis in parts:
        i = axes.index(axis)
        start, size = box[dim]
        piece = size // sizes[i]
        box[dim] = (start + coords[i] * piece, piece)
    return Region(tuple(box))


def depends_on_inputs(steps: Iterable[Any]) -> set[str]:
    """The tensors computed from a model input: a replicate of one is an activation's gradient all-reduce
    (phase ``backward``), of any other a weight's (phase ``gradient``)."""
    found: set[str] = set()
    for step in steps:
        match step:
            case InputStepRecord(out=out):
                found.add(out)
            case ComputeStepRecord(inputs=inputs, outputs=outputs):
                if any(isinstance(i, str) and i in found for i in inputs):
                    found.update(o for o in outputs if o)
            case (
                PartitionStepRecord(out=out, src=src)
                | CombineStepRecord(out=out, src=src)
                | ReduceStepRecord(out=out, src=src)
                | ReplicateStepRecord(out=out, src=src)
            ):
                if src in found:
                    found.add(out)
            case WeightStepRecord():
                pass
            case _:
                assert_never(step)
    return found


@dataclass
class _Uses:
    """How this rank reads each source weight: the distinct partition chains it reads."""

    parts: dict[str, list[Parts]] = field(default_factory=dict)
    #: every distinct (partitions, replicate axes) a weight is read with: its gradient all-reduces can wait for
    #: the last microbatch (or go out in buckets) only when there is one
    reads: dict[str, set[tuple[Parts, tuple[str, ...]]]] = field(default_factory=dict)
    #: the replicate steps (mesh axis, step out) of every chain a weight is read through
    replicates: dict[str, set[tuple[str, str]]] = field(default_factory=dict)

    def add(self, chain: _Chain) -> None:
        seen = self.parts.setdefault(chain.name, [])
        if chain.parts not in seen:
            seen.append(chain.parts)
        self.reads.setdefault(chain.name, set()).add((chain.parts, tuple(axis for axis, _ in chain.replicates)))
        self.replicates.setdefault(chain.name, set()).update(chain.replicates)


def weight_uses(steps: Iterable[Any], outputs: Iterable[str]) -> _Uses:
    """How the steps read each source weight: every chain (the weight, its partitions and replicates) that an
    op, a combine, a reduce or a model output reads. One walk for the rank's parameters and for ZeRO's choice
    of what it shards (unity_eq.train.zero_plan), so the two agree."""
    uses = _Uses()
    chains: dict[str, _Chain] = {}
    for step in steps:
        match step:
            case WeightStepRecord(out=out, name=name):
                chains[out] = _Chain(name)
            case PartitionStepRecord(out=out, src=src, dim=dim, axis=axis) if src in chains:
                c = chains[src]
                chains[out] = _Chain(c.name, (*c.parts, (dim, axis)), c.replicates)
            case ReplicateStepRecord(out=out, src=src, axis=axis) if src in chains:
                c = chains[src]
                chains[out] = _Chain(c.name, c.parts, (*c.replicates, (axis, out)))
            case ComputeStepRecord(inputs=inputs):
                for i in inputs:
                    if isinstance(i, str) and i in chains:
                        uses.add(chains[i])
            case PartitionStepRecord() | ReplicateStepRecord() | InputStepRecord():
                pass
            case CombineStepRecord(src=src) | ReduceStepRecord(src=src):
                if src in chains:
                    uses.add(chains[src])
            case _:
                assert_never(step)
    for tid in outputs:
        if tid in chains:
            uses.add(chains[tid])
    return uses


class RankModule(torch.nn.Module):
    """One rank of a plan: its parameters are its shards of the source model's weights; ``forward(inputs)``
    returns the model's outputs (replicated on every rank, as the plan makes them)."""

    def __init__(
        self,
        record: ExplainRecord,
        rank: int,
        weights: Mapping[str, Any],
        trainable: set[str],
        groups: Mapping[str, coll.AxisGroup],
        device: torch.device | str = "cpu",
        derived: Mapping[str, Any] | None = None,
        zero: tuple[frozenset[str], frozenset[str]] | None = None,
        defer_weight_sync: bool = False,
        bucket_weight_sync: bool = False,
    ) -> None:
        """``defer_weight_sync``: a parameter read one way only has its gradient all-reduces (its chain's
        replicate steps) left out of autograd and issued by :meth:`sync_deferred` on the accumulated gradient,
        once per step (a pipeline stage's microbatches, as the stage search prices them).
        ``bucket_weight_sync``: the same all-reduces issued in the cost model's buckets by hooks while autograd
        runs each backward (an SPMD plan; :class:`unity_eq.train.buckets.BucketedSync`). A parameter read in
        several ways (whole and sliced), or also through a weight folded from it, keeps its all-reduces in
        autograd either way: they apply to one read's gradient, not to the sum."""
        super().__init__()
        #: ZeRO's share of the plan (unity_eq.train.zero_plan.ZeroSharding: the parameters it shards, the
        #: replicate steps whose gradient all-reduce is left out, as ZeRO sums those gradients instead, so each
        #: rank's gradient of those parameters is its own replica's); every other weight keeps the plan's
        #: all-reduces. None: no ZeRO, or ZeRO over a pipeline stage's replicas (which takes every weight)
        self.zero_params: frozenset[str] | None = zero[0] if zero is not None else None
        self.zero_replicates: frozenset[str] = zero[1] if zero is not None else frozenset()
        self.record = record
        self.rank = rank
        self.device = torch.device(device)
        self.groups = dict(groups)
        self.coords = tuple(record.mesh.ranks[rank].coords)
        self.axes, self.sizes = tuple(record.mesh.axes), tuple(record.mesh.sizes)
        self.outputs = {name: out.tensor for name, out in record.model.outputs.items()}
        refuse_unknown(
            ((s.op, s.domain, s.node) for s in record.steps if isinstance(s, ComputeStepRecord)), "plan.json"
        )
        self.from_inputs = depends_on_inputs(record.steps)
        self.gradless: set[str] = set()  # parallel steps whose backward issued nothing: no gradient flows there
        self.derived = {name: d for name, d in (derived or {}).items()}
        uses = self._uses()
        for name in list(uses.parts):  # a folded weight is made from its sources, which it reads whole
            if name in self.derived:
                for source in self.derived[name].sources:
                    uses.add(_Chain(source))
        defer = defer_weight_sync or bucket_weight_sync
        self._defer = {name for name, reads in uses.reads.items() if defer and len(reads) == 1}
        self._deferred_axes: dict[int, list[str]] = {}  # parameter index -> the axes its gradient is summed over
        self.param_names: list[str] = []
        self.param_parts: list[Parts] = []  # the chunk each parameter is ( (): the whole weight )
        self.param_list = torch.nn.ParameterList()
        self._param_index: dict[str, int] = {}
        self._consts: dict[str, torch.Tensor] = {}
        self.source_shapes: dict[str, tuple[int, ...]] = {}
        for name in sorted(uses.parts):
            if name in self.derived:
                continue  # computed from its sources in forward (_base)
            if name not in weights:
                raise PlanError(f"plan.json: the plan loads weight {name!r}, which the model does not have.")
            value = np.asarray(weights[name])
            self.source_shapes[name] = tuple(value.shape)
            chains = uses.parts[name]
            if name in trainable and is_float(value.dtype):
                own = chains[0] if len(chains) == 1 else ()
                piece = value[self.region(value.shape, own).index()]
                self._param_index[name] = len(self.param_names)
                self.param_names.append(name)
                self.param_parts.append(own)
                self.param_list.append(torch.nn.Parameter(tensor_of(piece, device)))
            else:
                self._consts[name] = tensor_of(value, device)
        #: replicate step out -> its mesh axis: a parameter's deferred all-reduces (issued by sync_deferred or in
        #: buckets; those on an ``unsynced`` axis are ZeRO's)
        self.deferred: dict[str, str] = {}
        for name in sorted(self._defer & set(self._param_index)):
            self.deferred.update({out: axis for axis, out in uses.replicates[name] if out not in self.zero_replicates})
            ((_, axes),) = uses.reads[name]
            zeroed = {axis for axis, out in uses.replicates[name] if out in self.zero_replicates}
            if kept := [axis for axis in axes if axis not in zeroed]:
                self._deferred_axes[self._param_index[name]] = kept
        self.bucket_sync: Any = None  # BucketedSync when bucket_weight_sync
        if bucket_weight_sync:
            from unity_eq.train.buckets import BucketedSync

            self.bucket_sync = BucketedSync(list(self.param_list), self._deferred_axes, self.groups)

    # --- what the steps read ---------------------------------------------------------------------------------
    def _uses(self) -> _Uses:
        return weight_uses(self.record.steps, self.outputs.values())

    def region(self, shape: Sequence[int], parts: Parts) -> Region:
        return region_of(shape, parts, self.axes, self.sizes, self.coords)

    def named_shards(self) -> list[tuple[str, Region, torch.nn.Parameter]]:
        """Every parameter with the source weight it is a piece of and where the piece lies in it."""
        out = []
        for name, parts, param in zip(self.param_names, self.param_parts, self.param_list, strict=True):
            out.append((name, self.region(self.source_shapes[name], parts), param))
        return out

    def zero_split(self) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
        """This rank's parameters ZeRO shards (``zero.params``) and the others (the plan's own all-reduces, a
        plain optimizer state), each in parameter order."""
        chosen = self.zero_params or frozenset()
        pairs = list(zip(self.param_names, self.param_list, strict=True))
        return [p for n, p in pairs if n in chosen], [p for n, p in pairs if n not in chosen]

    # --- running ----------------------------------------------------------------------------------------------
    def _weight(self, chain: _Chain) -> torch.Tensor:
        """A weight chain as the op reads it: the parameter (or constant), sliced where the parameter is
        bigger than the chunk read, with the chain's gradient all-reduces."""
        value, own = self._base(chain.name)
        if chain.parts != own:
            for dim, axis in chain.parts:
                value = _op("partition")(value, self.groups[axis], {"dim": dim})
        if chain.name in self._defer and chain.name in self._param_index:
            return value  # its all-reduces are deferred (sync_deferred, buckets) or ZeRO's
        for axis, out in chain.replicates:
            if out not in self.zero_replicates or not value.requires_grad:  # a constant's: counted in gradless
                value = self._replicate(out, value, axis, coll.GRADIENT)
        return value

    def sync_deferred(self) -> None:
        """The deferred gradient all-reduces (``defer_weight_sync``), on the gradients accumulated so far: per
        mesh axis, the gradients in parameter order, one all-reduce per bucket (unity_eq.train.buckets)."""
        from unity_eq.train.buckets import all_reduce_in_buckets

        by_axis: dict[str, list[torch.Tensor]] = {}
        for index, axes in sorted(self._deferred_axes.items()):
            param = self.param_list[index]
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            for axis in axes:
                by_axis.setdefault(axis, []).append(param.grad)
        for axis, grads in by_axis.items():
            all_reduce_in_buckets(grads, self.groups[axis])

    def _base(self, name: str) -> tuple[torch.Tensor, Parts]:
        """A source weight as this rank holds it (its parameter and the chunk it is, or a constant), or a
        folded weight computed from its sources' parameters (differentiable, so their gradients get its)."""
        if name in self._param_index:
            i = self._param_index[name]
            return self.param_list[i], self.param_parts[i]
        if name in self._consts:
            return self._consts[name], ()
        derivation = self.derived[name]
        env: dict[str, torch.Tensor] = {
            i: torch.zeros(shape, dtype=getattr(torch, dtype), device=self.device)
            for i, shape, dtype in derivation.placeholders
        }
        env.update({i: tensor_of(value, self.device) for i, value in derivation.constants})
        for source in derivation.sources:
            value, own = self._base(source)
            assert own == (), "a folded weight's sources are held whole"
            env[source] = value
        for op, domain, inputs, outputs, attrs in derivation.nodes:
            args = [env[i] if i in env else self._base(i)[0] if i else None for i in inputs]
            for out, value in zip(outputs, run_op(op, args, attrs, len(outputs), domain, onnx=True), strict=False):
                env[out] = value
        return env[name], ()

    def _replicate(self, out: str, value: torch.Tensor, axis: str, phase: str) -> torch.Tensor:
        """A replicate step; one whose tensor carries no gradient (an input, a constant) issues nothing and is
        remembered in ``gradless``: plan.json may price it, and ``check --training`` says so."""
        if not value.requires_grad:
            self.gradless.add(out)
        return _op("replicate")(value, self.groups[axis], {"phase": phase})

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        env: dict[str, torch.Tensor] = {}
        chains: dict[str, _Chain] = {}
        made: dict[str, torch.Tensor] = {}

        def read(tid: str) -> torch.Tensor:
            if tid in env:
                return env[tid]
            if tid not in made:
                made[tid] = self._weight(chains[tid])
            return made[tid]

        for step in self.record.steps:
            match step:
                case InputStepRecord(out=out, name=name):
                    env[out] = inputs[name]
                case WeightStepRecord(out=out, name=name):
                    chains[out] = _Chain(name)
                case PartitionStepRecord(out=out, src=src, dim=dim, axis=axis):
                    if src in chains:
                        c = chains[src]
                        chains[out] = _Chain(c.name, (*c.parts, (dim, axis)), c.replicates)
                    else:
                        if not env[src].requires_grad:
                            self.gradless.add(out)
                        env[out] = _op("partition")(env[src], self.groups[axis], {"dim": dim})
                case ReplicateStepRecord(out=out, src=src, axis=axis):
                    if src in chains:
                        c = chains[src]
                        chains[out] = _Chain(c.name, c.parts, (*c.replicates, (axis, out)))
                    elif out in self.zero_replicates and env[src].requires_grad:
                        env[out] = env[src]  # computed from weights alone: ZeRO sums their gradients
                    else:
                        phase = coll.BACKWARD if src in self.from_inputs else coll.GRADIENT
                        env[out] = self._replicate(out, env[src], axis, phase)
                case CombineStepRecord(out=out, src=src, dim=dim, axis=axis):
                    env[out] = _op("all_gather")(read(src), self.groups[axis], {"dim": dim})
                case ReduceStepRecord(out=out, src=src, axis=axis):
                    env[out] = _op("all_reduce")(read(src), self.groups[axis], {})
                case ComputeStepRecord():
                    self._compute(step, read, env)
                case _:
                    assert_never(step)
        return {name: read(tid) for name, tid in self.outputs.items()}

    def _compute(self, step: ComputeStepRecord, read: Any, env: dict[str, torch.Tensor]) -> None:
        args: list[Any] = []
        for position, ref in enumerate(step.inputs):
            if ref is None:
                args.append(None)
            elif isinstance(ref, str):
                args.append(read(ref))
            else:
                values = tuple(ref)
                if step.op in ("Reshape", "Expand") and position == 1:
                    values = tuple(self.record.tensors[step.outputs[0]].local_shape)  # the rank's piece
                args.append(torch.tensor(values, dtype=torch.int64))
        results = run_op(step.op, args, step.attrs, len(step.outputs), step.domain)
        for out, value in zip(step.outputs, results, strict=False):
            if out:
                env[out] = value
