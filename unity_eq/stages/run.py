"""``optimize --pipeline``: load the model at each microbatch size, price its pieces, search the stage
configurations and write the pipeline plan's plan.json.

The model's batch is dimension 0 of every input. When the ONNX model declares it dynamic, the pieces are priced
at microbatches of 1, 2 and 4 samples (those that divide the batch per replica); when it is static, the
model's own batch is the microbatch and ``batch`` (the samples per step) says how many there are.
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
from unity_eq.ir import Graph
from unity_eq.machine import Machine
from unity_eq.planfile.pipeline import PipelinePlanRecord, write_pipeline_json
from unity_eq.rulesets import RuleFile
from unity_eq.search.meshes import device_groups
from unity_eq.split import split_graph
from unity_eq.stages.arithmetic import Forced, refuse_impossible
from unity_eq.stages.pieces import GraphAt, PieceTable, price_pieces
from unity_eq.stages.record import pipeline_record
from unity_eq.stages.search import StageFilter, StageSearch, group_sizes, stage_search

__all__ = ["DEFAULT_MICROBATCHES", "PipelineResult", "graph_at_batch", "plan_stages"]

DEFAULT_MICROBATCHES = (1, 2, 4)
Say = Callable[[str], None]


@dataclass
class PipelineResult:
    record: PipelinePlanRecord
    search: StageSearch
    table: PieceTable
    plan_dir: Path | None
    seconds: float


def _declared_shapes(path: Path) -> dict[str, list[int | None]]:
    """Each graph input's declared dimensions (an int when static, None when dynamic)."""
    model = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    shapes: dict[str, list[int | None]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if not dims:
            raise OptionError(f"{path}: input {value.name!r} has no dimension 0 to split into microbatches.")
        shapes[value.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    return shapes


def graph_at_batch(
    path: Path, input_shapes: Mapping[str, Sequence[int]] | None, batch: int | None
) -> tuple[GraphAt, int, tuple[int, ...]]:
    """The model at a given microbatch size, the batch per step, and the microbatch sizes to try."""
    from unity_eq.frontends.onnx import load_onnx

    overrides = {n: tuple(s) for n, s in (input_shapes or {}).items()}
    declared = _declared_shapes(path)
    firsts = {name: dims[0] for name, dims in declared.items()}
    if all(first is not None for first in firsts.values()):
        own = set(firsts.values())
        if len(own) != 1:
            raise OptionError(
                f"{path}: dimension 0 of the inputs differs ({sorted(map(str, own))}): `--pipeline` splits dimension "
                "0 of every input into microbatches, so it must be the batch on all of them."
            )
        (micro,) = own
        assert micro is not None
        graph = load_onnx(path, overrides)
        per_step = batch or micro
        if per_step % micro:
            raise OptionError(
                f"`--batch` {per_step} is not a multiple of the model's batch {micro} (dimension 0 of its inputs, "
                "static): that is the microbatch. Pass a multiple, or export the model with a dynamic batch axis."
            )
        return (lambda _micro: graph), per_step, (micro,)
    if any(first is not None for first in firsts.values()):
        raise OptionError(
            f"{path}: dimension 0 is static on some inputs and dynamic on others: `--pipeline` needs it to be the "
            "batch on every input."
        )
    if batch is None:
        given = {overrides[n][0] for n in declared if n in overrides}
        if len(given) != 1:
            raise OptionError("`--pipeline` with a dynamic batch dimension: pass `--batch N` (samples per step).")
        (batch,) = given

    def rest(name: str) -> tuple[int, ...]:
        dims = overrides[name][1:] if name in overrides else tuple(declared[name][1:])
        if any(d is None for d in dims):
            raise OptionError(f"input {name!r} has dynamic dimensions besides the batch: fix them with --input-shape.")
        return tuple(int(d) for d in dims if d is not None)

    def graph_at(micro: int) -> Graph:
        return load_onnx(path, {name: (micro, *rest(name)) for name in declared})

    return graph_at, batch, tuple(m for m in DEFAULT_MICROBATCHES if batch % m == 0)


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
) -> PipelineResult:
    """Price the pieces, search the configurations (those ``only`` admits), and (with ``output_dir``) write
    plan.json atomically. A forced tensor-group size is the only one priced (its pieces saturated alone)."""
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
    say(f"stage search: pricing pieces on tensor groups of {sizes} at microbatches {list(micro)}")
    table = price_pieces(graph_at, micro, sizes, machine, objective, rules, limits, say=say, groups=groups)
    found = stage_search(table, machine, objective, batch, micro, only)
    seconds = time.perf_counter() - start
    record = pipeline_record(found, table, graph_at(micro[0]), machine, objective, batch, seconds, micro)
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
