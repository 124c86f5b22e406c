"""Training a pipeline plan on torch.distributed: each rank runs its stage's SPMD plan microbatch by microbatch,
in the order the plan's schedule (GPipe or 1F1B) gives, with the activations between stages sent point to point.

**Ranks.** Global rank ``g`` is tensor rank ``k`` of replica ``r`` of stage ``s``: plan.json's
``stages[s].replicas[r][k]`` (unity_eq.lower.pipeline.stage_replicas; the MPI backend places ranks the same
way). It runs stage ``s``'s plan (``stage<s>/plan.json``) as a :class:`~unity_eq.train.rank.RankModule` of
tensor rank ``k``, its collectives on process groups of its replica's tensor group.

**A step.** The batch (every rank passes the whole batch, as for SPMD plans) is ``d`` replicas × ``m``
microbatches of ``b`` samples along dimension 0, replica by replica. Stage 0 of replica ``r`` takes its
microbatch; every later stage receives the previous stage's activation from the same tensor rank of the same
replica, and the side tensors it reads (an attention mask) from stage 0; it sends its own activation on. In
the backward pass each stage receives the gradient of the activation it sent and sends back the gradient of
the one it received. The last stage's loss per microbatch is scaled so the microbatches add up to the loss of
the whole batch (:func:`microbatch_scale`). After the last microbatch: the stage plan's weight-gradient
all-reduces over its tensor axes (once per step, as the stage search prices them, ``gradient_s``), then each
weight's gradient summed over the ``d`` replicas (ZeRO-0's all-reduce, ``sync_s``), both in the cost model's
gradient buckets (unity_eq.train.buckets); the caller steps the optimizer. ZeRO 1-3 over the replicas run as
plan.json chose them (unity_eq.train.pipeline_zero), and each stage's recomputation as plan.json says
(:func:`recomputes`).

**Schedules** (unity_eq.stages.schedule): ``gpipe`` runs every microbatch's forward, then every backward;
``1f1b`` runs ``p - s - 1`` forwards, then alternates one forward and one backward, then drains. Sends are
asynchronous (waited for at the end of the step) and receives blocking, so neither order can deadlock.

**Counted** (the rank's :class:`~unity_eq.collectives.torch_autograd.Ledger`): the stage plan's collectives as
for SPMD plans, the data-axis gradient all-reduce (axis ``data``), and every point-to-point send and receive
(kind ``send``/``recv``, axis ``pipeline``, phase ``forward``, ``backward`` or ``side``), which
:func:`predicted_pipeline` predicts from plan.json.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from unity_eq.collectives import torch_autograd as coll
from unity_eq.errors import OptionError, PlanError
from unity_eq.planfile import ExplainRecord, read_explain_record
from unity_eq.runtime.pipeline import PipelinePlan, load_pipeline_dir
from unity_eq.train.buckets import all_reduce_in_buckets
from unity_eq.train.pipeline_zero import defers_weight_sync, refuse_zero_shared, stage_runner
from unity_eq.train.rank import RankModule, Region
from unity_eq.train.session import (
    RankTrainer,
    assemble,
    load_spmd_rank,
    mesh_groups,
    pick_device,
    refuse_ambiguous,
    source_weights,
)

__all__ = [
    "DATA_AXIS",
    "PIPELINE_AXIS",
    "PipelineTrainer",
    "load_pipeline_rank",
    "load_rank",
    "microbatch_scale",
    "refuse_unbuilt",
    "schedule_order",
]

DATA_AXIS = "data"  # the ledger's name of the replicas' axis (a stage plan's mesh axes are its tensor group's)
STAGES_AXIS = "stages"  # the ledger's name of the sum of a weight's gradients over the stages that train it
PIPELINE_AXIS = "pipeline"  # the ledger's name of the point-to-point sends between stages
GRAD_TAG = 1 << 20  # tags: an activation is sent with its microbatch, its gradient with GRAD_TAG + microbatch
SIDE_TAG = 1 << 21  # a side tensor with SIDE_TAG + microbatch · (side tensors) + its index in stage 0's list

Key = tuple[str, str, str]


def refuse_unbuilt(plan: PipelinePlan) -> None:
    """What the torch backend does not run yet for a pipeline plan, as one PlanError before any process group
    exists: a weight several stages train under ZeRO-2 or ZeRO-3 over more than one replica
    (unity_eq.train.pipeline_zero.refuse_zero_shared). ZeRO 0-3 (:func:`zero_level`) and recomputation
    (:func:`recomputes`) run."""
    records = [read_explain_record(directory.path / "plan.json") for directory in plan.stages]
    refuse_zero_shared(plan.path, zero_level(plan), plan.replicas, records)


def zero_level(plan: PipelinePlan) -> int:
    """The ZeRO level a stage's replicas run: plan.json's ``chosen.zero`` where there is more than one replica
    (one replica has nothing to shard)."""
    chosen = plan.record.chosen
    return chosen.zero if chosen.data > 1 else 0


def recomputes(plan: PipelinePlan, stage: int) -> bool:
    """Whether ``stage`` keeps its inputs only and runs its forward again in the backward pass: plan.json's
    ``stages[s].recomputes`` (the stage search's choice per stage), or ``chosen.recompute == "full"``."""
    return bool(plan.record.stages[stage].recomputes) or plan.record.chosen.recompute == "full"


def schedule_order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The stage's work in order: ``("F", i)`` the forward of microbatch ``i``, ``("B", i)`` its backward."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule == "1f1b":
        warm = min(stages - stage - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        return order + [("B", i) for i in range(m - warm, m)]
    raise PlanError(f"schedule: expected 1f1b or gpipe, got {schedule!r}. Re-run `unity-eq optimize --pipeline`.")


def microbatch_scale(model: str | Path, how: str | None, count: int) -> float:
    """The factor of each microbatch's loss, so that the ``count`` microbatches' scaled losses add up to the
    loss of the whole batch: ``1/count`` for a mean (``--loss mean``, or a scalar loss the model makes with a
    ReduceMean), 1 for a sum. A scalar loss made otherwise cannot be split over microbatches: one error."""
    if how == "mean":
        return 1.0 / count
    if how == "sum" or count == 1:
        return 1.0
    if how is not None:
        raise OptionError(f"`--loss`: expected sum or mean, got {how!r}.")
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    first = proto.graph.output[0].name
    producer = next((n for n in proto.graph.node if first in n.output), None)
    op = producer.op_type if producer is not None else None
    if op == "ReduceMean":
        return 1.0 / count
    if op == "ReduceSum":
        return 1.0
    raise OptionError(
        f"the model's loss {first!r} is made by {op or 'no node'}, not a ReduceMean or ReduceSum over the batch: a "
        f"pipeline of {count} microbatches cannot tell how its microbatches' losses add up. Train on the model's "
        "per-sample output with `--loss sum` or `--loss mean`."
    )


def _float(dtype: str) -> bool:
    return bool(np.issubdtype(np.dtype(dtype), np.floating))


@dataclass
class _Flight:
    """A microbatch between its forward and its backward on this rank."""

    received: torch.Tensor | None  # the activation received (its gradient goes back), None on stage 0
    sent: torch.Tensor | None  # the activation sent on, None on the last stage
    loss: torch.Tensor | None  # the scaled loss, on the last stage


@dataclass
class PipelineTrainer(RankTrainer):
    """One rank of a pipeline plan: its stage's module (this rank's shards of the stage's weights), and a step
    that runs the schedule (:meth:`forward_backward`). Every rank calls every method."""

    plan: PipelinePlan = field(default=None)  # type: ignore[assignment]
    stage: int = 0
    replica: int = 0
    tensor: int = 0
    scale: float = 1.0
    stage_records: list[ExplainRecord] = field(default_factory=list)
    data_group: coll.AxisGroup | None = None
    shared: list[_Shared] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def place(self, stage: int, replica: int | None = None, tensor: int | None = None) -> int:
        """The global rank of (stage, replica, tensor rank); this rank's replica and tensor rank by default."""
        r = self.replica if replica is None else replica
        return self.plan.record.stages[stage].replicas[r][self.tensor if tensor is None else tensor]

    # --- point to point ----------------------------------------------------------------------------------------
    def _send(self, value: torch.Tensor, dest: int, tag: int, phase: str) -> None:
        value = value.detach().contiguous()
        self.pending.append((dist.isend(value, dest, tag=tag), value))  # kept alive until waited for
        self.ledger.record("send", PIPELINE_AXIS, phase, value.numel() * value.element_size())

    def _recv(self, shape: Sequence[int], dtype: str, source: int, tag: int, phase: str) -> torch.Tensor:
        value = torch.empty(tuple(shape), dtype=getattr(torch, np.dtype(dtype).name), device=self.device)
        dist.recv(value, source, tag=tag)
        self.ledger.record("recv", PIPELINE_AXIS, phase, value.numel() * value.element_size())
        return value

    # --- a microbatch --------------------------------------------------------------------------------------------
    def _forward(self, batch: Mapping[str, torch.Tensor], i: int, how: str | None) -> _Flight:
        from unity_eq.train.session import loss_of

        record = self.plan.record
        stage = record.stages[self.stage]
        inputs = self.record.model.inputs
        last = self.stage == len(record.stages) - 1
        received = None
        if self.stage == 0:
            b, first = self.plan.microbatch, (self.replica * self.plan.microbatches + i)
            feeds = {name: batch[name][first * b : (first + 1) * b] for name in inputs}
        else:
            name = str(stage.receives)
            spec = inputs[name]
            received = self._recv(spec.shape, spec.dtype, self.place(self.stage - 1), i, "forward")
            if _float(spec.dtype):
                received.requires_grad_(True)
            feeds = {name: received}
            side = record.stages[0].side_sends
            for n in stage.side_receives:
                tag = SIDE_TAG + i * len(side) + side.index(n)
                feeds[n] = self._recv(inputs[n].shape, inputs[n].dtype, self.place(0), tag, "side")
        outputs = self.module(feeds)
        if self.stage == 0:
            self._send_side(outputs, i)
        if last:
            return _Flight(received, None, loss_of(outputs, how) * self.scale)
        sent = outputs[str(stage.sends)]
        self._send(sent, self.place(self.stage + 1), i, "forward")
        return _Flight(received, sent, None)

    def _send_side(self, outputs: Mapping[str, torch.Tensor], i: int) -> None:
        """Stage 0: each side tensor to the same tensor rank of every later stage that reads it."""
        side = self.plan.record.stages[0].side_sends
        for name in side:
            if outputs[name].requires_grad:
                raise PlanError(
                    f"{self.plan.path}: side tensor {name!r} is computed from trainable weights, so its gradient "
                    "would have to go back to stage 0, which pipeline training does not do yet (nor does the plan "
                    "price it)."
                )
        for later in self.plan.record.stages[1:]:
            for name in later.side_receives:
                self._send(outputs[name], self.place(later.index), SIDE_TAG + i * len(side) + side.index(name), "side")

    def _backward(self, flight: _Flight, i: int) -> None:
        if flight.loss is not None:
            if flight.loss.requires_grad:
                flight.loss.backward()
        elif flight.sent is not None and _float(str(flight.sent.dtype).removeprefix("torch.")):
            grad = self._recv(flight.sent.shape, str(flight.sent.dtype).removeprefix("torch."),
                              self.place(self.stage + 1), GRAD_TAG + i, "backward")  # fmt: skip
            if flight.sent.requires_grad:
                torch.autograd.backward([flight.sent], [grad])
        if flight.received is not None and flight.received.requires_grad:
            back = flight.received.grad
            self._send(back if back is not None else torch.zeros_like(flight.received),
                       self.place(self.stage - 1), GRAD_TAG + i, "backward")  # fmt: skip

    # --- a step ---------------------------------------------------------------------------------------------------
    def forward_backward(self, batch: Mapping[str, torch.Tensor], how: str | None) -> torch.Tensor:
        """Every microbatch of this rank's replica through its stage, forward and backward in the schedule's
        order, then the gradient sync; returns the loss of the whole batch (on every rank). Gradients
        accumulate into the parameters' ``.grad``: zero them before, step the optimizer after."""
        chosen = self.plan.record.chosen
        flights: dict[int, _Flight] = {}
        mine = torch.zeros((), dtype=torch.float64, device=self.device)  # NCCL reduces device tensors only
        for what, i in schedule_order(chosen.schedule, self.stage, chosen.stages, chosen.microbatches):
            if what == "F":
                flights[i] = self._forward(batch, i, how)
            else:
                flight = flights.pop(i)
                self._backward(flight, i)
                if flight.loss is not None and self.tensor == 0:
                    mine += float(flight.loss.detach())
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
        self.sync_gradients()
        coll.world_sum(mine)  # the loss to every rank
        return mine.to(torch.float32).cpu()

    def sync_gradients(self) -> None:
        """After the last microbatch: the stage plan's deferred weight-gradient all-reduces, then the sum over
        the replicas (ZeRO-0), both in buckets (unity_eq.train.buckets), then the sum over the stages of a weight
        several of them train (one all-reduce per weight)."""
        self.plan_module.sync_deferred()
        if self.data_group is not None and self.data_group.size > 1 and self.zero == 0:
            grads = []
            for param in self.plan_module.param_list:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                grads.append(param.grad)
            all_reduce_in_buckets(grads, self.data_group)
        for shared in self.shared:
            param = self.plan_module.param_list[shared.index]
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            full = torch.zeros(shared.shape, dtype=grad.dtype, device=grad.device)
            full[shared.region.index()] = torch.where(shared.own.to(grad.device), grad, torch.zeros_like(grad))
            param.grad = coll.all_reduce_gradient(full, shared.group)[shared.region.index()].contiguous()

    # --- whole-model views ------------------------------------------------------------------------------------------
    def gather_full(self, what: str = "weights") -> dict[str, np.ndarray] | None:
        """As :meth:`RankTrainer.gather_full`, over every stage (each rank sends its weights' source shapes)."""
        mine = []
        for name, region, value in self.pieces(what):  # under ZeRO gathered from the replicas' shards
            if value is None:
                value = torch.zeros(tuple(n for _, n in region.box))
            mine.append((name, region.box, value.detach().cpu().numpy(), self.plan_module.source_shapes[name]))
        pieces: list[Any] = [None] * self.world_size
        dist.all_gather_object(pieces, mine)
        if self.rank != 0:
            return None
        shapes = {name: shape for rank_pieces in pieces for name, _, _, shape in rank_pieces}
        return assemble([[p[:3] for p in rank_pieces] for rank_pieces in pieces], shapes)

    def shards(self) -> list[tuple[str, Region, torch.nn.Parameter]]:
        return self.plan_module.named_shards()


def _make_groups(
    plan: PipelinePlan, records: Sequence[ExplainRecord], rank: int, ledger: coll.Ledger, ordered: bool
) -> tuple[dict[str, coll.AxisGroup], coll.AxisGroup | None]:
    """This rank's groups: its stage plan's mesh axes within its replica's tensor group, and the data axis (the
    same tensor rank of every replica of its stage). Every rank creates every group in the same order."""
    mine: dict[str, coll.AxisGroup] = {}
    data: coll.AxisGroup | None = None
    for stage, record in zip(plan.record.stages, records, strict=True):
        for replica in stage.replicas:
            for axis, groups in mesh_groups(record).items():
                for local in groups:
                    ranks = tuple(replica[k] for k in local)
                    group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
                    if rank in ranks:
                        mine[axis] = coll.AxisGroup(axis, ranks, ranks.index(rank), group, ledger, ordered)
        for k in range(plan.record.chosen.tensor):
            ranks = tuple(replica[k] for replica in stage.replicas)
            group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                data = coll.AxisGroup(DATA_AXIS, ranks, ranks.index(rank), group, ledger, ordered)
    return mine, data


@dataclass
class _Shared:
    """A weight that several stages train (a tied embedding; the dynamo exporter's one initializer for equal
    LayerNorm biases): its gradient is summed over the ranks of this replica that hold it, every stage's
    contribution once (``own``: the elements of this rank's piece that no lower tensor rank of its stage
    contributes), after the stages' own syncs."""

    name: str
    index: int  # the parameter's index in the module
    region: Region
    shape: tuple[int, ...]
    own: torch.Tensor  # bool, the piece's shape
    group: coll.AxisGroup


def _shared_weights(
    plan: PipelinePlan, module: RankModule, place: tuple[int, int, int], rank: int, ledger: coll.Ledger, ordered: bool
) -> list[_Shared]:
    """Every weight held by more than one stage, and this rank's part in summing its gradient. Every rank sees
    every rank's pieces and creates every group, in the same order."""
    held: list[Any] = [None] * dist.get_world_size()
    mine = [(name, region.box, module.source_shapes[name]) for name, region, _ in module.named_shards()]
    dist.all_gather_object(held, (rank, *place, mine))
    holders: dict[str, list[tuple[int, int, int, int, tuple[tuple[int, int], ...]]]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for g, stage, replica, tensor, pieces in held:
        for name, box, shape in pieces:
            holders.setdefault(name, []).append((stage, tensor, replica, g, tuple(box)))
            shapes[name] = tuple(shape)
    out: list[_Shared] = []
    index = {name: k for k, name in enumerate(module.param_names)}
    for name in sorted(holders):
        if len({h[0] for h in holders[name]}) < 2:
            continue
        for r in range(plan.replicas):
            members = sorted(h for h in holders[name] if h[2] == r)
            ranks = tuple(sorted(h[3] for h in members))
            group = dist.new_group(list(ranks))
            if rank not in ranks:
                continue
            covered: dict[int, np.ndarray] = {}
            own = None
            for stage, _, _, g, box in members:  # by stage, then tensor rank
                seen = covered.setdefault(stage, np.zeros(shapes[name], bool))
                where = tuple(slice(a, a + n) for a, n in box)
                if g == rank:
                    own = torch.from_numpy(~seen[where])
                seen[where] = True
            assert own is not None
            region = Region(next(h[4] for h in members if h[3] == rank))
            axis = coll.AxisGroup(STAGES_AXIS, ranks, ranks.index(rank), group, ledger, ordered)
            out.append(_Shared(name, index[name], region, shapes[name], own, axis))
    return out


def refuse_ambiguous_pipeline(
    model: str | Path, shapes: Mapping[str, tuple[int, ...]], shared: Collection[str] = ()
) -> None:
    """The whole model's weights that may be merged parameters (``Graph.ambiguous_weights``), refused unless
    ``shared`` names them: a stage sees only its own reads, so the dynamo exporter's one LayerNorm weight for
    every layer looks like a weight several stages train, and would silently tie the layers' parameters."""
    from unity_eq.frontends.onnx import load_onnx

    refuse_ambiguous(load_onnx(model, dict(shapes)).ambiguous_weights(), shared, model)


def load_pipeline_rank(
    plan_dir: str | Path,
    model: str | Path | None = None,
    *,
    device: str = "cpu",
    rank: int | None = None,
    ordered_sum: bool | None = None,
    loss: str | None = None,
    shared: Collection[str] = (),
) -> PipelineTrainer:
    """This process's rank of the pipeline plan in ``plan_dir`` (torch.distributed initialized with the plan's
    number of ranks). ``loss``: how the model's first output becomes the loss (``loss_of``), which sets how
    microbatch losses are scaled."""
    plan = load_pipeline_dir(plan_dir)
    refuse_unbuilt(plan)
    world = plan.world_size
    if dist.get_world_size() != world:
        raise OptionError(
            f"world size: {dist.get_world_size()} processes were started, the pipeline plan in {plan_dir} has "
            f"{world} ranks ({plan.describe()}). Run `torchrun --nproc_per_node {world} -m unity_eq train {plan_dir}`."
        )
    rank = dist.get_rank() if rank is None else rank
    source = Path(model) if model is not None else Path(str(plan.record.source))
    if not source.is_file():
        raise OptionError(
            f"{source}: the model the plan was made from is not there; its weights start training. Pass the model "
            "(`--model`) or a checkpoint (`--load`)."
        )
    records = [read_explain_record(directory.path / "plan.json") for directory in plan.stages]
    stage, replica, tensor = plan.place_of(rank)
    record = records[stage]
    shapes = {name: tuple(spec.shape) for name, spec in records[0].model.inputs.items()}  # the microbatch
    refuse_ambiguous_pipeline(source, shapes, shared)
    weights, trainable, derived = source_weights(source, record, shapes, shared)
    ledger = coll.Ledger()
    torch_device = pick_device(device, int(os.environ.get("LOCAL_RANK", rank)))
    ordered = torch_device.type == "cpu" if ordered_sum is None else ordered_sum
    groups, data = _make_groups(plan, records, rank, ledger, ordered)
    level = zero_level(plan)
    defer = defers_weight_sync(level)
    module = RankModule(record, tensor, weights, trainable, groups, torch_device, derived, defer_weight_sync=defer)
    tied = _shared_weights(plan, module, (stage, replica, tensor), rank, ledger, ordered)
    scale = microbatch_scale(source, loss, plan.replicas * plan.microbatches)
    runner = stage_runner(module, level, data, recomputes(plan, stage), ledger)
    return PipelineTrainer(
        record,
        rank,
        runner,
        ledger,
        torch_device,
        rank_module=module,
        zero=level,
        zero_group=data if level else None,
        plan=plan,
        stage=stage,
        replica=replica,
        tensor=tensor,
        scale=scale,
        stage_records=records,
        data_group=data,
        shared=tied,
    )


def load_rank(
    plan_dir: str | Path,
    model: str | Path | None = None,
    *,
    device: str = "cpu",
    rank: int | None = None,
    ordered_sum: bool | None = None,
    zero: int = 0,
    zero_axis: str | None = None,
    recompute: bool = False,
    loss: str | None = None,
    shared: Collection[str] = (),
) -> RankTrainer:
    """This process's rank of ``plan_dir``, either kind of plan (``unity_eq.train.load_rank``): a pipeline
    plan's :class:`PipelineTrainer` (its ZeRO level and recomputation are plan.json's choice), or an SPMD
    plan's :class:`~unity_eq.train.session.RankTrainer` (:func:`~unity_eq.train.session.load_spmd_rank`,
    where ``zero``, ``zero_axis`` and ``recompute`` are the caller's)."""
    from unity_eq.runtime.pipeline import is_pipeline_dir

    if not is_pipeline_dir(plan_dir):
        return load_spmd_rank(
            plan_dir, model, device=device, rank=rank, ordered_sum=ordered_sum, zero=zero, zero_axis=zero_axis,
            recompute=recompute, loss=loss, shared=shared,
        )  # fmt: skip
    if zero or recompute:
        raise OptionError(
            f"{plan_dir} is a pipeline plan: its ZeRO level and recomputation are plan.json's choice "
            "(`chosen.zero`, `chosen.recompute`); `--zero`/`--recompute` apply to SPMD plans only."
        )
    return load_pipeline_rank(
        plan_dir, model, device=device, rank=rank, ordered_sum=ordered_sum, loss=loss, shared=shared
    )
