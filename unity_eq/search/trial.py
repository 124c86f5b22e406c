"""One mesh tried by the search (its saturation, extractions and verdict), and how trials are shown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from unity_eq.egraph import Encoding, SaturationResult
from unity_eq.extract import Extraction
from unity_eq.ir import Mesh
from unity_eq.memory import MemoryUsage
from unity_eq.plan import Plan

Say = Callable[[str], None]


@dataclass
class MeshTrial:
    """One mesh of the search and what became of it."""

    mesh: Mesh
    axes: list[dict[str, Any]]
    status: str = "pending"  # ok, infeasible (nothing fits), skipped, failed
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

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"mesh": self.label, "axes": self.axes, "status": self.status}
        if self.scope:
            entry["devices"] = self.scope.split(" ", 1)[1]
            entry["device_count"] = self.mesh.size
            entry["device_kind"] = self.device_kind
        if self.reason:
            entry["reason"] = self.reason
        if self.plan is not None:
            entry["cost_s"] = self.plan.cost.total
            entry["compute_s"] = self.plan.cost.compute
            entry["communication_s"] = self.plan.cost.comm
            entry["extraction"] = self.extraction
        if self.memory is not None:
            entry["memory_bytes"] = self.memory.total
        if self.min_memory is not None and self.status == "infeasible":
            entry["min_memory_bytes"] = self.min_memory.total
        if self.status in ("ok", "infeasible", "failed") or self.saturate_s:
            entry["enodes"] = self.enodes
            entry["stop_reason"] = self.stop_reason
            entry["penalty_rounds"] = self.penalty_rounds
            entry["seconds"] = {"saturate": round(self.saturate_s, 3), "extract": round(self.extract_s, 3)}
        if self.egraph_of:
            entry["egraph_of"] = self.egraph_of
        if not self.candidate:
            entry["baseline_only"] = True
        return entry


def mesh_label(mesh: Mesh) -> str:
    return ",".join(f"{a}={n}" for a, n in zip(mesh.axes, mesh.sizes, strict=True))


def gib(nbytes: float) -> str:
    """Bytes as GiB with enough digits to tell small amounts apart."""
    value = nbytes / 2**30
    return f"{value:.2f} GiB" if value >= 1 else f"{value:.3f} GiB"


def trial_row(trial: MeshTrial) -> str:
    """The progress row of a mesh (``mesh x=2,y=4``)."""
    return f"mesh {trial.label}"
