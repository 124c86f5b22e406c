"""Machines and the cost model: what a plan step costs on a given machine.

Placement transitions, the collective each one is, and its price on a mesh axis of n devices for a tensor of
S bytes (the gathered / reduced size). Collectives follow NCCL's ring algorithms (alpha-beta, with the bus
factors below); B and α are the bandwidth and latency of the axis's link (see "Links" below):

=====================  ==================  ===============================  ====================================
parallel op            transition          forward                          backward (objective ``training``)
=====================  ==================  ===============================  ====================================
Partition(x, d, ax)    R → S(d)            free for weights and inputs;     all-gather of the gradient when x is
                                           a local copy of an activation    an activation
Combine(x, d, ax)      S(d) → R            all-gather                       free (a slice)
Replicate(x, ax)       R → R (for S work)  free                             all-reduce of the gradient, unless x
                                                                            is a model input
Reduce(x, ax)          P → R               all-reduce                       free
=====================  ==================  ===============================  ====================================

==================  ===================================  =========================================================
collective          flat (axis inside one node)          hierarchical (axis over m nodes, k ranks on each)
==================  ===================================  =========================================================
all-reduce          2(n−1)α + 2(n−1)/n·S/B               reduce-scatter in the node + all-reduce of S/k between
                                                         nodes + all-gather in the node
all-gather          (n−1)α + (n−1)/n·S/B                 all-gather of S/k between nodes, then in the node
reduce-scatter      (n−1)α + (n−1)/n·S/B                 reduce-scatter in the node, then of S/k between nodes
all-to-all          (n−1)α + (n−1)/n·S/B (S per rank)    (k−1)/n·S over the node link + (n−k)/n·S over the network
point-to-point      α + S/B                              the same over the network
==================  ===================================  =========================================================

Links: inside a node B is the node's link bandwidth per device (NVLink, PCIe); between nodes it is the rank's
share of its node's network, ``nics × NIC bandwidth / ranks of the mesh on that node`` (every rank of an SPMD
plan runs the same collective at the same time). A collective waits for its slowest group.

Compute is a roofline per op and pass on its local (per-device) shapes on the slowest device of the mesh,
``max(FLOPs / (peak × e), bytes / (bandwidth × e)) + kernels × launch floor``, ``e`` the machine's efficiency
for the op's class (gemm, memory, layout); training adds the backward pass its op family states
(``OpFamily.backward_work``: the gradients, what they re-read, the reduction of broadcast operands), or twice
the forward where the family does not say. The formulas, with examples, are in docs/cost-model.md.

The package: :mod:`~unity_eq.cost.records` (Objective, OpInstance, Cost), :mod:`~unity_eq.cost.collectives`
(the alpha-beta formulas above, on one group's topology), :mod:`~unity_eq.cost.topology` (how a mesh axis's
groups sit on the machine's nodes and links) and :mod:`~unity_eq.cost.model` (:class:`CostModel`, the prices).
"""

from __future__ import annotations

from unity_eq.cost.collectives import AlphaBeta
from unity_eq.cost.model import CostModel, backward_work, forward_work, op_class, op_flops
from unity_eq.cost.records import (
    COST_EPSILON,
    CROSS_SEARCH_EPSILON,
    INFERENCE,
    OBJECTIVES,
    TIE_TOLERANCE,
    TRAINING,
    ZERO,
    Cost,
    Objective,
    OpInstance,
    cheaper,
    within,
)
from unity_eq.cost.topology import MASK_KINDS, MeshTopology

__all__ = [
    "COST_EPSILON",
    "CROSS_SEARCH_EPSILON",
    "INFERENCE",
    "MASK_KINDS",
    "OBJECTIVES",
    "TIE_TOLERANCE",
    "TRAINING",
    "ZERO",
    "AlphaBeta",
    "Cost",
    "CostModel",
    "MeshTopology",
    "Objective",
    "OpInstance",
    "backward_work",
    "cheaper",
    "forward_work",
    "op_class",
    "op_flops",
    "within",
]
