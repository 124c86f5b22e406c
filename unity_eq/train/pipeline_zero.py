"""ZeRO 1-3 over a pipeline stage's replicas (plan.json ``chosen.zero``), as the stage search prices it
(``CostModel.zero_step_traffic``, ``zero_microbatch_traffic``; unity_eq.memory's ZeRO terms), with the same
code that runs ZeRO over an SPMD plan's data axis (unity_eq.train.zero).

=====  ====================================================================================================
level  on a stage's data axis (the same tensor rank of every replica of the stage), per step of ``m``
       microbatches
=====  ====================================================================================================
1      the replicas' gradients accumulate whole over the microbatches; in the optimizer's step one
       reduce-scatter and one all-gather per dtype (``ZeroOptimizer``)
2      after each microbatch's backward a reduce-scatter (the microbatch's gradients are then freed: a
       replica keeps only its shard of the sum); in the step one all-gather (``ZeroOptimizer``'s hook)
3      per microbatch an all-gather of the stage's weights for its forward, again for its backward, and a
       reduce-scatter of their gradients (``Zero3Module``; a recomputing stage's recomputation is the
       backward's gather)
=====  ====================================================================================================

**The stage plan's own weight-gradient all-reduces** (over a tensor group's axes) run once per step on the
accumulated gradients under ZeRO-0 and ZeRO-1 (``RankModule(defer_weight_sync=True)``), as the stage search
prices ``gradient_s``. Under ZeRO-2 and ZeRO-3 a replica never holds its whole accumulated gradient, so they run
per microbatch inside autograd, before the reduce-scatter (:func:`defers_weight_sync`): the gradients are the
same, the count is ``m`` times the stage search's (it prices them once per step whatever the ZeRO level), and
``check --training`` predicts what runs (``predicted_pipeline`` reads the module's deferred steps).

**Not run:** a weight that several stages train (a tied embedding) under ZeRO-2 or 3: its gradient is summed
over the stages after the last microbatch, on the whole gradient that ZeRO-2 and 3 no longer keep
(:func:`refuse_zero_shared`, before any rank starts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from unity_eq.collectives import torch_autograd as coll
from unity_eq.dtypes import is_float
from unity_eq.errors import PlanError
from unity_eq.planfile import ExplainRecord, WeightStepRecord
from unity_eq.train.recompute import Recomputed
from unity_eq.train.zero import Zero3Module, ZeroOptimizer

__all__ = ["defers_weight_sync", "priced_zero_bytes", "refuse_zero_shared", "stage_runner", "zero_bucket_bytes"]


def defers_weight_sync(level: int) -> bool:
    """Whether the stage plan's weight-gradient all-reduces wait for the last microbatch: only where a replica
    accumulates its whole gradient (ZeRO-0 and ZeRO-1)."""
    return level < 2


def stage_runner(
    module: torch.nn.Module, level: int, data: coll.AxisGroup | None, recompute: bool, ledger: coll.Ledger
) -> torch.nn.Module:
    """The module a stage's rank calls per microbatch: under ZeRO-3 a :class:`Zero3Module` over the stage's
    replicas (its recomputation inside, so the recomputed forward's gather is the backward's); otherwise the
    stage's module, recomputed or not (ZeRO-1/2 are the optimizer's: ``RankTrainer.optimizer``)."""
    if level == 3:
        assert data is not None
        return Zero3Module(module, data, recompute)
    return Recomputed(module, ledger) if recompute else module


def stage_sources(record: ExplainRecord) -> set[str]:
    """The source parameters a stage's plan trains: its loaded weights' ``sources`` (plan.json ``weights``);
    where the plan has no such section, each float weight of rank 1 or more by its own name."""
    out: set[str] = set()
    for step in record.steps:
        if isinstance(step, WeightStepRecord):
            weight = record.weights.get(step.name) if record.weights else None
            if weight is not None:
                out.update(weight.sources if weight.trainable else ())
                continue
            t = record.tensors[step.out]  # a plan without the section: the frontend's rule (docs/training.md)
            if is_float(t.dtype) and len(t.shape) > 0:
                out.add(step.name)
    return out


def refuse_zero_shared(path: object, level: int, replicas: int, records: Sequence[ExplainRecord]) -> None:
    """One PlanError, before any rank starts, for a weight several stages train under ZeRO-2 or ZeRO-3 over
    more than one replica: its gradient's sum over the stages needs the whole accumulated gradient, which those
    levels do not keep (module docstring)."""
    if level < 2 or replicas < 2:
        return
    seen: dict[str, int] = {}
    for index, record in enumerate(records):
        for name in sorted(stage_sources(record)):
            if name in seen and seen[name] != index:
                raise PlanError(
                    f"{path}: weight {name!r} is trained by stages {seen[name]} and {index}, and the plan shards "
                    f"gradients with ZeRO-{level} over its {replicas} replicas: summing a weight's gradient over "
                    "the stages needs its whole accumulated gradient, which ZeRO-2 and ZeRO-3 do not keep, so "
                    "pipeline training in the torch backend does not run it yet. Re-plan with `--zero 1` or "
                    "`--zero 0`."
                )
            seen.setdefault(name, index)


def zero_bucket_bytes(module: torch.nn.Module, optimizer: ZeroOptimizer | None) -> list[int]:
    """The bytes ZeRO shards on a stage's rank, one entry per dtype (the flat buffers it packs): what its
    reduce-scatters and all-gathers carry."""
    if isinstance(module, Zero3Module):
        return module.sharded.bucket_bytes()
    if optimizer is not None:
        return optimizer.sharded.bucket_bytes()
    return []


def priced_zero_bytes(record: ExplainRecord, buckets: Sequence[int]) -> list[int]:
    """The bytes each of ZeRO's collectives carries on a rank of a stage, as plan.json prices them: the stage
    plan's ``memory.gradient_bytes`` (its trainable weights, each source parameter once: what the stage
    search's ZeRO terms are priced on), where its trainable weights have one dtype, so that ``check
    --training`` compares the bytes the rank's buckets carry with the priced ones. Several dtypes (one bucket
    each), or a plan without the figure: ``buckets``, the rank's own (the count is still checked)."""
    usage = record.memory.usage if record.memory is not None else None
    dtypes = {
        record.tensors[step.out].dtype
        for step in record.steps
        if isinstance(step, WeightStepRecord)
        and (not record.weights or (step.name in record.weights and record.weights[step.name].trainable))
    }
    if usage is None or usage.gradient_bytes is None or len(dtypes) != 1 or len(buckets) != 1:
        return list(buckets)
    return [round(usage.gradient_bytes)]
