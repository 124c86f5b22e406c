"""Pipeline stages over intra-op plans: Unity's ``Batch`` and ``Pipeline`` at the inter-op level.

=============  =============================================================================================
module         what it does
=============  =============================================================================================
pieces         each distinct piece saturated and extracted per (tensor-group size, microbatch): ``PieceCost``
schedule       GPipe and 1F1B: the step's time over the stages, the bubble, microbatches held per stage
state          ZeRO levels 0-3 over the data-parallel axis: bytes kept per device, traffic per step or
               microbatch
partition      cutting the chain of pieces into contiguous pipeline stages within memory, the slowest fastest
config         one configuration (t, p, d, microbatches, schedule, recomputation, ZeRO, rank order) and all of
               them a machine and batch allow
evaluate       one configuration priced: its cut into stages, each stage's memory (``MemoryUsage``) and step
search         every configuration priced; the cheapest that fits, or why none does
=============  =============================================================================================
"""

from unity_eq.stages.pieces import GraphAt, PieceCost, PieceTable, price_pieces
from unity_eq.stages.search import StageConfig, StagePlan, StageSearch, evaluate, group_sizes, stage_search

__all__ = [
    "GraphAt",
    "PieceCost",
    "PieceTable",
    "StageConfig",
    "StagePlan",
    "StageSearch",
    "evaluate",
    "group_sizes",
    "price_pieces",
    "stage_search",
]
