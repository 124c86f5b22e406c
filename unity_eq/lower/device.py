"""A lowered plan's device files: ``device_<rank>.onnx`` built one rank at a time, its weights embedded or
streamed to ``device_<rank>.onnx.data``, its identity in the model's metadata, and its validation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from unity_eq.errors import InternalError
from unity_eq.ir import Graph
from unity_eq.lower.builder import DeviceGraphBuilder
from unity_eq.plan import Plan
from unity_eq.weightfile import (
    META_COLLECTIVES,
    META_COORDS,
    META_MESH,
    META_PLAN_HASH,
    META_RANK,
    META_WEIGHTS,
    Deferred,
    ExternalWeights,
    embedded,
    identity_header,
    value_of,
)

# A rank whose weights exceed this writes them to ``device_<rank>.onnx.data`` one tensor at a time (streamed:
# memory holds one tensor, not the rank); smaller ranks stay one self-contained file.
EXTERNAL_DATA_BYTES = 16 << 20


@dataclass
class LoweredPlan:
    """A plan ready to be written: device models are built one rank at a time, so a large replicated
    model is never held once per rank."""

    plan: Plan
    graph: Graph
    stages: dict[str, int]
    opsets: list[onnx.OperatorSetIdProto]
    ir_version: int
    plan_hash: str = ""
    #: written by ``write_plan_only``: plan.json alone, its weights possibly absent (never build a rank's
    #: weights from it)
    plan_only: bool = False

    @property
    def world_size(self) -> int:
        return self.plan.mesh.size

    def build_rank(self, rank: int) -> tuple[onnx.ModelProto, list[dict[str, Any]], int]:
        """Rank ``rank``'s model with its weights inside, its collectives' tensor names, and its weight bytes."""
        model, collectives, weights = self._build_rank(rank)
        model.graph.initializer.extend(embedded(name, value_of(array)) for name, array in weights.items())
        return model, collectives, _weight_bytes(weights)

    def write_rank(self, rank: int, folder: Path) -> tuple[list[dict[str, Any]], int]:
        """Write ``device_<rank>.onnx`` to ``folder``; return its collectives' tensor names and weight bytes.

        The weights are views of the source model's (memory-mapped) weights until written. Over
        ``EXTERNAL_DATA_BYTES`` they are streamed: each is sliced, appended to ``device_<rank>.onnx.data`` and
        dropped before the next, so memory holds one tensor of the rank, never the rank."""
        model, collectives, weights = self._build_rank(rank)
        nbytes = _weight_bytes(weights)
        if nbytes > EXTERNAL_DATA_BYTES:
            header = identity_header(self.plan_hash, rank)
            with ExternalWeights(folder / f"device_{rank}.onnx.data", header) as data:
                for name in list(weights):
                    model.graph.initializer.append(data.add(name, value_of(weights.pop(name))))
        else:
            model.graph.initializer.extend(embedded(name, value_of(array)) for name, array in weights.items())
        del weights
        onnx.save_model(model, folder / f"device_{rank}.onnx")
        return collectives, nbytes

    def _build_rank(self, rank: int) -> tuple[onnx.ModelProto, list[dict[str, Any]], dict[str, np.ndarray | Deferred]]:
        """Rank ``rank``'s model without initializers, its collectives, and its initializers' values in graph
        order (mostly views of the source weights: nothing is copied yet)."""
        builder = DeviceGraphBuilder(self.plan, self.graph, rank)
        collectives: list[dict[str, Any]] = []
        for step in self.plan.steps:
            builder.add(step, collectives)
        model = builder.finish(self.opsets, self.ir_version)
        props = identity_props(self.plan, rank, self.plan_hash, builder.cuts)
        props[META_WEIGHTS] = json.dumps({name: tid for tid, name in builder.const_names.items()})
        onnx.helper.set_model_props(model, props)
        return model, collectives, builder.initializers

    def collective_names(self) -> list[dict[str, Any]]:
        """The device tensor names each collective cuts (the same on every rank): rank 0's graph is built
        for them, its weights left as views, never read."""
        return self._build_rank(0)[1]

    def models(self) -> Iterator[onnx.ModelProto]:
        for rank in range(self.world_size):
            yield self.build_rank(rank)[0]


def identity_props(plan: Plan, rank: int, digest: str, cuts: list[dict[str, Any]]) -> dict[str, str]:
    """Who a device file is: its rank, mesh coordinates, the plan's hash, and the collectives cutting it."""
    mesh = plan.mesh
    return {
        META_RANK: str(rank),
        META_PLAN_HASH: digest,
        META_COORDS: json.dumps(dict(zip(mesh.axes, mesh.coords(rank), strict=True))),
        META_MESH: json.dumps(dict(zip(mesh.axes, mesh.sizes, strict=True))),
        META_COLLECTIVES: json.dumps(cuts),
    }


def _weight_bytes(weights: dict[str, np.ndarray | Deferred]) -> int:
    return sum(int(array.nbytes) for array in weights.values())


def validate_device_file(path: Path, shown: Path) -> None:
    """Refuse a device file that fails ``onnx.checker`` (full check, with shape inference) or that onnxruntime
    does not open: ``optimize`` never reports success for a plan that cannot run. ``shown`` is the path named in
    the error (the file's final place; nothing is written there when this fails). A file onnxruntime's CPU
    provider has no kernel for (bfloat16 arithmetic) passes: the checker found it valid, and it runs where the
    op is implemented (CUDA); ``run`` and ``check`` on the CPU say which op is missing."""
    from unity_eq.lower.onnxrt import make_session, missing_kernel

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # onnx raises ValidationError, InferenceError and others
        problem = f"onnx.checker: {str(exc).strip().splitlines()[0][:400]}"
    else:
        try:
            make_session(str(path), ["CPUExecutionProvider"], prepack=False)  # loads; weights stay on disk
            return
        except Exception as exc:  # onnxruntime refuses the model
            if missing_kernel(exc) is not None:  # valid (the checker passed), only not on the CPU: bfloat16
                return
            problem = f"onnxruntime: {str(exc).strip().splitlines()[0][:400]}"
    raise InternalError(
        f"{shown}: the lowered device model is invalid ({problem}); no plan was written. "
        "This is a bug in unity-eq's lowering: please report it with the model and options."
    )
