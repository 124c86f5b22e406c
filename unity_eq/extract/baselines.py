"""Restrictions: which e-nodes an extraction may use. The hand-made baselines (one device, data parallel,
tensor parallel) are extractions of the same e-graph under a restriction, so they are priced exactly like
the plan they are compared with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unity_eq.egraph import EClass, ENode
from unity_eq.extract.pricing import LEAVES, PARALLEL_OPS, WEIGHT_KINDS


@dataclass(frozen=True)
class Restriction:
    """Which e-nodes an extraction may use. The baselines are extractions restricted this way.

    ``parallel``: parallel ops may appear at all; ``axes``: only on these mesh axes (None: any);
    ``shard_weights``: a weight may be partitioned; ``shard_activations``: a model input or activation may
    be partitioned (without it, tensors get sharded only as the outputs of ops on partitioned weights);
    ``shard_all``: every op that reads an input or activation must run sharded on every mesh axis.
    """

    name: str = "greedy"
    parallel: bool = True
    axes: frozenset[str] | None = None
    shard_weights: bool = True
    shard_activations: bool = True
    shard_all: bool = False

    @classmethod
    def one_device(cls) -> Restriction:
        """No parallel op: the original graph, run whole (on every device, or on one)."""
        return cls("one_device", parallel=False)

    @classmethod
    def data_parallel(cls, strict: bool = True) -> Restriction:
        """Every weight whole on every device, every op's work split (``strict``) along weight-free dims."""
        return cls("data_parallel" if strict else "weights_whole", shard_weights=False, shard_all=strict)

    @classmethod
    def tensor_parallel(cls, axis: str) -> Restriction:
        """One mesh axis only; weights are split, inputs and activations never partitioned (Megatron-LM)."""
        return cls(f"tensor_parallel:{axis}", axes=frozenset({axis}), shard_activations=False)

    def allows(self, node: ENode, cls: EClass, kinds: Mapping[str, str]) -> bool:
        """Whether ``node`` (of e-class ``cls``) may be chosen; ``kinds`` are the source kinds of e-classes."""
        if node.op not in PARALLEL_OPS:
            if not self.shard_all or node.op in LEAVES or cls.sort != "T":
                return True
            if all(kinds.get(c) in WEIGHT_KINDS for c in node.children):
                return True  # preparing a weight (a Transpose of it…) is not work on data
            return all(cls.state(axis) not in ("R", "D") for axis in cls.placement)
        if not self.parallel:
            return False
        if self.axes is not None and node.args[-1] not in self.axes:
            return False
        if node.op == "Partition":
            kind = kinds.get(node.children[0], "activation")
            if kind in WEIGHT_KINDS and not self.shard_weights:
                return False
            if kind not in WEIGHT_KINDS and not self.shard_activations:
                return False
        return True


def candidate_restrictions(axes: Sequence[str], strict_data_parallel: bool = True) -> list[Restriction]:
    """The restrictions a mesh's e-graph is extracted under, in order: unrestricted, then on a one-axis mesh
    data parallel (strict, when ``strict_data_parallel``, then not), then tensor parallel along each axis. The
    mesh search and the stage search's pieces (which leave the strict one out) both draw their candidates here."""
    found = [Restriction()]
    if len(axes) == 1:
        found += [Restriction.data_parallel()] if strict_data_parallel else []
        found += [Restriction.data_parallel(strict=False)]
    return found + [Restriction.tensor_parallel(a) for a in axes]
