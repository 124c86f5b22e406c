"""Measured op times: ``unity-eq profile`` and the table that ``optimize --profile`` reads.

The extractor prices every e-node of the saturated e-graph with :meth:`CostModel.compute` on the e-node's
*local* (per-device) shapes. ``profile`` measures exactly those: it builds the e-graph of a model on a mesh,
lists every distinct (op, attributes, local input shapes and dtypes) among its compute e-nodes, runs each
as a one-node ONNX model in onnxruntime on this machine's device (warm-up runs, then repeats; the median
is kept) and stores the table as JSON. With ``optimize --profile TABLE`` the cost model uses the measured
time of every op the table has and the roofline for the rest.

The table also holds a calibration of the device (peak FLOP/s from a large MatMul, memory bandwidth from a
large elementwise Add, the per-op floor from a one-element op), which makes it a roofline device spec, so
each entry also records the roofline's prediction and the table reports the median relative error
``|predicted − measured| / measured``. See docs/profile.md for the format.

Lookups are keyed as :meth:`CostModel.compute` is called: (op type, local input shapes, local output
shape, dtype). ``compute`` does not see attributes, so entries that differ only in attributes (a
Transpose's ``perm`` on a square tensor) answer with the slowest of them; :meth:`ProfileTable.lookup` takes
``attrs`` for an exact match. A multi-output op (Split) is one measurement, shared equally by the e-nodes
of its outputs, as the extractor sums them.

The package, in the order a run goes: :mod:`~unity_eq.profile.instances` (the distinct ops of the e-graph on
local shapes), :mod:`~unity_eq.profile.models` (the one-node ONNX model of each, and the calibration's),
:mod:`~unity_eq.profile.timing` (timing them on the device, calibrating it) and :mod:`~unity_eq.profile.run`
(:func:`profile_model`: the whole run and the table's entries).
"""

from __future__ import annotations

from unity_eq.profile.instances import InputSpec, ProfiledOp, op_instances
from unity_eq.profile.models import OPSET
from unity_eq.profile.run import profile_model
from unity_eq.profile.timing import Progress, Timing, calibrate, calibrated_machine, describe_local_device

__all__ = [
    "OPSET",
    "InputSpec",
    "ProfiledOp",
    "Progress",
    "Timing",
    "calibrate",
    "calibrated_machine",
    "describe_local_device",
    "op_instances",
    "profile_model",
]
