"""Training a pipeline plan on torch.distributed: each rank runs its stage's SPMD plan microbatch by microbatch,
in the order the plan's schedule (GPipe or 1F1B) gives, with the activations between stages sent point to point.

**Ranks.** Global rank ``g`` is tensor rank ``k`` of replica ``r`` of stage ``s``: plan.json's
``stages[s].replicas[r][k]`` (unity_eq.lower.pipeline.stage_replicas; the MPI backend places ranks the same
way). It runs stage ``s``'s plan (``stage<s>/plan.json``) as a :class:`~unity_eq.train.rank.RankModule` of
tensor rank ``k``, its collectives on process groups of its replica's tensor group.

**A step** (the microbatches in the schedule's order, the sends, the gradient syncs) is
:class:`~unity_eq.train.pipeline_trainer.PipelineTrainer`'s (:mod:`unity_eq.train.pipeline_trainer`, re-exported
here); this module loads a rank: the plan's choices, its process groups, the weights several stages train.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from unity_eq.collectives import torch_autograd as coll
from unity_eq.errors import OptionError
from unity_eq.planfile import ExplainRecord, read_explain_record
from unity_eq.runtime.pipeline import PipelinePlan, load_pipeline_dir
from unity_eq.train.pipeline_trainer import (
    DATA_AXIS,
    PIPELINE_AXIS,
    STAGES_AXIS,
    PipelineTrainer,
    SharedWeight,
    schedule_order,
)
from unity_eq.train.pipeline_zero import defers_weight_sync, refuse_zero_shared, stage_runner
from unity_eq.train.rank import RankModule, Region
from unity_eq.train.session import (
    check_world_size,
    mesh_groups,
    rank_device,
    source_model,
)
from unity_eq.train.weights import refuse_ambiguous, source_weights

__all__ = [
    "DATA_AXIS",
    "PIPELINE_AXIS",
    "PipelineTrainer",
    "load_pipeline_rank",
    "microbatch_scale",
    "refuse_unbuilt",
    "schedule_order",
]


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


def _shared_weights(
    plan: PipelinePlan, module: RankModule, place: tuple[int, int, int], rank: int, ledger: coll.Ledger, ordered: bool
) -> list[SharedWeight]:
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
    out: list[SharedWeight] = []
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
            out.append(SharedWeight(name, index[name], region, shapes[name], own, axis))
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
    model: str | Path | None,
    *,
    device: str,
    rank: int | None,
    ordered_sum: bool | None,
    loss: str | None,
    shared: Collection[str],
) -> PipelineTrainer:
    """This process's rank of the pipeline plan in ``plan_dir`` (torch.distributed initialized with the plan's
    number of ranks), for :func:`unity_eq.train.load_rank`, whose defaults and meanings the arguments have.
    ``loss``: how the model's first output becomes the loss (``loss_of``), which sets how microbatch losses are
    scaled."""
    plan = load_pipeline_dir(plan_dir)
    refuse_unbuilt(plan)
    check_world_size(plan_dir, plan.world_size, "pipeline plan", f" ({plan.describe()})")
    rank = dist.get_rank() if rank is None else rank
    source = source_model(model, str(plan.record.source))
    records = [read_explain_record(directory.path / "plan.json") for directory in plan.stages]
    stage, replica, tensor = plan.place_of(rank)
    record = records[stage]
    shapes = {name: tuple(spec.shape) for name, spec in records[0].model.inputs.items()}  # the microbatch
    refuse_ambiguous_pipeline(source, shapes, shared)
    weights, trainable, derived = source_weights(source, record, shapes, shared)
    ledger = coll.Ledger()
    torch_device, ordered = rank_device(device, rank, ordered_sum)
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
