"""The relaxed objective of the differentiable extractor, in torch: the expected plan's cost and memory excess.

Per start (a row of the logits) and e-class, a softmax over its nodes at temperature ``tau``. The reach
probabilities are the fixed point of ``r[k] = 1 − Π_(e → k) (1 − r[parent class]·p[parent node])`` (roots at 1),
and the expected cost and memory are sums over nodes of ``r[class]·p[node]·price``. Costs are divided by
``scale`` (the start plan's cost) and memory by the budget, so both are near 1 and one learning rate fits
every model.

Back-propagating through a level-by-level solve costs a few torch operations per level of the e-graph (80
levels for a small transformer) for every step. Instead the fixed point and its adjoint (the gradient of the
objective with respect to each class's reach, ``a = g + (∂r/∂r)ᵀ a``) are each solved by Jacobi sweeps over all
edges at once, warm-started from the previous step: from scratch, ``depth`` sweeps are exact on a DAG; after
that the logits move little per step and a few sweeps track both. The gradient with respect to the
probabilities is then exact for the tracked fixed point, and autograd carries it through the softmax (a
surrogate ``Σ p·p̄``) to the logits, for torch's Adam.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from unity_eq.extract.relax import Relaxed

__all__ = ["RelaxedCost"]

CLAMP = 1 - 1e-6  # r·p below 1: log1p(−1) has no gradient


class RelaxedCost:
    """Callable ``(logits [S, N], tau, weight [S]) → (surrogate loss, expected cost [S], memory excess [S])``;
    the surrogate's gradient in the logits is the gradient of ``cost + weight · excess``."""

    def __init__(
        self, problem: Relaxed, device: str, scale: float, budget: float, sweeps: int = 3, dtype: Any = None
    ) -> None:
        import torch

        real = dtype if dtype is not None else torch.float32

        def tensor(values: np.ndarray) -> Any:
            tensor = torch.as_tensor(values)
            return tensor.to(device, real if tensor.is_floating_point() else tensor.dtype)

        self.torch = torch
        self.count = len(problem.classes)
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
        self.reach: Any = None  # the warm starts
        self.adjoint: Any = None

    def _class_max(self, values: Any) -> Any:
        torch = self.torch
        rows = values.shape[0]
        empty = torch.full((rows, self.count), -math.inf, dtype=values.dtype, device=values.device)
        return empty.scatter_reduce(1, self.node_class.expand(rows, -1), values, "amax", include_self=True)

    def probabilities(self, logits: Any, tau: float) -> Any:
        """The per-class softmax of every row at temperature ``tau``."""
        torch = self.torch
        z = logits / tau
        top = self._class_max(z.detach()).index_select(1, self.node_class)
        e = torch.exp(z - top)
        total = torch.zeros(logits.shape[0], self.count, dtype=z.dtype, device=z.device)
        total = total.index_add(1, self.node_class, e)
        return e / total.index_select(1, self.node_class)

    def _zeros(self, rows: int, size: int, like: Any) -> Any:
        return self.torch.zeros(rows, size, dtype=like.dtype, device=like.device)

    def _sweep(self, r: Any, p: Any) -> tuple[Any, Any, Any]:
        """One Jacobi step of the reach fixed point: the new reach, and the edges' ``q = r·p`` and, per class,
        the probability ``Π (1 − q)`` that no edge reaches it, both from the old reach."""
        q = (r.index_select(1, self.edge_parent) * p.index_select(1, self.edge_node)).clamp(max=CLAMP)
        logs = self._zeros(p.shape[0], self.count, p).index_add(1, self.edge_child, self.torch.log1p(-q))
        return (-self.torch.expm1(logs)).index_fill(1, self.roots, 1.0), q, self.torch.exp(logs)

    def __call__(self, logits: Any, tau: float, weight: Any) -> tuple[Any, Any, Any]:
        torch = self.torch
        p = self.probabilities(logits, tau)
        with torch.no_grad():
            pd = p.detach()
            rows = pd.shape[0]
            fresh = self.reach is None
            r = self._zeros(rows, self.count, pd).index_fill(1, self.roots, 1.0) if fresh else self.reach
            for _ in range(self.depth if fresh else self.sweeps):
                before = r
                r, q, miss = self._sweep(r, pd)
            r_node = r.index_select(1, self.node_class)
            direct = r_node * pd
            cost = direct @ self.cost
            price = self.cost.expand(rows, -1)
            excess = torch.zeros_like(cost)
            if self.memory is not None:
                excess = torch.relu(direct @ self.memory - 1.0)
                price = price + (weight * (excess > 0))[:, None] * self.memory
            own = self._zeros(rows, self.count, pd).index_add(1, self.node_class, pd * price)
            # ∂r[child]/∂q per edge, Π of the other edges' (1 − q): at most 1. Taken from the last sweep's own q (a
            # reach a few sweeps stale could make it huge and the adjoint overflow)
            slope = (miss.index_select(1, self.edge_child) / (1 - q)).clamp(max=1.0)
            a = own if fresh else self.adjoint
            through = slope * pd.index_select(1, self.edge_node)
            for _ in range(self.depth if fresh else self.sweeps):
                pushed = a.index_select(1, self.edge_child) * through
                a = own + self._zeros(rows, self.count, pd).index_add(1, self.edge_parent, pushed)
            edge_grad = a.index_select(1, self.edge_child) * slope * before.index_select(1, self.edge_parent)
            grad = r_node * price + self._zeros(rows, pd.shape[1], pd).index_add(1, self.edge_node, edge_grad)
            self.reach, self.adjoint = r, a
        return (p * grad).sum(), cost, excess

    def round(self, logits: Any) -> list[np.ndarray]:
        """Per row, the index of each class's most likely node (the first of equals)."""
        torch = self.torch
        rows = logits.shape[0]
        top = self._class_max(logits).index_select(1, self.node_class)
        index = torch.arange(logits.shape[1], device=logits.device).expand(rows, -1)
        candidates = torch.where(logits >= top, index, torch.full_like(index, logits.shape[1]))
        first = torch.full((rows, self.count), logits.shape[1], dtype=index.dtype, device=logits.device)
        first = first.scatter_reduce(1, self.node_class.expand(rows, -1), candidates, "amin", include_self=True)
        return [row for row in first.cpu().numpy()]
