"""One rank's step of a pipeline plan on torch.distributed: its stage's microbatches in the schedule's order, the
activations sent point to point between stages, the gradient syncs (:mod:`unity_eq.train.pipeline` loads the rank).

**A step.** The batch (every rank passes the whole batch, as for SPMD plans) is ``d`` replicas × ``m``
microbatches of ``b`` samples along dimension 0, replica by replica. Stage 0 of replica ``r`` takes its
microbatch; every later stage receives the previous stage's activation from the same tensor rank of the same
replica, and the side tensors it reads (an attention mask) from stage 0; it sends its own activation on. In
the backward pass each stage receives the gradient of the activation it sent and sends back the gradient of
the one it received. The last stage's loss per microbatch is scaled so the microbatches add up to the loss of
the whole batch (:func:`unity_eq.train.pipeline.microbatch_scale`). After the last microbatch: the stage plan's
weight-gradient all-reduces over its tensor axes (once per step, as the stage search prices them,
``gradient_s``), then each weight's gradient summed over the ``d`` replicas (ZeRO-0's all-reduce, ``sync_s``),
both in the cost model's gradient buckets (unity_eq.train.buckets); the caller steps the optimizer. ZeRO 1-3
over the replicas run as plan.json chose them (unity_eq.train.pipeline_zero), and each stage's recomputation as
plan.json says (:func:`unity_eq.train.pipeline.recomputes`).

**Schedules** (unity_eq.stages.schedule): ``gpipe`` runs every microbatch's forward, then every backward;
``1f1b`` runs ``p - s - 1`` forwards, then alternates one forward and one backward, then drains. Sends are
asynchronous (waited for at the end of the step) and receives blocking, so neither order can deadlock.

**Counted** (the rank's :class:`~unity_eq.collectives.torch_autograd.Ledger`): the stage plan's collectives as
for SPMD plans, the data-axis gradient all-reduce (axis ``data``), and every point-to-point send and receive
(kind ``send``/``recv``, axis ``pipeline``, phase ``forward``, ``backward`` or ``side``), which
:func:`unity_eq.train.predict.predicted_pipeline` predicts from plan.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from unity_eq.collectives import torch_autograd as coll
from unity_eq.dtypes import is_float
from unity_eq.errors import PlanError
from unity_eq.planfile import ExplainRecord
from unity_eq.runtime.pipeline import PipelinePlan
from unity_eq.train.buckets import all_reduce_in_buckets
from unity_eq.train.rank import Region
from unity_eq.train.session import RankTrainer, assemble
from unity_eq.train.torch_ops import array_of

__all__ = ["DATA_AXIS", "PIPELINE_AXIS", "STAGES_AXIS", "PipelineTrainer", "SharedWeight", "schedule_order"]

DATA_AXIS = "data"  # the ledger's name of the replicas' axis (a stage plan's mesh axes are its tensor group's)
STAGES_AXIS = "stages"  # the ledger's name of the sum of a weight's gradients over the stages that train it
PIPELINE_AXIS = "pipeline"  # the ledger's name of the point-to-point sends between stages
GRAD_TAG = 1 << 20  # tags: an activation is sent with its microbatch, its gradient with GRAD_TAG + microbatch
SIDE_TAG = 1 << 21  # a side tensor with SIDE_TAG + microbatch · (side tensors) + its index in stage 0's list


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


@dataclass
class SharedWeight:
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


def _float(dtype: str) -> bool:
    return is_float(dtype)


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
    shared: list[SharedWeight] = field(default_factory=list)
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
            mine.append((name, region.box, array_of(value), self.plan_module.source_shapes[name]))
        pieces: list[Any] = [None] * self.world_size
        dist.all_gather_object(pieces, mine)
        if self.rank != 0:
            return None
        shapes = {name: shape for rank_pieces in pieces for name, _, _, shape in rank_pieces}
        return assemble([[p[:3] for p in rank_pieces] for rank_pieces in pieces], shapes)

    def shards(self) -> list[tuple[str, Region, torch.nn.Parameter]]:
        return self.plan_module.named_shards()
