"""Lowering: a Plan becomes one ONNX model per device plus ``plan.json``.

Each ``device_<rank>.onnx`` holds only standard ONNX ops and the rank's slice of every weight. onnxruntime's
PyPI wheels have no collective ops, so a collective is a cut in the device graph: its source is a graph
*output* and its result a graph *input*; ``plan.json`` lists the collectives in order, each with the stage
(how many collectives precede it on any path) that the runtime uses to run the device graph in segments.
Every tensor of a device graph has its local shape recorded in ``value_info``.

``plan.json`` (format version 1) holds: the model's inputs and outputs, the mesh and the device of each rank,
the per-tensor sharding (global shape, placement per axis, local shape), the steps, the ordered collectives
(kind, axis, dim, groups of participating ranks, bytes, stage) and the predicted cost split into compute
and communication. See docs/plan-format.md.

=========  ================================================================================================
module     what it does
=========  ================================================================================================
stage      ``lower`` (check a plan, stage its collectives, hash it), ``write_plan_dir``, ``write_plan_only``
device     ``LoweredPlan``: one rank's device file built, its weights streamed, its identity, its validation
builder    ``DeviceGraphBuilder``: one rank's ONNX graph, step by step (slices, folds, collective cuts)
names      the tensor and node names of a device graph, taken from the source model
record     the content of plan.json (``plan_record``, ``step_record``) and ``plan_hash``
machine    plan.json's ``machine`` (``machine_record``)
=========  ================================================================================================
"""

from __future__ import annotations

from unity_eq.files import check_output_dir
from unity_eq.lower.device import EXTERNAL_DATA_BYTES, LoweredPlan, identity_props, validate_device_file
from unity_eq.lower.machine import machine_record
from unity_eq.lower.names import derived_names
from unity_eq.lower.record import plan_hash, plan_record, step_record
from unity_eq.lower.stage import collective_stages, lower, refuse_missing_weights, write_plan_dir, write_plan_only
from unity_eq.weightfile import META_COLLECTIVES, META_COORDS, META_MESH, META_PLAN_HASH, META_RANK

__all__ = [
    "EXTERNAL_DATA_BYTES",
    "META_COLLECTIVES",
    "META_COORDS",
    "META_MESH",
    "META_PLAN_HASH",
    "META_RANK",
    "LoweredPlan",
    "check_output_dir",
    "collective_stages",
    "derived_names",
    "identity_props",
    "lower",
    "machine_record",
    "plan_hash",
    "plan_record",
    "refuse_missing_weights",
    "step_record",
    "validate_device_file",
    "write_plan_dir",
    "write_plan_only",
]
