"""``optimize --pipeline``: load the model at each microbatch size, price its pieces, search the stage
configurations and write the pipeline plan's plan.json.

The model's batch is dimension 0 of every input. When the ONNX model declares it dynamic, the pieces are priced
at every microbatch size that divides a replica's batch (each distinct piece saturated once per tensor-group
size and microbatch); when it is static, the model's own batch is the microbatch and ``batch`` (the samples
per step) says how many there are: the summary and explain say so (``search.static_batch_note``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from unity_eq.cost import Objective
from unity_eq.egraph import Limits
from unity_eq.errors import OptionError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.ir import Graph, divisors
from unity_eq.machine import Machine
from unity_eq.planfile.pipeline import PipelinePlanRecord, write_pipeline_json
from unity_eq.rulefile.manifest import RuleFile
from unity_eq.search.meshes import device_groups
from unity_eq.split import split_graph
from unity_eq.stages.arithmetic import Forced, refuse_impossible
from unity_eq.stages.pieces import GraphAt, PieceTable, price_pieces
from unity_eq.stages.record import pipeline_record
from unity_eq.stages.search import StageFilter, StageSearch, group_sizes, priced_pairs, stage_search, static_batch_note

__all__ = ["BatchedModel", "PipelineResult", "batch_blocker", "graph_at_batch", "plan_stages"]

Say = Callable[[str], None]


@dataclass(frozen=True)
class PipelineResult:
    record: PipelinePlanRecord
    search: StageSearch
    table: PieceTable
    plan_dir: Path | None
    seconds: float


@dataclass(frozen=True)
class BatchedModel:
    """The model as the stage search sees it: at any microbatch size, the samples per step, the microbatch
    sizes to try, and the model's own batch when it is static (then the only microbatch)."""

    graph_at: GraphAt
    batch: int
    micro_sizes: tuple[int, ...]
    static_batch: int | None = None


def _declared_shapes(path: Path) -> dict[str, list[int | None]]:
    """Each graph input's declared dimensions (an int when static, None when dynamic)."""
    model = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    shapes: dict[str, list[int | None]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    return shapes


def batch_blocker(path: Path) -> str | None:
    """Why dimension 0 of the model's inputs cannot be its batch (then it cannot be cut into microbatches), or
    None when it can: the training search then plans the model without a pipeline, ``--pipeline`` refuses."""
    declared = _declared_shapes(path)
    for name, dims in declared.items():
        if not dims:
            return f"{path}: input {name!r} has no dimension 0 to split into microbatches."
    firsts = {dims[0] for dims in declared.values()}
    if None in firsts and len(firsts) > 1:
        return (
            f"{path}: dimension 0 is static on some inputs and dynamic on others: a pipeline needs it to be the "
            "batch on every input."
        )
    if len(firsts) > 1:
        return (
            f"{path}: dimension 0 of the inputs differs ({sorted(map(str, firsts))}): a pipeline splits dimension "
            "0 of every input into microbatches, so it must be the batch on all of them."
        )
    return None


def graph_at_batch(
    path: Path,
    input_shapes: Mapping[str, Sequence[int]] | None,
    batch: int | None,
    parameters: Mapping[str, Sequence[str]] | None = None,
) -> BatchedModel:
    """The model at a given microbatch size, the batch per step, and the microbatch sizes to try: with a dynamic
    batch, every divisor of the batch (those that divide a replica's batch are priced); with a static one, the
    model's own batch. OptionError when dimension 0 is not a batch (:func:`batch_blocker`), when a dynamic
    batch is given no size, or when ``batch`` is not a multiple of a static one."""
    from unity_eq.frontends.onnx import load_onnx as load_model

    def load_onnx(where: Path, shapes: Mapping[str, Sequence[int]]) -> Graph:
        graph = load_model(where, shapes)
        return graph if parameters is None else graph.with_parameters(parameters)  # optimize --parameters

    blocker = batch_blocker(path)
    if blocker is not None:
        raise OptionError(blocker)
    overrides = {n: tuple(s) for n, s in (input_shapes or {}).items()}
    declared = _declared_shapes(path)
    (micro,) = {dims[0] for dims in declared.values()} or {None}
    if micro is not None:
        graph = load_onnx(path, overrides)
        per_step = batch or micro
        if per_step % micro:
            raise OptionError(
                f"`--batch` {per_step}: {static_batch_note(micro)}. With this export, pass a multiple of {micro}."
            )
        return BatchedModel(lambda _micro: graph, per_step, (micro,), micro)
    clashing = sorted(n for n in declared if n in overrides and batch is not None and overrides[n][:1] != (batch,))
    if clashing:
        shown = "x".join(map(str, overrides[clashing[0]]))
        raise OptionError(
            f"`--batch {batch}` and `--input-shape {clashing[0]}={shown}` disagree on the batch (samples per step): "
            f"give it once, with `--batch`, or write {batch} as the first dim of `--input-shape`."
        )
    if batch is None:
        given = {overrides[n][0] for n in declared if n in overrides}
        if len(given) != 1:
            raise OptionError(
                "the model's batch dimension is dynamic: pass `--batch N` (samples per step) to plan its training "
                "or a pipeline."
            )
        (batch,) = given

    def rest(name: str) -> tuple[int, ...]:
        dims = overrides[name][1:] if name in overrides else tuple(declared[name][1:])
        if any(d is None for d in dims):
            raise OptionError(f"input {name!r} has dynamic dimensions besides the batch: fix them with --input-shape.")
        return tuple(int(d) for d in dims if d is not None)

    def graph_at(micro: int) -> Graph:
        return load_onnx(path, {name: (micro, *rest(name)) for name in declared})

    return BatchedModel(graph_at, batch, tuple(divisors(batch)))


def plan_stages(
    graph_at: GraphAt,
    batch: int,
    micro_sizes: Sequence[int],
    machine: Machine,
    objective: Objective,
    rules: list[RuleFile],
    limits: Limits | None = None,
    output_dir: Path | None = None,
    say: Say | None = None,
    only: StageFilter | None = None,
    *,
    min_stages: int = 1,
    static_batch: int | None = None,
    extractor: str = "greedy",
) -> PipelineResult:
    """Price the pieces, search the configurations (those ``only`` admits), and (with ``output_dir``) write
    plan.json atomically. A forced tensor-group size is the only one priced (its pieces saturated alone).
    ``min_stages``: price only the (tensor group, microbatch) pairs of layouts with at least that many stages
    (the training search gives one stage to the SPMD search); one-stage configurations whose pairs were priced
    anyway still make ``without_pipeline``. ``static_batch``: the model's own batch when it is static, named in
    errors. ``extractor``: ``differentiable`` (or ``ilp``) adds each piece's differentiable extraction to its
    options (unity_eq.stages.pieces). Raises OptionError when no layout has ``min_stages`` stages
    (``search.layouts``)."""
    say = say or (lambda _m: None)
    start = time.perf_counter()
    if output_dir is not None:
        check_output_dir(output_dir)
    micro = tuple(sorted({m for m in micro_sizes if batch % m == 0}))
    if not micro:
        raise OptionError(f"no microbatch size among {list(micro_sizes)} divides the batch {batch}.")
    sizes = group_sizes(machine)
    if only is not None and only.tensor is not None:
        if only.tensor not in sizes:
            raise OptionError(
                f"`--tensor` {only.tensor}: a tensor group stays inside a node, so its size divides a node's "
                f"devices; on {machine.name} that is one of {sizes}."
            )
        sizes = [only.tensor]
    groups = device_groups(machine)
    _refuse_impossible(graph_at, micro, sizes, groups, batch, only)
    pairs = priced_pairs(sizes, groups, batch, micro, min_stages)
    if not pairs:
        raise OptionError(
            f"no layout of {machine.device_count} devices into at least {min_stages} stage(s) divides a batch of "
            f"{batch}" + (f" ({static_batch_note(static_batch)})" if static_batch is not None else "") + "."
        )
    shown = ", ".join(f"{t}×{b}" for t, b in pairs)
    say(f"stage search: pricing pieces at {len(pairs)} (tensor group × microbatch) sizes: {shown}")
    table = price_pieces(
        graph_at,
        micro,
        sizes,
        machine,
        objective,
        rules,
        limits,
        say=say,
        groups=groups,
        pairs=pairs,
        extractor=extractor,
    )
    found = stage_search(table, machine, objective, batch, micro, only, static_batch, min_stages)
    seconds = time.perf_counter() - start
    priced = tuple(sorted({b for _, b in pairs}))
    graph = graph_at(priced[0])
    record = pipeline_record(found, table, graph, machine, objective, batch, seconds, priced, static_batch)
    plan_dir = None
    if output_dir is not None:
        with plan_tempdir(output_dir) as tmp:
            write_pipeline_json(tmp / "plan.json", record)
            replace_plan_files(tmp, output_dir)
        plan_dir = output_dir
    return PipelineResult(record, found, table, plan_dir, seconds)


def _refuse_impossible(
    graph_at: GraphAt,
    micro: Sequence[int],
    sizes: Sequence[int],
    groups: Sequence[Sequence[int]],
    batch: int,
    only: StageFilter | None,
) -> None:
    """Refuse what the counts alone rule out (stages beyond the pieces or the devices, microbatches that do not
    divide the batch, more devices than pieces × batch × a node can use) before any piece is saturated: the
    split is cheap, pricing is not. A model that does not split is left to :func:`price_pieces` to refuse."""
    split = split_graph(graph_at(micro[0]))
    if split is None:
        return
    forced = Forced(only.stages, only.tensor, only.microbatches) if only is not None else Forced()
    refuse_impossible(forced, [len(g) for g in groups], sizes, len(split.pieces), batch, micro)
