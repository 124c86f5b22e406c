"""A stage search's result as plan.json records it (:class:`~unity_eq.planfile.pipeline.PipelinePlanRecord`)."""

from __future__ import annotations

from unity_eq.cost import Objective
from unity_eq.ir import Graph
from unity_eq.machine import Machine
from unity_eq.planfile import PLAN_FORMAT_VERSION
from unity_eq.planfile.pipeline import (
    PIPELINE_PLAN,
    ConfigRecord,
    PipelinePlanRecord,
    StageRecord,
    StageSearchRecord,
)
from unity_eq.stages.pieces import PieceTable
from unity_eq.stages.search import StagePlan, StageSearch, side_receives
from unity_eq.version import __version__

__all__ = ["config_record", "pipeline_record"]


def config_record(plan: StagePlan) -> ConfigRecord:
    c = plan.config
    return ConfigRecord(
        tensor=c.tensor,
        stages=c.stages,
        data=c.data,
        microbatch=c.microbatch,
        microbatches=c.microbatches,
        schedule=c.schedule,
        recompute=c.recompute,
        zero=c.zero,
        order=c.order,
        policy=c.policy,
        step_s=plan.step_s,
        pipeline_s=plan.pipeline_s,
        sync_s=plan.sync_s,
        bubble=plan.bubble,
        peak_bytes=plan.peak_bytes,
        fits=plan.fits,
    )


def _ranges(ranks: list[int], shown: int = 4) -> str:
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    text = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:shown]]
    more = f", … ({len(runs) - shown} more)" if len(runs) > shown else ""
    return ", ".join(text) + more


def pipeline_record(
    found: StageSearch,
    table: PieceTable,
    graph: Graph,
    machine: Machine,
    objective: Objective,
    batch: int,
    seconds: float,
    micro_sizes: tuple[int, ...],
    static_batch: int | None = None,
) -> PipelinePlanRecord:
    best = found.best
    pieces = table.pieces
    stages = []
    receives = side_receives(pieces, best.cuts)
    later = set().union(*receives)
    for s, (i, j) in enumerate(best.cuts):
        stages.append(
            StageRecord(
                index=s,
                pieces=(i, j),
                first_node=pieces[i].nodes[0].name,
                last_node=pieces[j - 1].nodes[-1].name,
                receives=pieces[i].stream_in,
                sends=pieces[j - 1].stream_out,
                side_receives=receives[s],
                side_sends=tuple(name for name in pieces[0].side_out if name in later) if s == 0 else (),
                ranks=_ranges(list(best.devices[s])),
                device=machine.devices[best.devices[s][0]].name,
                recomputes=best.recomputed[s] if best.recomputed else False,
                seconds=best.stage_s[s],
                **best.memory[s].byte_fields(),
            )
        )
    return PipelinePlanRecord(
        format_version=PLAN_FORMAT_VERSION,
        plan=PIPELINE_PLAN,
        unity_eq_version=__version__,
        model=graph.name,
        source=graph.source,
        fingerprint=graph.fingerprint or None,
        objective=objective.name,
        batch=batch,
        machine=machine.name,
        devices=machine.device_count,
        nodes=machine.node_count,
        capacity_bytes=best.capacity,
        chosen=config_record(best),
        stages=tuple(stages),
        without_pipeline=config_record(found.best_flat) if found.best_flat else None,
        search=StageSearchRecord(
            evaluated=found.evaluated,
            fitting=found.fitting,
            saturations=len(table.options),
            enodes=table.enodes,
            pieces=len(pieces),
            distinct_pieces=len({p.signature for p in pieces}),
            microbatch_sizes=micro_sizes,
            group_sizes=tuple(sorted({t for t, _, _ in table.options})),
            seconds=seconds,
            static_batch=static_batch,
        ),
    )
