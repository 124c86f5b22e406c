"""The cost model's records: what a step is (:class:`Objective`), what compute prices (:class:`OpInstance`), and
a price (:class:`Cost`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Objective:
    """What one step of the workload is, with the factors the cost and memory models share.

    ``inference``: a forward pass. ``training``: forward, backward (as each op family states it; for an op whose
    family does not, ``backward_factor`` × the forward's compute, the usual ≈ 2×), and the gradient traffic that
    follows from it: a replicated weight's gradient is all-reduced, a partitioned activation's gradient all-
    gathered, and memory keeps the activations for the backward pass and the weights' gradient and optimizer state.
    Compare objectives by identity or ``.training``, never by name.
    """

    name: str
    backward_factor: float = 0.0

    @property
    def training(self) -> bool:
        return self.backward_factor > 0

    @property
    def compute_factor(self) -> float:
        """Compute of a step relative to the forward pass alone."""
        return 1.0 + self.backward_factor

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str | Objective) -> Objective:
        """``inference`` or ``training`` (an Objective passes through); ValueError names both otherwise."""
        if isinstance(text, Objective):
            return text
        if text not in OBJECTIVES:
            raise ValueError(f"objective: expected inference or training, got {text!r}")
        return OBJECTIVES[text]


INFERENCE = Objective("inference")
TRAINING = Objective("training", backward_factor=2.0)
#: The objectives by name (``--objective``).
OBJECTIVES = {o.name: o for o in (INFERENCE, TRAINING)}


@dataclass(frozen=True)
class OpInstance:
    """One op on its local (per-device) shapes: everything the cost model prices it by.

    Built from an e-node (``extract.pricing.enode_instance``, which extraction and ``profile`` share) or from
    a plan step (``report.step_instance``): one type and one :meth:`CostModel.compute`, so a plan re-priced step
    by step costs what its e-nodes cost. ``outputs``: the outputs of a multi-output node (Split), each priced
    with its share of the kernel.
    """

    op_type: str
    in_shapes: tuple[tuple[int, ...] | None, ...]
    in_bytes: float
    out_shape: tuple[int, ...]
    out_bytes: float
    dtype: str
    outputs: int = 1
    #: the values of the attributes its family prices by (``OpFamily.priced_attrs``), as (name, value) pairs
    attrs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # an absent optional operand is None in its position; trailing ones are left out, as a plan step leaves
        # them out, so an e-node and the step it became are one instance
        shapes = self.in_shapes
        while shapes and shapes[-1] is None:
            shapes = shapes[:-1]
        object.__setattr__(self, "in_shapes", tuple(shapes))


@dataclass(frozen=True)
class Cost:
    """Seconds of compute and of communication; extraction minimizes their sum."""

    compute: float = 0.0
    comm: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.comm

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.compute + other.compute, self.comm + other.comm)


ZERO = Cost()

# --- the tie rule: when one predicted cost beats another -------------------------------------------------------
# One rule for every search: a candidate replaces the one kept only when it is cheaper by more than a tolerance
# (:func:`cheaper`); within it the two are a tie, which each search breaks by what it trusts more than the model
# (the mesh search: less communication; the stage search: the simpler configuration; a re-extraction: the plan
# it had). The tolerance says how far the two numbers can be apart and still be the same prediction:

#: Rounding noise: two sums of the same terms in another order (re-extracting a plan, ranking the stage search's
#: configurations, greedy's e-class totals). Anything larger is a real difference in the model's terms.
COST_EPSILON = 1e-12
#: Two searches' totals of one workload (a pipeline's step against the SPMD plan's, priced along different paths):
#: more terms summed in other orders, still far below any difference the model means.
CROSS_SEARCH_EPSILON = 1e-9
#: Model error: plans of one mesh search within 1 % of the cheapest are ties the model cannot tell apart, and the
#: one that communicates least (the least certain part of the model) wins (``search.choose.choose_trial``).
TIE_TOLERANCE = 0.01


def cheaper(cost: float, than: float, tolerance: float = COST_EPSILON) -> bool:
    """Whether ``cost`` beats ``than`` by more than ``tolerance`` (a fraction of ``than``): the tie rule."""
    return cost < than * (1 - tolerance)


def within(cost: float, cheapest: float, tolerance: float = TIE_TOLERANCE) -> bool:
    """Whether ``cost`` ties ``cheapest``: at most ``tolerance`` (a fraction of ``cheapest``) dearer."""
    return cost <= cheapest * (1 + tolerance)
