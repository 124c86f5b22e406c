"""Differentiable extraction: the DARTS idea applied to choosing the plan (in the spirit of SmoothE, ASPLOS'25).

Every e-class gets a softmax over its e-nodes (logits are torch parameters). The probability that a class is
*reached* flows from the roots through the chosen nodes' children, ``r[c] = 1 − Π_(n → c) (1 − r[class n]·p[n])``
(a class needed by two likely consumers is reached about once, not twice: a shared sub-term is priced once, the
DAG cost and not the tree cost). The relaxed objective is the price of the expected plan,
``Σ_c r[c] Σ_(n ∈ c) p[n]·cost[n]`` under the same per-node prices every extractor uses (compute and
collectives, with the search's memory penalty when it set one), plus a penalty on the expected per-device
memory (the extractor's node-memory proxy) over a budget, whose weight grows while the expected plan does not
fit. Several random starts (one of them from the start choice) descend together with Adam while the softmax
temperature is annealed towards zero; each start is rounded to its most likely node per class along the way
and at the end. Rounded plans are acyclic by construction (unity_eq.extract.relax cuts the e-graph to a DAG
that keeps the start plan), priced exactly (``dag_cost`` over the same totals), and the best one is returned
only when it is cheaper than the start: the chooser is never worse than greedy.

Determinism: a seeded generator, float32, and deterministic algorithms (on CUDA too) for the duration of a
run; CPU runs in one thread.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from unity_eq.egraph import EGraphData, ENode
from unity_eq.errors import ExtractionError
from unity_eq.extract.chooser import Chosen, RelaxReport
from unity_eq.extract.greedy import adopt_multi_outputs, chosen_closure, dag_cost
from unity_eq.extract.relax import Relaxed, relax

__all__ = ["DifferentiableChooser", "RelaxReport"]


@dataclass
class DifferentiableChooser:
    """Gradient descent over per-class softmaxes (module docstring), seeded from ``start`` (greedy's choice).

    ``memory``: bytes per e-node (the extractor's node-memory proxy); ``budget``: bytes the expected plan may
    use (the start's own proxy when larger: the chooser never asks for less memory than greedy's plan uses).
    ``device``: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda"``.
    """

    seed: int = 0
    starts: int = 32
    steps: int = 100
    learning_rate: float = 0.3
    temperature: tuple[float, float] = (1.0, 0.02)
    memory: Mapping[str, float] | None = None
    budget: float | None = None
    device: str = "auto"
    bias: float = 4.0  # added to the start choice's logits: row 0 starts at it, the last row unbiased
    round_every: int = 20
    elements: int = 1 << 16  # starts × e-nodes at most (see rows)
    name: str = "differentiable"
    reports: list[RelaxReport] = field(default_factory=list)

    def choose(
        self, data: EGraphData, totals: Mapping[str, float], roots: list[str], start: dict[str, ENode] | None
    ) -> Chosen:
        if start is None:
            raise ExtractionError("the differentiable chooser starts from a choice: run a greedy chooser before it")
        began = time.perf_counter()
        problem = relax(data, totals, roots, start, self.memory)
        start_cost = dag_cost(start, roots, totals)
        budget = self._budget(problem, start)
        best, best_cost, device = start, start_cost, "cpu"
        relaxed_best = math.inf
        if len(problem.nodes) > len(problem.classes):  # otherwise there is nothing to choose
            with _deterministic(self.device) as device:
                candidates = self._descend(problem, start_cost, budget, device)
            priced = sorted(
                ((dag_cost(c, roots, totals), i, c) for i, c in enumerate(candidates) if self._fits(c, roots, budget)),
                key=lambda item: item[:2],
            )
            for _, _, choice in priced[:2]:  # adopting multi-output nodes is slow: only for the best two
                choice = adopt_multi_outputs(data, choice, totals, roots)
                if not self._fits(choice, roots, budget):
                    continue
                cost = dag_cost(choice, roots, totals)
                relaxed_best = min(relaxed_best, cost)
                if cost < best_cost * (1 - 1e-9):
                    best, best_cost = choice, cost
        finite = sum(1 for c in problem.classes for n in data.classes[c].nodes if totals[n.id] < math.inf)
        report = RelaxReport(
            start_objective=start_cost,
            objective=best_cost,
            relaxed_best=relaxed_best,
            kept=best is not start,
            starts=self.rows(len(problem.nodes)),
            steps=self.steps,
            seconds=time.perf_counter() - began,
            device=device,
            classes=len(problem.classes),
            nodes=len(problem.nodes),
            dropped_nodes=finite - len(problem.nodes),
        )
        self.reports.append(report)
        return Chosen(best, relaxed=[report])

    def rows(self, nodes: int) -> int:
        """Starts to run on an e-graph of ``nodes`` e-nodes: ``starts``, fewer (at least 4) when starts × nodes
        would pass ``elements``, so that a step's cost stays bounded on a large e-graph."""
        return max(min(self.starts, self.elements // max(nodes, 1)), min(4, self.starts))

    def _fits(self, choice: dict[str, ENode], roots: list[str], budget: float) -> bool:
        return self.memory is None or self._proxy(choice, roots) <= budget * (1 + 1e-9)

    def _proxy(self, choice: dict[str, ENode], roots: list[str]) -> float:
        assert self.memory is not None
        needed = chosen_closure(choice, roots) or set()
        return math.fsum(self.memory.get(choice[c].id, 0.0) for c in needed)

    def _budget(self, problem: Relaxed, start: dict[str, ENode]) -> float:
        if self.memory is None:
            return math.inf
        roots = [problem.classes[i] for i in problem.roots]
        own = self._proxy(start, roots)
        return max(own, self.budget) if self.budget is not None else own

    def _descend(self, problem: Relaxed, scale: float, budget: float, device: str) -> list[dict[str, ENode]]:
        """Adam on the logits of all starts at once, annealed; the distinct rounded choices seen on the way."""
        import torch

        from unity_eq.extract.relaxed_cost import RelaxedCost

        dtype = torch.float32  # half the memory traffic of float64; the rounding is priced exactly

        generator = torch.Generator().manual_seed(self.seed)
        objective = RelaxedCost(problem, device, scale, budget)
        starts = self.rows(len(problem.nodes))
        logits = torch.randn(starts, len(problem.nodes), generator=generator, dtype=dtype)
        has_start = problem.start >= 0
        favourite = torch.as_tensor(problem.start[has_start])
        logits[0].zero_()
        logits[:, favourite] += torch.linspace(self.bias, 0.0, starts, dtype=dtype)[:, None]
        logits = logits.to(device).requires_grad_(True)
        adam = _Adam(logits, self.learning_rate)
        hot, cold = self.temperature
        weight = torch.ones(starts, dtype=dtype, device=device)
        seen: dict[tuple[int, ...], dict[str, ENode]] = {}
        for step in range(self.steps):
            tau = hot * (cold / hot) ** (step / max(self.steps - 1, 1))
            logits.grad = None
            surrogate, _, excess = objective(logits, tau, weight)
            surrogate.backward()
            adam.step()
            with torch.no_grad():
                weight = torch.where(excess > 0, weight * 1.1, weight)  # grows until the expected plan fits
            if (step + 1) % self.round_every == 0 or step == self.steps - 1:
                if not bool(torch.isfinite(logits).all()):
                    raise ExtractionError("internal error: the differentiable extractor's logits are not finite")
                for row in objective.round(logits.detach()):
                    key = tuple(row.tolist())
                    if key not in seen:
                        seen[key] = {problem.classes[problem.node_class[i]]: problem.nodes[i] for i in row}
        return list(seen.values())


class _Adam:
    """Adam on one tensor (torch.optim imports torch's compiler on first use, ~7 s; this is the same update)."""

    def __init__(self, param: Any, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        import torch

        self.param, self.lr, self.betas, self.eps, self.t = param, lr, betas, eps, 0
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)

    def step(self) -> None:
        import torch

        b1, b2 = self.betas
        self.t += 1
        with torch.no_grad():
            grad = self.param.grad
            self.m.mul_(b1).add_(grad, alpha=1 - b1)
            self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (self.v / (1 - b2**self.t)).sqrt_().add_(self.eps)
            self.param.addcdiv_(self.m, denom, value=-self.lr / (1 - b1**self.t))


@contextlib.contextmanager
def _deterministic(wanted: str) -> Iterator[str]:
    """Run on the wanted device with deterministic algorithms, one CPU thread; restore torch's settings."""
    import torch

    device = "cuda" if wanted == "auto" and torch.cuda.is_available() else ("cpu" if wanted == "auto" else wanted)
    if device == "cuda" and not torch.cuda.is_available():
        raise ExtractionError("the differentiable extractor was asked for CUDA, and torch sees no GPU")
    threads = torch.get_num_threads()
    was = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    if device != "cpu":  # CPU kernels are deterministic already (and the switch imports torch's compiler, ~10 s)
        torch.use_deterministic_algorithms(True)
    try:
        yield device
    finally:
        if device != "cpu":
            torch.use_deterministic_algorithms(was)
        torch.set_num_threads(threads)
