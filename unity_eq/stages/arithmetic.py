"""The layouts a pipeline plan may take, from counts alone: which (tensor, data, stages, microbatch, microbatches)
the devices, the model's pieces and the batch allow, before anything is saturated.

A pipeline plan puts every device to work: each of the machine's device groups holds ``n / (d · t)`` stages of
``d`` replicas of ``t``-device tensor groups, the stages are at most the model's pieces (a stage is whole
pieces), and ``d`` replicas of ``m``-sample microbatches, ``M`` of them, make the batch (``d · m · M = B``).
:func:`shapes` lists what those counts allow (:func:`unity_eq.stages.config.configurations` prices exactly
these); :func:`refuse_impossible` turns "none of them has what the user forced" into one error that says which
count rules it out, so ``optimize --pipeline --stages 9`` on a 4-piece model fails at once instead of after
pricing every piece.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from unity_eq.errors import OptionError
from unity_eq.ir import divisors

__all__ = ["Forced", "Shape", "divisors", "refuse_impossible", "shapes"]


@dataclass(frozen=True)
class Shape:
    """A layout's counts: tensor group size, data replicas, stages, samples per microbatch, microbatches."""

    tensor: int
    data: int
    stages: int
    microbatch: int
    microbatches: int


def shapes(
    group_devices: Sequence[int],
    tensor_sizes: Sequence[int],
    pieces: int | None,
    batch: int | None,
    micro_sizes: Sequence[int],
    pipeline: bool = True,
) -> Iterator[Shape]:
    """Every layout of the device groups (``group_devices``: each group's device count) with a tensor size of
    ``tensor_sizes``, at most ``pieces`` stages and a microbatch of ``micro_sizes`` dividing the batch per
    replica (``pipeline=False``: one stage only). ``pieces``/``batch`` None: not limited by them (to tell which
    count rules a layout out)."""
    for tensor in sorted(set(tensor_sizes)):
        if any(n % tensor for n in group_devices):
            continue
        common = math.gcd(*(n // tensor for n in group_devices))
        for data in sorted(divisors(common), reverse=True):
            stages = sum(n // (data * tensor) for n in group_devices)
            if (pieces is not None and stages > pieces) or (not pipeline and stages > 1):
                continue
            for micro in micro_sizes:
                if batch is None:
                    yield Shape(tensor, data, stages, micro, 0)
                elif batch % (data * micro) == 0:
                    yield Shape(tensor, data, stages, micro, batch // (data * micro))


@dataclass(frozen=True)
class Forced:
    """What the user forced (``--stages``, ``--tensor``, ``--microbatches``); None: free."""

    stages: int | None = None
    tensor: int | None = None
    microbatches: int | None = None

    def admits(self, shape: Shape, microbatches: bool = True) -> bool:
        return (
            (self.stages is None or self.stages == shape.stages)
            and (self.tensor is None or self.tensor == shape.tensor)
            and (not microbatches or self.microbatches is None or self.microbatches == shape.microbatches)
        )

    def describe(self) -> str:
        given = (("--stages", self.stages), ("--tensor", self.tensor), ("--microbatches", self.microbatches))
        return ", ".join(f"`{name} {value}`" for name, value in given if value is not None)


def refuse_impossible(
    forced: Forced,
    group_devices: Sequence[int],
    tensor_sizes: Sequence[int],
    pieces: int,
    batch: int,
    micro_sizes: Sequence[int],
    nodes: int | None = None,
) -> None:
    """Raise OptionError, naming the count that rules it out, when no layout has what ``forced`` asks for (or,
    with nothing forced, when there is no layout at all: more devices than pieces × batch × tensor can use)."""
    if any(forced.admits(s) for s in shapes(group_devices, tensor_sizes, pieces, batch, micro_sizes)):
        return
    devices = sum(group_devices)
    what = forced.describe()
    prefix = f"{what}: no configuration of {devices} devices and a batch of {batch}" if what else ""
    stage_counts = sorted({s.stages for s in shapes(group_devices, tensor_sizes, None, None, micro_sizes)})
    if forced.stages is not None and forced.stages > pieces:
        raise OptionError(
            f"{prefix} has them: the model splits into {pieces} pieces and a stage is one or more whole pieces, "
            f"so at most {pieces} stages. Pass `--stages {pieces}` or fewer."
        )
    if forced.stages is not None and not any(
        forced.admits(s, microbatches=False) for s in shapes(group_devices, tensor_sizes, None, None, micro_sizes)
    ):
        tensor = f" of `--tensor {forced.tensor}` devices each" if forced.tensor is not None else ""
        raise OptionError(
            f"{prefix} has them: every device holds a stage (stages × data replicas × tensor group = {devices} "
            f"devices{tensor}), so the stages can be {', '.join(map(str, stage_counts))}, not {forced.stages}."
        )
    if forced.microbatches is not None and batch % forced.microbatches:
        raise OptionError(
            f"{prefix} has them: {forced.microbatches} microbatches do not divide the batch of {batch} samples "
            "(`--batch`): each microbatch is a whole number of samples. Pass a divisor of the batch."
        )
    if not what:
        most = max(tensor_sizes) * pieces * batch
        scale = f" (`--nodes {nodes}`)" if nodes is not None else ""
        raise OptionError(
            f"{devices} devices{scale} are more than any pipeline plan of this model can use: every device works "
            f"(tensor × stages × data = {devices}), with tensor groups of at most {max(tensor_sizes)} (a node's "
            f"devices), at most {pieces} stages (the model's pieces) and at most {batch} data replicas (the batch, "
            f"one sample each), so at most {most} devices — and a layout must divide them evenly. Pass fewer "
            "`--nodes`/`--devices` or a larger `--batch`."
        )
    raise OptionError(
        f"{prefix} (microbatches of {', '.join(map(str, micro_sizes))}) has them; stages × tensor must divide the "
        "devices, tensor the devices of a node, and the microbatches the batch per replica."
    )
