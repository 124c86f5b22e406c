"""One mesh tried by the search (its saturation, extractions and verdict), and how trials are shown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from unity_eq.egraph import Encoding, SaturationResult
from unity_eq.extract import Extraction
from unity_eq.ir import Mesh
from unity_eq.memory import MemoryUsage
from unity_eq.plan import Plan
from unity_eq.planfile import AxisRecord, TrialSecondsRecord, TriedRecord

Say = Callable[[str], None]


class TrialStatus(StrEnum):
    """What became of a mesh: queued, a plan that fits, nothing fits, not run (why in ``reason``), or its
    saturation failed. The value is plan.json's ``mesh_search.tried[].status``."""

    PENDING = "pending"
    OK = "ok"
    INFEASIBLE = "infeasible"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class MeshTrial:
    """One mesh of the search and what became of it."""

    mesh: Mesh
    axes: tuple[AxisRecord, ...]  # how each axis sits on the machine
    status: TrialStatus = TrialStatus.PENDING
    reason: str = ""
    plan: Plan | None = None
    memory: MemoryUsage | None = None
    extraction: str = ""
    penalty_rounds: int = 0
    penalty: float = 0.0
    enodes: int = 0
    stop_reason: str = ""
    saturate_s: float = 0.0
    extract_s: float = 0.0
    saturation: SaturationResult | None = None
    encoding: Encoding | None = None
    extractions: list[tuple[Extraction, MemoryUsage]] = field(default_factory=list)
    min_memory: MemoryUsage | None = None
    candidate: bool = True  # False for a mesh evaluated only for a baseline (under `--mesh`)
    scope: str = ""  # the devices of a mesh over part of the machine (``devices 0-3``); "" for all of them
    device_kind: str = ""  # their kind, with scope
    egraph_of: str = ""  # the mesh whose e-graph it reuses (the one-device plan), instead of saturating its own

    @property
    def label(self) -> str:
        return mesh_label(self.mesh) + (f" on {self.scope}" if self.scope else "")

    def to_record(self) -> TriedRecord:
        """As plan.json's ``mesh_search.tried`` lists it."""
        cost = self.plan.cost if self.plan is not None else None
        ran = self.status in (TrialStatus.OK, TrialStatus.INFEASIBLE, TrialStatus.FAILED) or bool(self.saturate_s)
        return TriedRecord(
            mesh=self.label,
            axes=self.axes,
            status=self.status.value,
            devices=self.scope.split(" ", 1)[1] if self.scope else None,
            device_count=self.mesh.size if self.scope else None,
            device_kind=self.device_kind if self.scope else None,
            reason=self.reason,
            cost_s=cost.total if cost is not None else None,
            compute_s=cost.compute if cost is not None else None,
            communication_s=cost.comm if cost is not None else None,
            extraction=self.extraction if cost is not None else None,
            memory_bytes=self.memory.total if self.memory is not None else None,
            min_memory_bytes=(
                self.min_memory.total if self.min_memory is not None and self.status == TrialStatus.INFEASIBLE else None
            ),
            enodes=self.enodes if ran else None,
            stop_reason=self.stop_reason if ran else None,
            penalty_rounds=self.penalty_rounds if ran else None,
            seconds=TrialSecondsRecord(saturate=round(self.saturate_s, 3), extract=round(self.extract_s, 3))
            if ran
            else None,
            egraph_of=self.egraph_of,
            baseline_only=not self.candidate,
        )


def mesh_label(mesh: Mesh) -> str:
    return ",".join(f"{a}={n}" for a, n in zip(mesh.axes, mesh.sizes, strict=True))


def trial_row(trial: MeshTrial) -> str:
    """The progress row of a mesh (``mesh x=2,y=4``)."""
    return f"mesh {trial.label}"
