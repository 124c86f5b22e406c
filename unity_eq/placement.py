"""Placements: how one tensor is laid out over one axis of the device mesh (DTensor's vocabulary).

====================  =======  =====================================================================
type                  short    meaning on one mesh axis of size n
====================  =======  =====================================================================
``Replicate()``       ``R``    every device on the axis holds the whole value
``Shard(dim=d)``      ``S(d)`` device i holds the i-th of n equal contiguous chunks along dimension d
``Partial()``         ``P``    every device holds a piece; the value is the sum of the n pieces
====================  =======  =====================================================================

The short form is the one used in ``.egg`` rules, ``plan.json``, logs and error messages.

The types are :mod:`unity_eq.ir`'s vocabulary too (re-exported there): every stage names them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Partial", "Placement", "Replicate", "Shard", "parse_placement"]


@dataclass(frozen=True)
class Placement:
    """How a tensor is laid out over one mesh axis. Use the subclasses (and ``isinstance`` or ``match`` to ask
    which one)."""


@dataclass(frozen=True)
class Shard(Placement):
    """Chunked along ``dim`` over the axis: device i holds chunk i (``S(dim)``)."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    """A full copy on every device of the axis (``R``)."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial(Placement):
    """Pending sum: the value is the sum of the pieces held by the devices of the axis (``P``)."""

    def __str__(self) -> str:
        return "P"


def parse_placement(text: str) -> Placement:
    """Parse the short form (``R``, ``P``, ``S(1)``) back into a placement."""
    text = text.strip()
    if text == "R":
        return Replicate()
    if text == "P":
        return Partial()
    if text.startswith("S(") and text.endswith(")") and text[2:-1].strip().lstrip("-").isdigit():
        return Shard(int(text[2:-1]))
    raise ValueError(f"placement: expected R, P or S(<dim>), got {text!r}")
