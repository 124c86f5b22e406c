"""The relaxed objective of the differentiable extractor, in torch: the expected plan's cost and memory excess,
and their gradient in the logits.

Per start (a row of the logits) and e-class, a softmax over its nodes at temperature ``tau``. The reach
probabilities are the fixed point of ``r[k] = 1 − Π_(e → k) (1 − r[parent class]·p[parent node])`` (roots at 1),
and the expected cost and memory are sums over nodes of ``r[class]·p[node]·price``. Costs are divided by
``scale`` (the start plan's cost) and memory by the budget, so both are near 1 and one learning rate fits
every model.

Back-propagating through a level-by-level solve costs a few torch operations per level of the e-graph (80
levels for a small transformer) for every step. Instead the fixed point and its adjoint (the gradient of the
objective with respect to each class's reach, ``a = g + (∂r/∂r)ᵀ a``) are each solved by Jacobi sweeps over all
edges at once, warm-started from the previous step. The reach starts at the start plan's own (its classes at
1, the others at 0: exact for the start choice, which every row begins near); the adjoint starts with
``depth`` sweeps (exact on a DAG), then the logits move little per step and a few sweeps track both. The
gradient with respect to the probabilities is exact for the tracked fixed point, and the softmax's own
Jacobian carries it to the logits in closed form (``p·(g − Σ_class p·g)/tau``), with no autograd graph: a step
is a few dozen tensor operations.

Every operation is a gather, a scatter-add or elementwise: no Python loop over classes or nodes per step.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from unity_eq.extract.relax import Relaxed

__all__ = ["RelaxedCost", "exact_prices"]

CLAMP = 1 - 1e-6  # r·p below 1: 1 − q is divided by


class RelaxedCost:
    """``gradient(logits [S, N], tau, weight [S]) → (∂(cost + weight · excess)/∂logits, memory excess [S])`` for
    every row at once (the expected cost itself is not needed for the step: not computed); ``round(logits)`` is
    each row's discrete choice."""

    def __init__(
        self, problem: Relaxed, rows: int, device: str, scale: float, budget: float, sweeps: int = 3, dtype: Any = None
    ) -> None:
        import torch

        real = dtype if dtype is not None else torch.float32

        def tensor(values: np.ndarray) -> Any:
            tensor = torch.as_tensor(values)
            return tensor.to(device, real if tensor.is_floating_point() else tensor.dtype)

        self.torch = torch
        self.count = len(problem.classes)
        self.nodes = len(problem.nodes)
        self.node_class = tensor(problem.node_class)
        self.cost = tensor(problem.cost / (scale if scale > 0 else 1.0))
        limited = math.isfinite(budget) and budget > 0
        self.memory = tensor(problem.memory / budget) if limited else None
        self.roots = tensor(problem.roots)
        self.edge_node = tensor(problem.edge_node)
        self.edge_child = tensor(problem.edge_child)
        self.edge_parent = tensor(problem.node_class[problem.edge_node])
        self.depth = problem.depth
        self.sweeps = sweeps
        start = np.zeros(self.count)
        start[problem.start >= 0] = 1.0
        start[problem.roots] = 1.0
        self.problem, self.start_reach = problem, start
        self.reach: Any = tensor(start).expand(rows, -1).contiguous()  # the start plan's own: exact for it
        self.adjoint: Any = None
        self.adjoint_child: Any = None  # the adjoint of each edge's child class
        self.rows = rows
        self.classes_by_node = self.node_class.expand(rows, -1)
        self.edge_child_rows = self.edge_child.expand(rows, -1)

    def _class_sum(self, values: Any) -> Any:
        return self._zeros(self.count, values).index_add_(1, self.node_class, values)

    def _zeros(self, size: int, like: Any) -> Any:
        return self.torch.zeros(like.shape[0], size, dtype=like.dtype, device=like.device)

    def probabilities(self, logits: Any, tau: float) -> Any:
        """The per-class softmax of every row at temperature ``tau``."""
        z = logits / tau
        empty = self.torch.full((z.shape[0], self.count), -math.inf, dtype=z.dtype, device=z.device)
        top = empty.scatter_reduce_(1, self.classes_by_node, z, "amax", include_self=True)
        e = (z - top.index_select(1, self.node_class)).exp_()
        return e.div_(self._class_sum(e).index_select(1, self.node_class))

    def _sweep(self, r: Any, p_edge: Any) -> tuple[Any, Any, Any, Any]:
        """One Jacobi step of the reach fixed point: the new reach, and the edges' ``q = r·p`` and, per class,
        the probability ``Π (1 − q)`` that no edge reaches it, both from the old reach, and the old reach of each
        edge's parent."""
        torch = self.torch
        parent = r.index_select(1, self.edge_parent)
        q = (parent * p_edge).clamp_(max=CLAMP)
        ones = torch.ones(q.shape[0], self.count, dtype=q.dtype, device=q.device)
        miss = ones.scatter_reduce_(1, self.edge_child_rows, torch.rsub(q, 1.0), "prod")
        return torch.rsub(miss, 1.0).index_fill_(1, self.roots, 1.0), q, miss, parent

    def gradient(self, logits: Any, tau: float, weight: Any) -> tuple[Any, Any]:
        torch = self.torch
        p = self.probabilities(logits, tau)
        p_edge = p.index_select(1, self.edge_node)
        r = self.reach
        for _ in range(self.sweeps):
            r, q, miss, parent = self._sweep(r, p_edge)  # parent: the last sweep's old reach, per edge
        r_node = r.index_select(1, self.node_class)
        price = self.cost.expand(p.shape[0], -1)
        if self.memory is not None:
            excess = torch.relu((r_node * p) @ self.memory - 1.0)
            if bool(excess.any()):  # else the penalty adds nothing (0 · memory), and costs 5 operations
                price = price + (weight * (excess > 0))[:, None] * self.memory
        else:
            excess = torch.zeros(p.shape[0], dtype=p.dtype, device=p.device)
        own = self._class_sum(p * price)
        # ∂r[child]/∂q per edge, Π of the other edges' (1 − q): at most 1. Taken from the last sweep's own q (a
        # reach a few sweeps stale could make it huge and the adjoint overflow)
        slope = (miss.index_select(1, self.edge_child) / torch.rsub(q, 1.0)).clamp_(max=1.0)
        if self.adjoint is None:
            a = self._start_adjoint(own)
            a_child = a.index_select(1, self.edge_child)
        else:
            a, a_child = self.adjoint, self.adjoint_child  # the last step's, gathered then
        through = slope * p_edge
        for _ in range(self.sweeps):
            a = own + self._zeros(self.count, p).index_add_(1, self.edge_parent, a_child * through)
            a_child = a.index_select(1, self.edge_child)
        edge_grad = a_child * slope * parent
        grad = (r_node * price).index_add_(1, self.edge_node, edge_grad)
        self.reach, self.adjoint, self.adjoint_child = r, a, a_child
        pg = p * grad  # the softmax's Jacobian, per class: ∂/∂z Σ p·g = p·(g − Σ p·g)
        return (pg - p * self._class_sum(pg).index_select(1, self.node_class)).div_(tau), excess

    def _start_adjoint(self, own: Any) -> Any:
        """The adjoint's warm start: exact for the start choice (hard, every row begins near it), where an edge
        carries a child's adjoint to its parent only when it is the child's one chosen way in. One walk up the
        levels (deepest parents first: a child is deeper than its parents, so its adjoint is final when its
        parents read it), all rows at once, instead of ``depth`` sweeps over every edge."""
        p = self.problem
        chosen = np.zeros(len(p.nodes), dtype=bool)
        chosen[p.start[p.start >= 0]] = True
        parent = p.node_class[p.edge_node]
        active = chosen[p.edge_node] & (self.start_reach > 0)[parent]
        ways = np.bincount(p.edge_child[active], minlength=self.count)
        sole = np.flatnonzero(active & (ways[p.edge_child] == 1))
        sole = sole[np.argsort(-p.level[parent[sole]], kind="stable")]
        parents, children = parent[sole], p.edge_child[sole]
        cuts = np.flatnonzero(np.diff(p.level[parents])) + 1
        adjoint = own.double().cpu().numpy().T.copy()  # [classes, rows]
        for up, down in zip(np.split(parents, cuts), np.split(children, cuts), strict=True):
            np.add.at(adjoint, up, adjoint[down])
        return self.torch.as_tensor(np.ascontiguousarray(adjoint.T)).to(own.device, own.dtype)

    def round(self, logits: Any) -> np.ndarray:
        """Per row, the index of each class's most likely node (the first of equals), as a [rows, classes] array."""
        torch = self.torch
        rows = logits.shape[0]
        empty = torch.full((rows, self.count), -math.inf, dtype=logits.dtype, device=logits.device)
        top = empty.scatter_reduce_(1, self.classes_by_node, logits, "amax", include_self=True)
        index = torch.arange(self.nodes, device=logits.device).expand(rows, -1)
        candidates = torch.where(logits >= top.index_select(1, self.node_class), index, self.nodes)
        first = torch.full((rows, self.count), self.nodes, dtype=index.dtype, device=logits.device)
        first = first.scatter_reduce_(1, self.classes_by_node, candidates, "amin", include_self=True)
        return np.asarray(first.cpu().numpy())


def exact_prices(problem: Relaxed, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The DAG cost and the memory proxy of each discrete choice (a row of node indices per class), in float64:
    the classes its chosen nodes reach from the roots, each once. Reach is propagated level by level (a class's
    level is its longest path from a root, so every parent of a class is on a lower level and is settled when
    its edges are followed), all rows at once: each class's reach and each node's choice are bit masks over
    the rows (64 to a word), so a level is three array operations whatever the number of rows."""
    rows = choices.shape[0]
    count = len(problem.classes)
    reached = np.zeros((rows, count), dtype=bool)
    levels = problem.edges_by_level
    order = np.concatenate(levels) if levels else np.zeros(0, dtype=np.int64)
    nodes = problem.edge_node[order]
    parents, children = problem.node_class[nodes], problem.edge_child[order]
    bounds = np.cumsum([0] + [len(g) for g in levels]).tolist()
    one = np.uint64(1)
    for first in range(0, rows, 64):
        block = choices[first : first + 64]
        bits = one << np.arange(len(block), dtype=np.uint64)
        chosen = np.zeros(len(problem.nodes), dtype=np.uint64)
        np.bitwise_or.at(chosen, block, np.broadcast_to(bits[:, None], block.shape))
        reach = np.zeros(count, dtype=np.uint64)
        reach[problem.roots] = bits.sum(dtype=np.uint64)  # every row reaches the roots
        for low, high in itertools.pairwise(bounds):
            hits = reach[parents[low:high]] & chosen[nodes[low:high]]
            np.bitwise_or.at(reach, children[low:high], hits)
        reached[first : first + 64] = (reach[None, :] & bits[:, None]) != 0
    cost = np.where(reached, problem.cost[choices], 0.0).sum(axis=1)
    memory = np.where(reached, problem.memory[choices], 0.0).sum(axis=1)
    return cost, memory
