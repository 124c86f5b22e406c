"""The plug-in shape of an op family: one value that says everything the stages need to know about its ops.

A family added this way lives in one module of ``unity_eq/ops/`` with its rule file: the registry puts its
specs in the language (so ``rules/schema.egg`` declares them), ``optimize`` loads its rule file, the cost model
asks it for FLOPs, ``explain`` names its rule file, and the verifier takes its shape inference, its semantics
(over the verifier's numpy or Z3 backend) and the instances that make up its proof ranges from it.
Nothing outside the module and its ``.egg`` file changes (docs/architecture.md, "Adding an op family").

The hooks are plain functions so that a family module imports nothing heavier than numpy: the engine does not
need z3, and the verifier passes its backend in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from unity_eq.ops.spec import OpSpec

__all__ = ["InstanceRanges", "OpFamily", "ShapeError"]

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """The arguments do not fit the op (the verifier skips such an instance; the engine never builds one)."""


class InstanceRanges(Protocol):
    """The proof ranges the verifier asks a family to cover (verify/_gen.py's GenConfig)."""

    dims: tuple[int, ...]
    max_rank: int
    other_rank: int


#: One instance of an op for the verifier: the shapes of its tensor arguments by name, and its attributes.
Instance = tuple[Mapping[str, Shape], Mapping[str, Any]]


@dataclass(frozen=True)
class OpFamily:
    """An op family as a plug-in.

    ``infer_shape(op, args)``: the output shape, tensor arguments given as shapes (``ShapeError`` when they do
    not fit). ``evaluate(op, args, bk)``: the output as an array of the backend's scalars, tensor arguments as
    numpy object arrays of them; ``bk`` offers ``add``, ``mul``, ``where``, ``compare``… (verify/_tensor.py).
    ``instances(spec, ranges)``: every instance of the proof ranges, completely (a proof is exhaustive over
    them; docs/verify.md). ``flops(in_shapes, out_shape)``: floating-point operations on local shapes.
    ``ranges``: the ranges in words, for docs/verify.md.
    """

    name: str
    specs: tuple[OpSpec, ...]
    rule_file: str  # relative to rules/, loaded by optimize and proven by verify
    infer_shape: Callable[[str, Sequence[Any]], Shape]
    evaluate: Callable[[str, Sequence[Any], Any], Any]
    instances: Callable[[OpSpec, InstanceRanges], Iterable[Instance]]
    flops: Callable[[Sequence[Sequence[int] | None], Sequence[int]], float]
    ranges: str = ""

    def __post_init__(self) -> None:
        for spec in self.specs:
            if spec.family.value != "plugin":
                raise ValueError(f"{self.name}: spec {spec.name} must have family Family.PLUGIN")
