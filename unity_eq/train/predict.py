"""The collectives and sends plan.json predicts one training step issues on a rank, which ``check --training``
holds the ranks' ledgers against (docs/training.md, "What plan.json prices"): an SPMD plan's from its plan.json
alone (:func:`predicted_collectives`), a pipeline rank's from its stage's plan and the pipeline's
(:func:`predicted_pipeline`). Each is ``(kind, axis, phase) -> [count, bytes per rank]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from unity_eq.collectives.registry import BY_RECORD_KIND, backward_kind
from unity_eq.dtypes import is_float
from unity_eq.planfile import CollectiveStepRecord, ExplainRecord
from unity_eq.runtime.pipeline import PipelinePlan
from unity_eq.train.pipeline import recomputes
from unity_eq.train.pipeline_trainer import DATA_AXIS, PIPELINE_AXIS, STAGES_AXIS

__all__ = ["Key", "predicted_collectives", "predicted_p2p", "predicted_pipeline", "predicted_spmd", "priced_gradless"]

Key = tuple[str, str, str]  # (kind, axis, phase)


def _local_bytes(record: ExplainRecord, tid: str) -> int:
    return record.tensors[tid].local_bytes


def predicted_collectives(
    record: ExplainRecord,
    skip: set[str] = frozenset(),  # type: ignore[assignment]
    zero: int = 0,
    zero_axis: str | None = None,
    recompute: bool = False,
) -> dict[Key, list[int]]:
    """The collectives plan.json prices for one training step on every rank: (kind, axis, phase) -> [count,
    bytes per rank]. A combine is a forward all-gather, a reduce a forward all-reduce; a partition or replicate
    whose step has a communication price is a backward all-gather or all-reduce (phase ``gradient`` for a
    replicate of a tensor no model input flows into: a weight's gradient sync). ``skip``: steps whose backward
    carries no gradient at run time (priced, not needed).

    ``zero``: ZeRO over ``zero_axis`` replaces the data-parallel weights' gradient all-reduces on that axis
    (:func:`unity_eq.train.zero_plan.zero_sharding`) by its own collectives on the same bytes
    (unity_eq.train.zero.zero_collectives, as the cost model prices them);
    ``recompute``: the forward's collectives again, in phase ``recompute`` (a recomputed forward repeats them, as
    the stage search prices it)."""
    from unity_eq.train.rank import depends_on_inputs
    from unity_eq.train.zero import zero_collectives
    from unity_eq.train.zero_plan import zero_sharding

    sizes = dict(zip(record.mesh.axes, record.mesh.sizes, strict=True))
    from_inputs = depends_on_inputs(record.steps)
    zeroed = zero_sharding(record, zero_axis).replicates if zero and zero_axis is not None else frozenset()
    sharded: dict[str, int] = {}  # dtype -> bytes of the weight gradients ZeRO reduce-scatters
    out: dict[Key, list[int]] = {}

    def add(key: Key, nbytes: int) -> None:
        if sizes[key[1]] > 1:
            entry = out.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += nbytes

    for step in record.steps:
        if not isinstance(step, CollectiveStepRecord):
            continue
        kind = BY_RECORD_KIND[step.KIND]
        if kind.communicates:  # a forward collective on the result's bytes (combine, reduce)
            add((kind.name, step.axis, "forward"), _local_bytes(record, step.out))
            continue
        back = backward_kind(kind)
        if back is None or not (step.communication_s or 0) > 0 or step.out in skip:
            continue
        if step.out in zeroed:  # a data-parallel weight's gradient: ZeRO sums it (unity_eq.train.zero_plan)
            dtype = record.tensors[step.src].dtype
            sharded[dtype] = sharded.get(dtype, 0) + _local_bytes(record, step.src)
            continue
        source = "activation" if step.src in from_inputs else "weight"
        add((back.name, step.axis, kind.phase(source) or "backward"), _local_bytes(record, step.src))
    if recompute:
        for (name, axis, phase), (count, nbytes) in list(out.items()):
            if phase == "forward":
                out[(name, axis, "recompute")] = [count, nbytes]
    if zero and zero_axis is not None and sizes[zero_axis] > 1:
        for key, (count, nbytes) in zero_collectives(zero, zero_axis, list(sharded.values())).items():
            entry = out.setdefault(key, [0, 0])
            entry[0] += count
            entry[1] += nbytes
    return out


def predicted_spmd(
    record: ExplainRecord,
    gradless: set[str],
    bucketed: Mapping[str, str],
    zero: int = 0,
    zero_axis: str | None = None,
    recompute: bool = False,
) -> dict[Key, list[int]]:
    """What one training step of an SPMD plan issues on every rank, as plan.json prices it: its collectives
    (:func:`predicted_collectives`), except the weight-gradient all-reduces the ranks issue in buckets
    (``bucketed``: replicate step -> axis, ``RankModule.deferred``), which plan.json prices weight by weight and
    are packed into the cost model's buckets the same way (:func:`unity_eq.train.buckets.deferred_collectives`)."""
    from unity_eq.train.buckets import deferred_collectives

    out = predicted_collectives(record, gradless | set(bucketed), zero, zero_axis, recompute)
    for axis, (count, nbytes) in deferred_collectives(record, bucketed).items():
        entry = out.setdefault(("all_reduce", axis, "gradient"), [0, 0])
        entry[0] += count
        entry[1] += nbytes
    return out


def priced_gradless(record: ExplainRecord, gradless: set[str]) -> list[str]:
    """Steps plan.json prices a gradient collective for where no gradient flows (a model input or a constant)."""
    return [
        f"{s.KIND} {s.out} ({s.src})"
        for s in record.steps
        if isinstance(s, CollectiveStepRecord)
        and backward_kind(BY_RECORD_KIND[s.KIND]) is not None
        and s.out in gradless
        and (s.communication_s or 0) > 0
    ]


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _output_spec(record: ExplainRecord, name: str) -> tuple[tuple[int, ...], str]:
    out = record.model.outputs[name]
    return tuple(out.shape), out.dtype


def predicted_p2p(plan: PipelinePlan, records: Sequence[ExplainRecord], stage: int) -> dict[Key, list[int]]:
    """The sends and receives of one step on a rank of ``stage``, from plan.json: per microbatch, the activation
    to the next stage and its gradient back, from the previous stage likewise, and stage 0's side tensors to
    every later stage that reads them."""
    m = plan.microbatches
    out: dict[Key, list[int]] = {}

    def add(kind: str, phase: str, nbytes: int) -> None:
        entry = out.setdefault((kind, PIPELINE_AXIS, phase), [0, 0])
        entry[0] += m
        entry[1] += m * nbytes

    stages = plan.record.stages
    here = stages[stage]
    if here.sends is not None:
        shape, dtype = _output_spec(records[stage], here.sends)
        add("send", "forward", _nbytes(shape, dtype))
        if is_float(dtype):
            add("recv", "backward", _nbytes(shape, dtype))
    if here.receives is not None:
        spec = records[stage].model.inputs[here.receives]
        add("recv", "forward", _nbytes(spec.shape, spec.dtype))
        if is_float(spec.dtype):
            add("send", "backward", _nbytes(spec.shape, spec.dtype))
    for name in here.side_receives:
        spec = records[stage].model.inputs[name]
        add("recv", "side", _nbytes(spec.shape, spec.dtype))
    if stage == 0:
        for later in stages[1:]:
            for name in later.side_receives:
                shape, dtype = _output_spec(records[0], name)
                add("send", "side", _nbytes(shape, dtype))
    return out


def predicted_pipeline(
    plan: PipelinePlan,
    records: Sequence[ExplainRecord],
    stage: int,
    gradless: set[str],
    deferred: Mapping[str, str],
    params: Sequence[tuple[str, int, str]],
    shared: Sequence[tuple[str, int]] = (),
    zero: int = 0,
    dtype_bytes: Sequence[int] = (),
) -> dict[Key, list[int]]:
    """What one step on a rank of ``stage`` issues, as plan.json prices it: the stage plan's collectives
    (:func:`predicted_collectives`) once per microbatch, except its weight-gradient all-reduces (``deferred``:
    replicate step → axis), once per step in buckets (:func:`unity_eq.train.buckets.deferred_collectives`); the
    data-axis all-reduce of the parameters (``params``: name, bytes, dtype, in the stage's parameter order;
    plan.json prices its time, ``sync_s``, not a count) in buckets, with more than one replica; the sum over the
    stages of each weight several stages train (``shared``: name, bytes of the whole weight; plan.json does not
    price it: ``check --training`` notes it); the point-to-point traffic (:func:`predicted_p2p`). A recomputing
    stage (:func:`unity_eq.train.pipeline.recomputes`) issues its forward's collectives again (phase
    ``recompute``); under ZeRO (``zero``) the data-axis all-reduces are ZeRO's reduce-scatters and all-gathers
    per dtype (``dtype_bytes``: the stage's parameters' bytes per dtype), as
    :func:`unity_eq.train.zero.zero_collectives` prices them for ``m`` microbatches (level 1: one of each per
    step; 2: a reduce-scatter per microbatch, an all-gather per step; 3: per microbatch a forward and a backward
    all-gather and a reduce-scatter). Under ZeRO-2 and 3 the stage plan's weight-gradient all-reduces run per
    microbatch (``deferred`` is empty: unity_eq.train.pipeline_zero)."""
    from unity_eq.train.buckets import bucket_collectives, deferred_collectives
    from unity_eq.train.zero import zero_collectives

    record = records[stage]
    m = plan.microbatches
    again = recomputes(plan, stage)
    issued = predicted_collectives(record, gradless | set(deferred), recompute=again)
    out = {k: [c * m, b * m] for k, (c, b) in issued.items()}
    for axis, (count, nbytes) in deferred_collectives(record, deferred).items():
        entry = out.setdefault(("all_reduce", axis, "gradient"), [0, 0])
        entry[0] += count
        entry[1] += nbytes
    if plan.replicas > 1 and zero:
        for key, (count, nbytes) in zero_collectives(zero, DATA_AXIS, dtype_bytes, m).items():
            entry = out.setdefault(key, [0, 0])
            entry[0] += count
            entry[1] += nbytes
    elif plan.replicas > 1 and params:
        entry = out.setdefault(("all_reduce", DATA_AXIS, "gradient"), [0, 0])
        count, nbytes = bucket_collectives([(dtype, nbytes) for _, nbytes, dtype in params])
        entry[0] += count
        entry[1] += nbytes
    for _, nbytes in shared:
        entry = out.setdefault(("all_reduce", STAGES_AXIS, "gradient"), [0, 0])
        entry[0] += 1
        entry[1] += nbytes
    for key, value in predicted_p2p(plan, records, stage).items():
        out[key] = value
    return out
