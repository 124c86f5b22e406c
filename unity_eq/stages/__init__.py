"""Pipeline stages over intra-op plans: Unity's ``Batch`` and ``Pipeline`` at the inter-op level.

=============  =============================================================================================
module         what it does
=============  =============================================================================================
pieces         each distinct piece saturated and extracted per (tensor-group size, microbatch): ``PieceCost``
schedule       GPipe and 1F1B: the step's time over the stages, the bubble, microbatches held per stage
state          ZeRO stages 0-3 over the data-parallel axis: bytes kept per device, traffic per step or
               microbatch
partition      cutting the chain of pieces into contiguous stages within memory, the slowest stage fastest
search         the configurations (t, p, d, microbatches, schedule, recomputation, ZeRO, rank order), each
               priced; the cheapest that fits
=============  =============================================================================================
"""

from unity_eq.stages.pieces import GraphAt, PieceCost, PieceTable, price_pieces
from unity_eq.stages.search import StageConfig, StageMemory, StagePlan, StageSearch, evaluate, group_sizes, stage_search

__all__ = [
    "GraphAt",
    "PieceCost",
    "PieceTable",
    "StageConfig",
    "StageMemory",
    "StagePlan",
    "StageSearch",
    "evaluate",
    "group_sizes",
    "price_pieces",
    "stage_search",
]
