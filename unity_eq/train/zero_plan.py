"""What ZeRO shards in an SPMD plan: the weights whose gradient the plan sums over the ZeRO axis, and the
replicate steps whose all-reduce ZeRO's reduce-scatter replaces. One answer for the ranks
(unity_eq.train.rank, unity_eq.train.load) and for what ``check --training`` holds them against
(unity_eq.train.predict), so the run is the plan priced.

ZeRO sums each replica's gradient of a weight over the axis (a reduce-scatter). That is right only for a
weight every replica holds whole-on-the-axis and reads through a ``replicate`` on it (data parallelism: each
replica's gradient is its own batch's share). Other weights of a plan are not data-parallel there:

- read after a ``combine`` (the pooler of a BERT computed on the gathered first tokens), every replica
  computes the same whole gradient: summing it over the axis would multiply it by the axis's size;
- partitioned on the axis, each rank holds another piece: there is nothing to sum;
- read both ways, or through two replicate steps, the plan sums part of its gradient: ZeRO cannot sum part;
- folded by the frontend (``Wt = Transpose(W)``, a position table gathered at the model's length), the plan
  prices the folded tensor's all-reduce while ZeRO would shard the source parameter, of other bytes.

Those keep the plan's own all-reduces and a plain optimizer state; ZeRO takes the rest. A replicate step is
ZeRO's only when every weight whose gradient it carries is (closed under that rule), and its bytes are those
weights' pieces (so the reduce-scatter and all-gather ZeRO issues are the bytes plan.json priced).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from unity_eq.dtypes import as_dtype, is_float
from unity_eq.planfile import (
    ComputeStepRecord,
    ExplainRecord,
    InputStepRecord,
    PartitionStepRecord,
    ReplicateStepRecord,
    WeightStepRecord,
)
from unity_eq.train.rank import depends_on_inputs, weight_uses

__all__ = ["ZeroSharding", "zero_sharding"]


@dataclass(frozen=True)
class ZeroSharding:
    """ZeRO's share of an SPMD plan on ``axis``: the source parameters it shards (``params``) and the replicate
    steps (their ``out``) whose gradient all-reduce its reduce-scatter replaces (``replicates``)."""

    axis: str
    params: frozenset[str]
    replicates: frozenset[str]


def zero_sharding(record: ExplainRecord, axis: str) -> ZeroSharding:
    """The weights ZeRO over ``axis`` shards in ``record``'s plan and the replicate steps it replaces (module
    docstring: a weight not read data-parallel on ``axis`` stays out)."""
    params = _parameters(record)
    walk = _Walk(record, axis, params)
    eligible = set(params) - walk.leaked - walk.blocked
    pieces = _piece_bytes(record, params)
    while True:
        chosen = [c for c in walk.crossings if c.grads and c.grads <= eligible]
        crossings: dict[str, int] = {}
        for c in chosen:
            for name in c.grads:
                crossings[name] = crossings.get(name, 0) + 1
        drop = {name for name, n in crossings.items() if n > 1}
        for c in walk.crossings:
            if c.grads and not c.grads <= eligible:
                drop |= c.grads  # a step ZeRO cannot take whole: its weights keep the plan's all-reduce
            elif c.grads and c.nbytes != sum(pieces[name] for name in c.grads):
                drop |= c.grads  # the step's bytes are not the pieces ZeRO shards: not the plan's price
        drop &= eligible
        if not drop:
            break
        eligible -= drop
    chosen = [c for c in walk.crossings if c.grads and c.grads <= eligible]
    sharded = {name for c in chosen for name in c.grads}
    return ZeroSharding(axis, frozenset(sharded), frozenset(c.out for c in chosen))


@dataclass(frozen=True)
class _Crossing:
    """A replicate step on the ZeRO axis of a tensor computed from weights alone: the parameters whose gradient
    it carries and its bytes per rank."""

    out: str
    grads: frozenset[str]
    nbytes: int


class _Walk:
    """The steps in order, following which parameters' gradients each weight-only tensor carries (``grads``)
    until a replicate on the axis sums them (a :class:`_Crossing`) or something else reads them (``leaked``:
    an op that also reads a model input, a combine, a reduce, a model output)."""

    def __init__(self, record: ExplainRecord, axis: str, params: Mapping[str, tuple[str, ...]]) -> None:
        self.record = record
        self.crossings: list[_Crossing] = []
        self.leaked: set[str] = set()
        self.blocked: set[str] = set()  # sources of a folded weight, and weights partitioned on the axis
        from_inputs = depends_on_inputs(record.steps)
        grads: dict[str, frozenset[str]] = {}
        for step in record.steps:
            match step:
                case WeightStepRecord(out=out, name=name):
                    sources = params.get(name, ())
                    grads[out] = frozenset(sources)
                    if sources != (name,):
                        self.blocked |= set(sources)
                case PartitionStepRecord(out=out, src=src, axis=on) if src not in from_inputs:
                    grads[out] = grads.get(src, frozenset())
                    if on == axis:
                        self.blocked |= grads[out]
                case ReplicateStepRecord(out=out, src=src, axis=on) if src not in from_inputs:
                    carried = grads.get(src, frozenset())
                    if on == axis:
                        self.crossings.append(_Crossing(out, carried, record.tensors[src].local_bytes))
                        carried = frozenset()
                    grads[out] = carried
                case ComputeStepRecord(inputs=inputs, outputs=outputs):
                    read = [i for i in inputs if isinstance(i, str)]
                    carried = frozenset().union(*(grads.get(i, frozenset()) for i in read))
                    if any(i in from_inputs for i in read):
                        self.leaked |= carried
                    else:
                        grads.update({o: carried for o in outputs if o})
                case PartitionStepRecord() | ReplicateStepRecord() | InputStepRecord():
                    pass  # of a tensor computed from a model input: no weight's gradient to follow
                case _:  # any other parallel step (a combine, a reduce): the gradient leaves as it is
                    self.leaked |= grads.get(getattr(step, "src", ""), frozenset())
        for output in record.model.outputs.values():
            self.leaked |= grads.get(output.tensor, frozenset())


def _parameters(record: ExplainRecord) -> dict[str, tuple[str, ...]]:
    """Weight name -> the source parameters its gradient reaches (itself for a parameter; a folded weight's
    sources; none for a constant or an integer weight), as the ranks train them (unity_eq.train.weights).
    A plan without the ``weights`` section (an older unity-eq's) cannot tell a folded weight from a parameter
    here: none (``load_rank`` refuses ZeRO on it)."""
    out: dict[str, tuple[str, ...]] = {}
    for step in record.steps:
        if not isinstance(step, WeightStepRecord) or not is_float(record.tensors[step.out].dtype):
            continue
        origin = record.weights.get(step.name)
        if origin is not None and origin.trainable:
            out[step.name] = tuple(origin.sources)
    return out


def _piece_bytes(record: ExplainRecord, params: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    """Bytes of the piece of each parameter a rank holds: the chunk every read of it takes, or the whole weight
    when reads differ (unity_eq.train.rank.RankModule's parameters)."""
    shapes = {s.name: s.out for s in record.steps if isinstance(s, WeightStepRecord)}
    uses = weight_uses(record.steps, (o.tensor for o in record.model.outputs.values()))
    sizes = dict(zip(record.mesh.axes, record.mesh.sizes, strict=True))
    out: dict[str, int] = {}
    for name in {source for sources in params.values() for source in sources}:
        if name not in shapes:
            out[name] = -1  # a folded weight's source, not loaded itself: never ZeRO's (blocked)
            continue
        t = record.tensors[shapes[name]]
        parts = uses.parts.get(name, [()])
        own = parts[0] if len(parts) == 1 else ()
        split = math.prod(sizes[a] for _, a in own)
        out[name] = math.prod(t.shape) // split * as_dtype(t.dtype).itemsize
    return out
