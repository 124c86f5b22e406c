"""Loading this process's rank of a plan directory, either kind of plan: :func:`load_rank`, the Python API's
entry (``unity_eq.train.load_rank``), which ``train`` and ``check --training`` call. It sits above
:mod:`unity_eq.train.session` (an SPMD rank's trainer) and :mod:`unity_eq.train.pipeline` (a pipeline rank's),
and asks which kind of plan it has once."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch
import torch.distributed as dist

from unity_eq.collectives import torch_autograd as coll
from unity_eq.errors import OptionError
from unity_eq.runtime.pipeline import is_pipeline_dir
from unity_eq.train.pipeline import load_pipeline_rank
from unity_eq.train.rank import RankModule
from unity_eq.train.recompute import Recomputed
from unity_eq.train.session import (
    RankTrainer,
    check_world_size,
    make_groups,
    rank_device,
    read_training_plan,
    source_model,
    zero_data_axis,
)
from unity_eq.train.weights import source_weights
from unity_eq.train.zero import Zero3Module, check_level
from unity_eq.train.zero_plan import zero_sharding

__all__ = ["load_rank"]


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
    """This process's rank of ``plan_dir``, either kind of plan (torch.distributed must be initialized, with the
    plan's number of ranks): an SPMD plan's :class:`RankTrainer`, or a pipeline plan's
    :class:`~unity_eq.train.pipeline.PipelineTrainer` (:func:`~unity_eq.train.pipeline.load_pipeline_rank`).
    ``model``: the source ONNX model whose weights start training (default: plan.json's
    ``model.source``). ``zero``: ZeRO level 1-3 over the mesh axis ``zero_axis`` (the data axis; default the
    mesh's only axis), in place of the plan's gradient all-reduces of the weights on that axis;
    ``recompute``: the forward checkpointed (its activations recomputed in the backward). On an SPMD plan both
    are set by the caller (docs/training.md); a pipeline plan carries its own choice (plan.json ``chosen``),
    and either given for one is an OptionError. ``loss`` (``sum``/``mean``, as for
    :func:`~unity_eq.train.session.loss_of`) decides how a pipeline plan's microbatch losses are scaled.
    ``shared``: weights the source model really shares, which look merged by the exporter
    (:func:`~unity_eq.train.weights.refuse_merged`)."""
    if is_pipeline_dir(plan_dir):
        if zero or recompute:
            raise OptionError(
                f"{plan_dir} is a pipeline plan: its ZeRO level and recomputation are plan.json's choice "
                "(`chosen.zero`, `chosen.recompute`); `--zero`/`--recompute` apply to SPMD plans only."
            )
        return load_pipeline_rank(
            plan_dir, model, device=device, rank=rank, ordered_sum=ordered_sum, loss=loss, shared=shared
        )
    if not dist.is_initialized():
        raise OptionError("torch.distributed is not initialized: start the ranks with torchrun, or call "
                          "torch.distributed.init_process_group first.")  # fmt: skip
    record = read_training_plan(plan_dir)
    check_world_size(plan_dir, len(record.mesh.ranks), "plan")
    axis = zero_data_axis(record, check_level(zero), zero_axis)
    rank = dist.get_rank() if rank is None else rank
    source = source_model(model, record.model.source)
    weights, trainable, derived = source_weights(source, record, shared=shared)
    ledger = coll.Ledger()
    torch_device, ordered = rank_device(device, rank, ordered_sum)
    groups = make_groups(record, rank, ledger, ordered)
    if axis and not record.weights:
        raise OptionError(
            f"ZeRO-{zero}: {plan_dir}/plan.json has no `weights` section (an older unity-eq wrote it), which "
            "tells the source parameters from the weights folded from them; ZeRO shards only the parameters the "
            "plan sums over its axis. Re-run `unity-eq optimize` to write it, or train without `--zero`."
        )
    sharding = zero_sharding(record, axis) if axis else None
    if sharding is not None and not sharding.params:
        raise OptionError(
            f"ZeRO-{zero} on axis {axis!r}: no weight of {plan_dir} is data-parallel on that axis (each is split "
            "on it, or read whole after a combine), so there is no state to shard. Train without `--zero`, or "
            "pick the data axis with `--zero-axis`."
        )
    # the weight-gradient all-reduces in the cost model's buckets, from hooks on the parameters (ZeRO-3 runs the
    # module on gathered copies of them, which the hooks would not see: its all-reduces stay in autograd)
    plan_module = RankModule(
        record,
        rank,
        weights,
        trainable,
        groups,
        torch_device,
        derived,
        (sharding.params, sharding.replicates) if sharding is not None else None,
        bucket_weight_sync=zero != 3,
    )
    group = groups.get(axis) if axis else None
    module: torch.nn.Module = plan_module
    if zero == 3:
        assert group is not None
        module = Zero3Module(plan_module, group, recompute, keep=plan_module.zero_split()[1])
    elif recompute:
        module = Recomputed(plan_module, ledger)
    return RankTrainer(record, rank, module, ledger, torch_device, plan_module, zero, group)
