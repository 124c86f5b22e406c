"""Encode a Graph into egglog, saturate it with the rule files in an isolated worker, read the result back.

Three steps, each a plain function over plain data:

* :func:`encode` turns a :class:`~unity_eq.ir.Graph` and a :class:`~unity_eq.ir.Mesh` into egglog program
  text: one ``let`` per tensor (so shared subterms stay shared), the global shape, dtype and replicated
  placement of every original tensor, the mesh axes, and the literal-keyed facts the guards need
  (``reshape-map``, ``reduce-map``).
* :func:`saturate` runs the schema, analyses, rule files and the program in a separate process with a memory
  limit, in explicit iterations with node, iteration and wall-clock limits, and returns the serialized
  e-graph. egglog has no timeout or interrupt inside one call and aborts the process when an allocation
  fails, so the worker isolates the CLI from a runaway run.
* :func:`parse_serialized` turns the serialized JSON into :class:`EGraphData`: e-classes of tensors with
  their shape, dtype and per-axis placement, and e-nodes with decoded literal arguments — what the
  extractor reads.

Saturation reports why it stopped (:class:`StopReason`), as egg's runner does.
"""

from __future__ import annotations

from unity_eq.egraph.encode import MAX_RANK, Encoding, encode
from unity_eq.egraph.saturate import Limits, SaturationResult, StopReason, peak_rss_mib, saturate
from unity_eq.egraph.serialized import ClassRef, EClass, EGraphData, ENode, parse_serialized

__all__ = [
    "MAX_RANK",
    "ClassRef",
    "EClass",
    "EGraphData",
    "ENode",
    "Encoding",
    "Limits",
    "SaturationResult",
    "StopReason",
    "encode",
    "parse_serialized",
    "peak_rss_mib",
    "saturate",
]
